"""Linformer and BigBird: each core against a naive float64 implementation of the same math
(at SP = 1 and split over real processes), the BERT-level SP = P vs SP = 1 exactness with
three AdamW steps, how Linformer's E/F gradients are summed, the BigBird pattern, and the
start-up errors."""
import functools

import pytest
import torch

from bert_fixtures import naive_masked_attention, small_config, small_model
from megatron.errors import ConfigError
from megatron.model import attention
from megatron.model.attention import bigbird
from megatron.model.attention.bigbird import BigBirdAttention, block_pattern, set_iteration
from megatron.parallel import state
from megatron.parallel.spawn import run_on_ranks
from test_sequence_parallel_bert import REL_TOL, assert_runs_match, train_steps

B, S, HEADS, D = 4, 48, 2, 8
# sample 0 unpadded, 1 ~60% padding, 2 padded from the middle (the last chunks at SP = 2, 4
# are all padding), 3 entirely padding
PAD_STARTS = (S, 19, S // 2, 0)
LINFORMER = dict(linformer_k=8)
BIGBIRD = dict(bigbird_block_size=4)  # 12 blocks: 6 per rank at SP = 2, 3 at SP = 4


def inputs():
    g = torch.Generator().manual_seed(5)
    q, k, v, grad_out = (torch.randn(B, S, HEADS, D, generator=g, dtype=torch.float64) for _ in range(4))
    key_padding_mask = torch.arange(S)[None] >= torch.tensor(PAD_STARTS)[:, None]
    return q, k, v, grad_out, key_padding_mask


def core_config(variant, **overrides):
    return small_config(variant, seq_length=S, hidden_size=HEADS * D, num_attention_heads=HEADS, **overrides)


def core_chunk(variant: str, size: int, overrides: dict, iteration: int = 0, pass_keys: int | None = None):
    """This rank's output, q/k/v gradients (float32) and the core's parameter gradients as they
    are before any seq-group reduction. `pass_keys` sets how many keys BigBird gathers per pass."""
    if size > 1 and not state.is_initialized():
        state.initialize(sequence=size)
    torch.manual_seed(11)
    core = attention.build(core_config(variant, **overrides))
    if isinstance(core, BigBirdAttention):
        core.iteration, core.layer = iteration, 3
    rank, step = state.get_sequence_parallel_rank(), S // size
    q, k, v, grad_out, key_padding_mask = (t[:, rank * step:(rank + 1) * step] for t in inputs())
    q, k, v = (t.float().requires_grad_(True) for t in (q, k, v))
    default_pass_keys = bigbird._PASS_KEYS
    bigbird._PASS_KEYS = pass_keys or default_pass_keys
    try:
        out = core(q, k, v, (~key_padding_mask).long())  # one segment per sample
        out.backward(grad_out.float())
    finally:
        bigbird._PASS_KEYS = default_pass_keys
    params = {name: (p.detach().clone(), p.grad.clone()) for name, p in core.named_parameters()}
    return (out.detach(), q.grad, k.grad, v.grad), params


def linformer_reference(key_projection, value_projection):
    """softmax(Q (E K~)^T / sqrt(d)) (F V~) in float64, K~, V~ zero at padding; E, F [heads|1, k, s]."""
    q, k, v, grad_out, key_padding_mask = inputs()
    e, f = (p.double().requires_grad_(True) for p in (key_projection, value_projection))
    for t in (q, k, v):
        t.requires_grad_(True)
    keep = (~key_padding_mask)[:, :, None, None].double()
    projected_k = torch.einsum("hjs,bshd->bjhd", e.expand(HEADS, -1, -1), k * keep)
    projected_v = torch.einsum("hjs,bshd->bjhd", f.expand(HEADS, -1, -1), v * keep)
    allowed = torch.ones(B, S, e.shape[1], dtype=torch.bool)
    out = naive_masked_attention(q, projected_k, projected_v, allowed)
    out.backward(grad_out)
    return (out.detach(), q.grad, k.grad, v.grad), e.grad, f.grad


def bigbird_reference(overrides, iteration):
    """Dense float64 attention under the explicit token mask of the same block pattern."""
    config = core_config("bigbird", **overrides)
    block = config.bigbird_block_size
    slots, valid = block_pattern(S // block, config.bigbird_num_window_blocks, config.bigbird_num_random_blocks,
                                 config.bigbird_seed, iteration, 3)
    blocks_allowed = torch.zeros(S // block, S // block, dtype=torch.bool)
    for row in range(S // block):
        blocks_allowed[row, slots[row][valid[row]]] = True
    blocks_allowed[[0, -1], :] = True  # global query blocks see everything
    blocks_allowed[:, [0, -1]] = True  # and are seen by everything
    q, k, v, grad_out, key_padding_mask = inputs()
    for t in (q, k, v):
        t.requires_grad_(True)
    tokens_allowed = blocks_allowed.repeat_interleave(block, 0).repeat_interleave(block, 1)
    out = naive_masked_attention(q, k, v, tokens_allowed[None] & ~key_padding_mask[:, None, :]
                                 & ~key_padding_mask[:, :, None])  # padding sees nothing
    out.backward(grad_out)
    return out.detach(), q.grad, k.grad, v.grad


def assert_close(name, got, want):
    assert torch.isfinite(got).all(), f"{name} has NaN/inf"
    diff = (got.double() - want).abs().max() / want.abs().max()
    assert diff <= REL_TOL, f"{name}: max relative diff {diff:.2e}"


def assert_chunks_match(chunks, expected):
    for name, got, want in zip(("out", "dq", "dk", "dv"), (torch.cat(c, dim=1) for c in zip(*chunks)), expected):
        assert_close(name, got, want)
    assert (torch.cat([c[0] for c in chunks], dim=1)[3] == 0).all(), "an all-padding sample must give zeros"


# The core configurations checked at each SP size; SP > 1 runs share one spawn per (variant,
# size) with the BERT exactness run (process start-up dominates these tests' time).
# BigBird's third entry: keys gathered per pass (None: all rows in one pass; 7 slots x 4 tokens
# = 28 keys per row, so 28 is one row per pass).
CORE_CASES = {
    "linformer": [(1, LINFORMER, None), (1, dict(LINFORMER, linformer_share_heads=True, linformer_share_kv=True), None),
                  (2, LINFORMER, None), (4, dict(LINFORMER, linformer_share_heads=True), None)],
    "bigbird": [(1, BIGBIRD, None), (1, BIGBIRD, 28), (2, BIGBIRD, None),
                (4, dict(BIGBIRD, bigbird_num_window_blocks=5, bigbird_num_random_blocks=1), 2 * 36)],
}
TRAIN = {"linformer": LINFORMER, "bigbird": BIGBIRD}
ITERATION = 2  # the BigBird core checks use this iteration (and layer 3)
PATTERN_ARGS = (24, 3, 2, 1234, 7, 5)  # num_blocks, window, random, seed, iteration, layer


def rank_checks(variant: str, size: int, core_overrides: dict, pass_keys: int | None) -> dict:
    """Everything one rank of an SP = size run reports: the BERT training run, the core alone,
    and (any process will do) a BigBird pattern."""
    train = train_steps(variant, size, set_iteration if variant == "bigbird" else None, **TRAIN[variant])
    return {"train": train, "core": core_chunk(variant, size, core_overrides, ITERATION, pass_keys),
            "pattern": block_pattern(*PATTERN_ARGS)}


@functools.cache
def spawned(variant: str, size: int) -> list:
    overrides, pass_keys = next((o, p) for s, o, p in CORE_CASES[variant] if s == size)
    return run_on_ranks(rank_checks, size, variant, size, overrides, pass_keys)


def core_results(variant, size, overrides, pass_keys):
    if size == 1:
        return [core_chunk(variant, 1, overrides, ITERATION, pass_keys)]
    return [result["core"] for result in spawned(variant, size)]


@pytest.mark.parametrize("size,overrides,pass_keys", CORE_CASES["linformer"])
def test_linformer_core_equals_naive_projection(size, overrides, pass_keys):
    """Also states how E/F gradients are summed: rank r's gradient is exact in its own columns
    and zero elsewhere, so the seq-group sum (parallel/grads.py) is the full gradient."""
    results = core_results("linformer", size, overrides, pass_keys)
    params = results[0][1]
    key_projection = params["key_projection"][0]
    value_projection = params["value_projection"][0] if "value_projection" in params else key_projection
    expected, grad_e, grad_f = linformer_reference(key_projection, value_projection)
    assert_chunks_match([chunks for chunks, _ in results], expected)
    summed = {name: sum(p[name][1] for _, p in results) for name in params}
    if "value_projection" in params:
        assert_close("dE", summed["key_projection"], grad_e)
        assert_close("dF", summed["value_projection"], grad_f)
    else:  # E = F: both uses add into the one parameter
        assert_close("dE (= F)", summed["key_projection"], grad_e + grad_f)
    step = S // size
    for rank, (_, rank_params) in enumerate(results):
        assert torch.equal(rank_params["key_projection"][0], key_projection), "E must be identical on every rank"
        grad = rank_params["key_projection"][1]
        outside = torch.ones(S, dtype=torch.bool)
        outside[rank * step:(rank + 1) * step] = False
        assert (grad[..., outside] == 0).all(), f"rank {rank} wrote E's gradient outside its columns"
        assert grad[..., ~outside].abs().max() > 0


@pytest.mark.parametrize("size,overrides,pass_keys", CORE_CASES["bigbird"])
def test_bigbird_core_equals_dense_under_block_mask(size, overrides, pass_keys):
    results = core_results("bigbird", size, overrides, pass_keys)
    assert_chunks_match([chunks for chunks, _ in results], bigbird_reference(overrides, ITERATION))


@pytest.fixture(scope="module")
def references():
    return {variant: train_steps(variant, 1, set_iteration if variant == "bigbird" else None, **TRAIN[variant])
            for variant in TRAIN}


@pytest.mark.parametrize("variant,size", [("linformer", 2), ("linformer", 4), ("bigbird", 2), ("bigbird", 4)])
def test_sequence_parallel_matches_single_rank(references, variant, size):
    """BigBird sets a new iteration each step (set_iteration), so its pattern changes between steps."""
    assert_runs_match([r["train"] for r in spawned(variant, size)], references[variant], f"{variant} sp={size}")


def iteration_zero(model, step):
    set_iteration(model, 0)


def test_bigbird_pattern_changes_with_iteration_within_training(references):
    """The BERT reference above really used three different patterns (set_iteration took effect):
    rerunning it with the iteration held at 0 must change the losses after the first step."""
    frozen = train_steps("bigbird", 1, iteration_zero, **BIGBIRD)
    assert frozen["losses"][0] == references["bigbird"]["losses"][0]
    assert frozen["losses"][1:] != references["bigbird"]["losses"][1:]


def test_bigbird_layers_draw_their_own_blocks_and_set_iteration_sets_only_the_iteration():
    """Each BigBird core keeps the layer number attention.build gives it: a pipeline stage that starts
    past layer 0 builds its layers with their model index (pipe.TransformerLayerPipe), so its random
    blocks are those of the single-process model's same layer; set_iteration changes the iteration only."""
    from megatron.model.pipe import TransformerLayerPipe

    config = core_config("bigbird", num_layers=3, **BIGBIRD)
    model = small_model(config)
    set_iteration(model, 7)
    assert [(core.layer, core.iteration) for core in model.modules() if isinstance(core, BigBirdAttention)] == [
        (0, 7), (1, 7), (2, 7)]
    assert TransformerLayerPipe(config, 2).attention.core.layer == 2


def test_bigbird_pattern_is_the_same_in_every_process():
    here = block_pattern(*PATTERN_ARGS)
    for rank, result in enumerate(spawned("bigbird", 2)):
        slots, valid = result["pattern"]
        assert torch.equal(slots, here[0]) and torch.equal(valid, here[1]), f"rank {rank} built another pattern"
    for other in ((24, 3, 2, 1234, 8, 5), (24, 3, 2, 1234, 7, 6), (24, 3, 2, 99, 7, 5)):
        assert not torch.equal(block_pattern(*other)[0], here[0]), f"{other} gave the same pattern"


@pytest.mark.parametrize("num_blocks,window,num_random", [(7, 3, 2), (12, 5, 3), (40, 3, 2), (9, 1, 6)])
def test_bigbird_pattern_rows(num_blocks, window, num_random):
    """Every non-global row: its whole window, both global blocks, and num_random distinct random
    blocks outside them; no key block twice. Global rows have no slots (they see everything)."""
    slots, valid = block_pattern(num_blocks, window, num_random, 0, 3, 1)
    assert not valid[[0, -1]].any()
    seen_random = set()
    for row in range(1, num_blocks - 1):
        keys = slots[row][valid[row]].tolist()
        assert len(keys) == len(set(keys)), f"row {row} repeats a block: {keys}"
        window_blocks = {j for j in range(row - window // 2, row + window // 2 + 1) if 0 <= j < num_blocks}
        random_blocks = set(slots[row, -num_random:].tolist())
        assert window_blocks | {0, num_blocks - 1} | random_blocks == set(keys)
        assert len(random_blocks) == num_random and not random_blocks & (window_blocks | {0, num_blocks - 1})
        seen_random |= random_blocks
    assert len(seen_random) > num_random, "random blocks should vary from row to row"


@pytest.mark.parametrize("variant,size,overrides,message", [
    ("linformer", 1, dict(linformer_k=64), "linformer_k 64 exceeds seq_length 48"),
    ("bigbird", 2, dict(bigbird_block_size=5), "seq_length 48 is not divisible by bigbird block size 5 x sequence-parallel size 2"),
    ("bigbird", 4, dict(bigbird_block_size=8), "seq_length 48 is not divisible by bigbird block size 8 x sequence-parallel size 4"),
    ("bigbird", 1, dict(bigbird_block_size=8), "bigbird needs at least 7 blocks (window 3 + 2 global + 2 random) but seq_length 48 / block size 8 gives 6"),
    ("bigbird", 6, dict(bigbird_block_size=2, bigbird_num_window_blocks=11), "bigbird window 11 reaches 5 blocks to each side but each of the 6 sequence-parallel ranks holds 4"),
    ("bigbird", 1, dict(bigbird_block_size=4, attention_dropout=0.1), "attention_dropout 0.1 is not supported by bigbird"),
])
def test_bad_settings_stop_at_start_up(variant, size, overrides, message):
    with pytest.raises(ConfigError) as error:
        attention.check(small_config(variant, **overrides), size)
    text = str(error.value)
    assert message in text and "\n" not in text and "; " in text


@pytest.mark.parametrize("overrides,message", [
    (dict(bigbird_num_window_blocks=4), "bigbird_num_window_blocks = 4 is even"),
    (dict(bigbird_num_random_blocks=-1), "bigbird_num_random_blocks = -1 is negative"),
    (dict(linformer_k=0), "linformer_k = 0 must be positive"),
])
def test_bad_config_fields(overrides, message):
    with pytest.raises(ConfigError, match=message):
        small_config("ring", **overrides)


def test_valid_settings_pass():
    attention.check(small_config("linformer", linformer_k=48), 4)
    attention.check(small_config("bigbird", bigbird_block_size=4), 4)


def test_linformer_refuses_another_sequence_length():
    """Projections built for s = 48: a 32-token sequence, or a checkpoint built for 32, is refused."""
    model = small_model(small_config("linformer", **LINFORMER))
    q = torch.zeros(1, 32, 4, 8)
    with pytest.raises(ConfigError, match="built for seq_length 48 but the sequence has 32 tokens"):
        model.layers[0].attention.core(q, q, q, torch.ones(1, 32, dtype=torch.long))
    other = small_model(small_config("linformer", seq_length=32, **LINFORMER)).state_dict()
    with pytest.raises(ConfigError, match="built for seq_length 32 but the sequence has 48 tokens"):
        model.load_state_dict(other)
    model.load_state_dict(small_model(small_config("linformer", **LINFORMER), seed=5).state_dict())

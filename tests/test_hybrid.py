"""Hybrid sequence parallelism (Ulysses all-to-all inside groups of adjacent seq ranks, the ring
across them) and sequence lengths that SP does not divide (the tail padded with padding positions).

One spawn per world size (start-up dominates on 2 cores), each rank reporting every check:
  - the groups: Ulysses groups of adjacent seq ranks, rings across them, under pipe x data x seq;
  - the hybrid core at SP = 4 (2 x 2) and 6 (2 x 3, 4 heads: P does not divide the heads) equals a
    float64 segment-masked softmax(QK^T)V on packed samples (segments across chunks, padding);
  - a whole BERT on a batch of 50 tokens (padded and packed samples), which neither 4 nor 6
    divides, equals one process in hidden states, loss and gradients, for hybrid and ring (and
    ulysses at SP = 4);
  - the bytes each rank sends per layer equal benchmarks/comm_model.py's model;
  - the hybrid core (and Ulysses at SP = 4) on random packed layouts (test_attention_fuzz's, which hold
    the ring, local and BigBird cores on virtual ranks) equals the definition, through its CPU branch and
    its CUDA branch on the emulated kernels (attention/kernels.py) in fp32 and bf16.
Through the engine: ZeRO 2 x hybrid SP=4 and PP=2 x hybrid (in the world-4 spawn), PP=2 x hybrid
SP=4 (world 8, slow); through the real `deepspeed` launcher once (4 ranks, a seq length padded to 4),
in test_signals.py: the run that SIGTERM to the deepspeed command stops.
"""
import contextlib
import functools
import random
import sys
from pathlib import Path

import pytest
import torch

from bert_fixtures import (concat_batches, naive_masked_attention, packed_batch, padded_batch, segment_allowed,
                           small_config, small_model)
from megatron.config import resolve
from megatron.errors import ConfigError
from megatron.model import attention
from megatron.model.loss import bert_batch_loss
from megatron.parallel import state
from megatron.parallel.reduce import sum_over_sequence
from megatron.parallel.spawn import run_on_ranks
from megatron.model.attention import kernels
from test_attention_fuzz import BRANCHES, random_layout
from test_packed_attention import D, HEADS, assert_close, core_chunk, core_inputs, core_reference
from test_sequence_parallel_bert import REL_TOL, max_relative_diff

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from comm_model import measure, modelled_bytes  # noqa: E402

UNEVEN = 50  # tokens per sample: padded to 52 at SP = 4, to 54 at SP = 6
ULYSSES = 2
VARIANTS = {4: ("hybrid", "ring", "ulysses"), 6: ("hybrid", "ring")}  # ulysses needs heads % P == 0
COMM_SHAPE = dict(b=2, s=50, heads=4, d=8)  # measured bytes: an uneven length too
FUZZ_TRIALS = 12
FUZZED = {4: ("hybrid", "ulysses"), 6: ("hybrid",)}


def uneven_batch():
    """Two padded samples and two packed ones, 50 tokens each."""
    return concat_batches(padded_batch(UNEVEN, pad_starts=(UNEVEN, 29)),
                          packed_batch(seq_length=UNEVEN)[0].samples(0, 2))


def options(variant: str) -> dict:
    return {"ulysses_size": ULYSSES} if variant == "hybrid" else {}


def model_chunk(variant: str, size: int):
    """Final hidden states of this rank's (padded) chunk, its loss share and unreduced gradients."""
    model = small_model(small_config(variant, seq_length=UNEVEN, **options(variant)))
    hidden = []
    model.final_layernorm.register_forward_hook(lambda module, inputs, output: hidden.append(output.detach()))
    chunk = uneven_batch().sequence_chunk(state.get_sequence_parallel_rank(), size)
    loss = bert_batch_loss(*model(*chunk.model_inputs()), chunk, sum_over_sequence)
    loss.total.backward()
    return hidden[0], loss.total.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def fuzz_inputs(trial: int, size: int) -> tuple:
    """Trial `trial`'s float64 q, k, v, grad_out and two random packed layouts of a length SP `size` divides."""
    rng = random.Random(f"hybrid-fuzz-{size}-{trial}")
    length = size * rng.choice([2, 3, 5, 8, 13])
    segment_ids = torch.tensor([random_layout(length, size, rng) for _ in range(2)])
    generator = torch.Generator().manual_seed(trial)
    return (*(torch.randn(2, length, HEADS, D, generator=generator, dtype=torch.float64) for _ in range(4)),
            segment_ids)


def fuzz_chunks(variant: str, size: int, branch: str) -> tuple:
    """This rank's (out, dq, dk, dv) chunk of each fuzz trial, through `branch` (test_attention_fuzz.BRANCHES),
    and whether its kernel calls took the emulation's namespace (a set of bools)."""
    results, rank, dtype = [], state.get_sequence_parallel_rank(), BRANCHES[branch][0]
    emulated, ops = set(), kernels.ops
    kernels.ops = lambda: emulated.add(kernels._emulating > 0) or ops()
    try:
        for trial in range(FUZZ_TRIALS):
            results.append(fuzz_trial(variant, size, trial, rank, dtype, branch != "cpu"))
    finally:
        kernels.ops = ops
    return results, emulated


def fuzz_trial(variant: str, size: int, trial: int, rank: int, dtype, emulate: bool) -> tuple:
    q, k, v, grad_out, segment_ids = fuzz_inputs(trial, size)
    step = q.shape[1] // size
    part = slice(rank * step, (rank + 1) * step)
    core = attention.build(small_config(variant, seq_length=q.shape[1], max_position_embeddings=q.shape[1],
                                        hidden_size=HEADS * D, num_attention_heads=HEADS, **options(variant)))
    leaves = [t[:, part].to(dtype).requires_grad_(True) for t in (q, k, v)]
    with kernels.emulated_cuda() if emulate else contextlib.nullcontext():
        out = core(*leaves, segment_ids[:, part])
        out.backward(grad_out[:, part].to(dtype))
    return out.detach(), *(t.grad for t in leaves)


def rank_checks(size: int) -> dict:
    state.initialize(sequence=size, ulysses=ULYSSES)
    shape = COMM_SHAPE
    return {"groups": (state.get_ulysses_parallel_ranks(), state.get_ring_parallel_ranks()),
            "core": core_chunk("hybrid", size),
            "fuzz": {(variant, branch): fuzz_chunks(variant, size, branch) for variant in FUZZED[size]
                     for branch in BRANCHES},
            "model": {variant: model_chunk(variant, size) for variant in VARIANTS[size]},
            "bytes": {variant: measure(variant, shape["b"], shape["s"], shape["heads"], shape["d"],
                                       ULYSSES if variant == "hybrid" else 1) for variant in VARIANTS[size]}}


# world 4 also runs the engine (test_hybrid_through_the_engine_zero2_and_pipeline): one spawn
ENGINE_RUNS = [(1, 2, 2, 2, 4, "hybrid", 0, None, False, 1e6), (2, 2, 2, 1, 2, "hybrid")]


def world_4_checks() -> dict:
    return {**rank_checks(4), "engine": hybrid_engine_runs(ENGINE_RUNS)}


@functools.cache
def spawned(size: int) -> list:
    if size == 4:
        return run_on_ranks(world_4_checks, 4, timeout=600)
    return run_on_ranks(rank_checks, size, size, timeout=300)


@functools.cache
def reference():
    """One process, dense attention, the unpadded 50-token batch."""
    return model_chunk("dense", 1)


def test_group_lists_split_the_seq_group_under_pipe_and_data():
    dims = state.ParallelDims(pipeline=2, data=2, sequence=6, ulysses=2)
    groups = state._group_lists(dims)
    assert groups["seq_ulysses"][:3] == [[0, 1], [2, 3], [4, 5]], "Ulysses groups are adjacent ranks"
    assert groups["seq_ring"][:2] == [[0, 2, 4], [1, 3, 5]], "one ring per Ulysses position"
    assert groups["seq_ring"][-1] == [19, 21, 23] and len(groups["seq_ring"]) == 2 * 2 * 2
    for name in ("seq_ulysses", "seq_ring"):  # every rank in exactly one group, inside its seq group
        assert sorted(r for members in groups[name] for r in members) == list(range(24))
        assert all(members[-1] - members[0] < 6 and members[0] // 6 == members[-1] // 6 for members in groups[name])


@pytest.mark.parametrize("size", [4, 6])
def test_hybrid_groups_on_ranks(size):
    for rank, result in enumerate(spawned(size)):
        ulysses, ring = result["groups"]
        assert ulysses == [rank - rank % ULYSSES + u for u in range(ULYSSES)]
        assert ring == list(range(rank % ULYSSES, size, ULYSSES))


@pytest.mark.parametrize("size", [4, 6])
def test_hybrid_core_equals_segment_masked_attention(size):
    chunks = [result["core"] for result in spawned(size)]
    for name, got, want in zip(("out", "dq", "dk", "dv"), (torch.cat(c, dim=1) for c in zip(*chunks)),
                               core_reference("hybrid")):
        assert_close(f"hybrid sp={size} ({ULYSSES}x{size // ULYSSES}) {name}", got, want)
    padding = core_inputs()[-1] == 0
    assert (torch.cat([c[0] for c in chunks], dim=1)[padding] == 0).all(), "padding must attend to nothing"


@pytest.mark.parametrize("branch", BRANCHES)
@pytest.mark.parametrize("size,variant", [(size, variant) for size, variants in FUZZED.items() for variant in variants])
def test_cores_on_random_packed_layouts_equal_the_definition(size, variant, branch):
    """Drawn layouts (1-token segments, ends on chunk boundaries, padding tails, all-padding samples) at lengths
    of 2 to 13 tokens per rank, through the real all-to-alls and ring of SP = `size` over gloo. What it sees:
    the CPU kernels' results, and the CUDA branch's calls as the emulated kernels' contracts state them; not the
    real CUDA kernels' rounding (benchmarks/gpu_check.sh runs those)."""
    tolerance = BRANCHES[branch][3]
    per_rank = [result["fuzz"][variant, branch][0] for result in spawned(size)]
    assert all(result["fuzz"][variant, branch][1] == {branch != "cpu"} for result in spawned(size)), \
        "the CUDA branch took a real kernel, or the CPU branch the emulation"
    for trial in range(FUZZ_TRIALS):
        q, k, v, grad_out, segment_ids = fuzz_inputs(trial, size)
        dtype = BRANCHES[branch][0]  # the inputs as rounded to it
        leaves = [t.to(dtype).double().requires_grad_(True) for t in (q, k, v)]
        want = naive_masked_attention(*leaves, segment_allowed(segment_ids))
        want.backward(grad_out.to(dtype).double())
        got = [torch.cat(parts, 1) for parts in zip(*(chunks[trial] for chunks in per_rank))]
        for name, a, b in zip(("out", "dq", "dk", "dv"), got, (want, *(t.grad for t in leaves))):
            error = float((a.double() - b).detach().abs().max()) / max(1.0, float(b.detach().abs().max()))
            assert error <= tolerance, (variant, size, branch, trial, name, segment_ids.tolist(), error)


@pytest.mark.parametrize("size,variant", [(4, "hybrid"), (4, "ring"), (4, "ulysses"), (6, "hybrid"), (6, "ring")])
def test_uneven_sequence_padded_equals_one_process(size, variant):
    """seq_length 50 at SP = 4 / 6: the tail padded to 52 / 54; hidden states at the real tokens,
    the loss and every gradient (summed over the seq ranks) are those of one process."""
    ranks = [result["model"][variant] for result in spawned(size)]
    assert all(r[0].shape[1] == -(-UNEVEN // size) for r in ranks), "each rank holds ceil(s/P) positions"
    hidden = torch.cat([r[0] for r in ranks], dim=1)
    assert hidden.shape[1] > UNEVEN
    expected_hidden, expected_loss, expected_grads = reference()
    real = uneven_batch().segment_ids != 0
    assert_close(f"{variant} sp={size} hidden", hidden[:, :UNEVEN][real], expected_hidden[real])
    assert sum(r[1] for r in ranks).item() == pytest.approx(expected_loss.item(), rel=REL_TOL)
    diff = max_relative_diff({name: sum(r[2][name] for r in ranks) for name in expected_grads}, expected_grads)
    assert diff <= REL_TOL, f"{variant} sp={size}: gradients differ by {diff:.2e}"


@pytest.mark.parametrize("size", [4, 6])
def test_bytes_sent_match_the_communication_model(size):
    """Forward, backward and segment-id bytes per rank per layer, counted at the collectives."""
    shape = COMM_SHAPE
    h = shape["heads"] * shape["d"]
    for variant in VARIANTS[size]:
        model = modelled_bytes(variant, shape["b"], shape["s"], size, h, ULYSSES, e=4)
        for rank, result in enumerate(spawned(size)):
            assert result["bytes"][variant] == model, f"{variant} sp={size} rank {rank}"


def test_sequence_chunk_pads_the_tail():
    batch = uneven_batch()
    chunks = [batch.sequence_chunk(rank, 4) for rank in range(4)]
    assert [c.tokens.shape[1] for c in chunks] == [13] * 4
    tail = chunks[-1]
    assert (tail.segment_ids[:, -2:] == 0).all() and not tail.loss_mask[:, -2:].any() and not tail.cls_mask[:, -2:].any()
    for field in ("tokens", "segment_ids", "position_ids", "labels", "sop_labels"):
        assert torch.equal(torch.cat([getattr(c, field) for c in chunks], 1)[:, :UNEVEN], getattr(batch, field)), field
    assert batch.sequence_chunk(1, 2).tokens.shape[1] == 25  # divisible: no padding


@pytest.mark.parametrize("section,extra,message", [
    ({"size": 4, "attention": "hybrid", "ulysses_size": 3}, {}, "ulysses_size 3 does not divide the sequence-parallel size 4"),
    ({"size": 6, "attention": "hybrid", "ulysses_size": 3}, {}, "hybrid needs num_attention_heads (4) divisible by ulysses_size (3)"),
    ({"size": 4, "attention": "ring", "ulysses_size": 2}, {}, "ulysses_size 2 is set but attention is 'ring'"),
    ({"size": 4, "attention": "hybrid", "ulysses_size": 0}, {}, "ulysses_size 0 must be >= 1"),
    # a fix names the JSON key where the JSON set the variant, the flag where a flag did (docs/errors.md)
    ({"size": 6, "attention": "ulysses"}, {}, "; use sequence_parallel.attention ring, or sequence_parallel.attention "
                                              "hybrid with sequence_parallel.ulysses_size 2 (Ulysses inside"),
    ({"size": 6}, {"attention": "ulysses"}, "; use --attention ring, or --attention hybrid --ulysses-size 2 (Ulysses"),
    ({"size": 4, "attention": "linformer"}, {"seq_length": 50, "linformer_k": 8}, "seq_length 50 is not divisible"),
])
def test_bad_hybrid_settings_are_one_line_errors(section, extra, message):
    flags = {**dict(num_attention_heads=4, hidden_size=32, seq_length=48, max_position_embeddings=64), **extra}
    with pytest.raises(ConfigError) as error:
        resolve(flags, {"sequence_parallel": section}, section["size"])
    assert message in str(error.value) and "\n" not in str(error.value)


def test_hybrid_config_from_json_and_flags():
    flags = dict(num_attention_heads=4, hidden_size=32, seq_length=50, max_position_embeddings=64)
    config = resolve(flags, {"sequence_parallel": {"size": 6, "attention": "hybrid", "ulysses_size": 2}}, 12)
    assert (config.model.attention, config.model.ulysses_size, config.data_parallel_size) == ("hybrid", 2, 2)
    assert config.model.attention_dropout == 0.0  # the ring inside refuses attention dropout
    config = resolve({**flags, "ulysses_size": 1}, {"sequence_parallel": {"size": 6, "attention": "hybrid",
                                                                          "ulysses_size": 2}}, 6)
    assert config.model.ulysses_size == 1  # the flag wins
    config = resolve(flags, {"sequence_parallel": {"size": 6, "attention": "hybrid"}}, 6)
    assert config.model.ulysses_size == 2  # default: the largest divisor of 6 and the 4 heads


def ulysses_groups_of_one_process() -> tuple:
    """(the Ulysses group, the summary) of a one-process run of a hybrid JSON (ulysses_size 2) at
    --sequence-parallel-size 1, as the world-size error suggests for one process."""
    from megatron.engine import initialize_parallel

    flags = dict(num_attention_heads=4, hidden_size=32, seq_length=48, max_position_embeddings=64,
                 sequence_parallel_size=1)
    config = resolve(flags, {"sequence_parallel": {"size": 4, "attention": "hybrid", "ulysses_size": ULYSSES}}, 1)
    initialize_parallel(config)
    return state.get_ulysses_parallel_ranks(), config.summary()


def test_a_hybrid_json_runs_in_one_process_at_sequence_parallel_size_1():
    """At SP 1 hybrid attention is plain attention (hybrid.py), but the process groups were made with the JSON's
    ulysses_size 2 and refused it (`ulysses size 2 does not divide the sequence-parallel size 1`), after the
    data's index maps were built; the summary said `Ulysses 2 x ring 0`. Now Ulysses 1, and no such summary."""
    (ranks, summary), = run_on_ranks(ulysses_groups_of_one_process, 1, timeout=120)
    assert ranks == [0] and "hybrid attention" in summary and "Ulysses" not in summary, summary


def hybrid_engine_runs(runs: list) -> list:
    """test_deepspeed_engine's runs (argument tuples) with attention 'hybrid' at ulysses_size 2."""
    import test_deepspeed_engine

    test_deepspeed_engine.ATTENTION_OPTIONS["hybrid"] = {"ulysses_size": ULYSSES}
    return test_deepspeed_engine.deepspeed_runs(runs)


def test_hybrid_through_the_engine_zero2_and_pipeline():
    """World 4: ZeRO 2 x hybrid SP=4 (2 x 2), gradients before clipping and 3 AdamW steps; and a
    2-stage pipeline x hybrid SP=2 (ZeRO 1). Padded and packed micro-batches; the reference is
    one process (ring at SP=1 is exact attention)."""
    from test_deepspeed_engine import NO_CLIP, check_against_reference, reference_run

    assert ENGINE_RUNS[0][-1] == NO_CLIP  # the first run's gradients are captured before clipping
    per_rank = [result["engine"] for result in spawned(4)]
    zero2 = [results[0] for results in per_rank]
    expected = reference_run(2, "ring", clip=NO_CLIP)
    for rank, result in enumerate(zero2):
        diff = max_relative_diff(result["grads"], expected["grads"])
        assert diff <= REL_TOL, f"zero2 hybrid sp4 rank {rank}: gradients before clipping differ by {diff:.2e}"
        assert result["grad_norms"] == pytest.approx(expected["grad_norms"], rel=REL_TOL)
    check_against_reference(zero2, micro=2, label="zero2 hybrid sp4 (2x2)", expected=expected)
    check_against_reference([results[1] for results in per_rank], micro=2, label="pp2 hybrid sp2 zero1")


@pytest.mark.slow
def test_hybrid_pipeline_world_8():
    """pp=2 x hybrid sp=4 (2 x 2), ZeRO 1 (world 8): every group split at once."""
    results = run_on_ranks(hybrid_engine_runs, 8, [(2, 2, 2, 1, 4, "hybrid")], timeout=600)
    from test_deepspeed_engine import check_against_reference

    check_against_reference([r[0] for r in results], micro=2, label="pp2 hybrid sp4 (2x2) zero1")

"""The local sliding-window core (megatron/model/attention/local.py) against a float64 reference
written from the definition (query i sees key j iff |i - j| <= window // 2, same segment, no
padding), at SP 1, 2, 4 and under hybrid's groups (real ranks over gloo), with segments crossing
chunk boundaries, chunks of padding and chunks shorter than half the window, in tiles of fewer rows
than a chunk; on the CPU kernels and on the emulated CUDA kernels (kernels.py says what they see
and cannot: the kernels' contracts and arithmetic, not a GPU's timing or its own numerics).
"""
import contextlib
from types import SimpleNamespace
from unittest import mock

import pytest
import torch

from bert_fixtures import PACKED_LAYOUTS, naive_masked_attention, packed_batch
from megatron.model.attention import kernels, local
from megatron.parallel import state
from megatron.parallel.spawn import run_on_ranks

S, HEADS, D = 48, 2, 8
TILE_ROWS = 8  # several tiles per chunk at every SP degree (local._TILE_ROWS, 64, would make one), and tiles
# both wider (window 8) and narrower (window 32) than half the window
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def window_allowed(segment_ids, window: int):
    """[b, s, s]: the definition."""
    positions = torch.arange(segment_ids.shape[1])
    near = (positions[:, None] - positions[None, :]).abs() <= window // 2
    same = (segment_ids[:, :, None] == segment_ids[:, None, :]) & (segment_ids[:, None, :] != 0)
    return same & near


def inputs():
    g = torch.Generator().manual_seed(11)
    q, k, v, grad_out = (torch.randn(len(PACKED_LAYOUTS), S, HEADS, D, generator=g, dtype=torch.float64)
                         for _ in range(4))
    return q, k, v, grad_out, packed_batch()[0].segment_ids


def reference(window: int):
    q, k, v, grad_out, segment_ids = inputs()
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = naive_masked_attention(*leaves, window_allowed(segment_ids, window))
    out.backward(grad_out)
    return out.detach(), *(t.grad for t in leaves)


def chunk_run(window: int, size: int, dtype, emulated: bool):
    """This rank's out, dq, dk, dv (float64) and the largest tile mask's (rows, keys)."""
    core = local.LocalAttention(SimpleNamespace(local_attention_window=window, head_dim=D))
    rank, step = state.get_sequence_parallel_rank(), S // size
    part = slice(rank * step, (rank + 1) * step)
    q, k, v, grad_out, segment_ids = (t[:, part] for t in inputs())
    leaves = [t.to(dtype).requires_grad_(True) for t in (q, k, v)]
    with kernels.emulated_cuda() if emulated else contextlib.nullcontext(), \
            mock.patch.object(local, "_TILE_ROWS", TILE_ROWS):
        out = core(*leaves, segment_ids)
        out.backward(grad_out.to(dtype))
        tiles = core.plan(segment_ids).tiles
    largest = max(tuple(t.mask.allowed.shape[-2:]) for t in tiles) if tiles else (0, 0)
    return [x.double() for x in (out.detach(), *(t.grad for t in leaves))], largest


CASES = [(window, dtype, emulated) for window in (8, 32) for dtype in (torch.float32, torch.bfloat16)
         for emulated in (False, True) if emulated or dtype == torch.float32]


def rank_results(size: int, ulysses: int = 1) -> dict:
    if size > 1:
        state.initialize(sequence=size, ulysses=ulysses)
    return {case: chunk_run(case[0], size, case[1], case[2]) for case in CASES}


def check(results: list, size: int):
    for case in CASES:
        window, dtype, emulated = case
        want = reference(window)
        got = [torch.cat(parts, 1) for parts in zip(*(r[case][0] for r in results))]
        for name, a, w in zip(("out", "dq", "dk", "dv"), got, want):
            error = ((a - w).abs().max() / w.abs().max()).item()
            assert error <= TOLERANCE[dtype], f"window {window} sp={size} {dtype} emulated={emulated} {name}: {error:.1e}"
        for rows, keys in (r[case][1] for r in results):  # banded: a tile's rows and the keys they reach
            assert rows <= TILE_ROWS and keys <= rows + 2 * (window // 2) < S, (rows, keys)


def test_local_core_at_one_rank():
    check([rank_results(1)], 1)


@pytest.mark.parametrize("size,ulysses", [(2, 1), (4, 1), (4, 2)], ids=["sp2", "sp4", "sp4-hybrid-groups"])
def test_local_core_across_ranks(size, ulysses):
    """At SP = 4 a chunk holds 12 tokens: window 32 reaches 16 keys to each side, over two ranks."""
    check(run_on_ranks(rank_results, size, size, ulysses, timeout=300), size)


def test_halo_geometry_when_chunks_are_shorter_than_half_the_window():
    ranks = [10, 11, 12, 13]  # global ranks of the seq group
    geometry = local.halo(2, 4, 12, 16, ranks)
    assert (geometry.left, geometry.right) == (16, 12)
    assert geometry.recv == {10: 4, 11: 12, 13: 12}
    assert geometry.send == {11: (0, 12), 13: (0, 12), 10: (0, 4)}
    # every send meets the receive of the same size on the other side
    for rank in range(4):
        mine = local.halo(rank, 4, 12, 16, ranks)
        for peer, (a, b) in mine.send.items():
            assert local.halo(ranks.index(peer), 4, 12, 16, ranks).recv[ranks[rank]] == b - a
    assert local.halo(0, 4, 64, 16, ranks) == local.Halo(0, 16, {11: (48, 64)}, {11: 16})


@pytest.mark.parametrize("variant,options,message", [
    ("linformer", dict(linformer_k=8), "linformer attention cannot be combined with local sliding-window layers"),
    ("bigbird", dict(bigbird_block_size=4), "bigbird attention cannot be combined with local sliding-window layers"),
    ("ulysses", dict(attention_dropout=0.1), "attention_dropout 0.1 is not supported with local layers")])
def test_local_layers_refuse_what_they_cannot_combine_with(variant, options, message):
    from bert_fixtures import small_config
    from megatron.errors import ConfigError
    from megatron.model.attention import rules

    config = small_config(variant, local_attention_window=8, global_attention_every=2, **options)
    with pytest.raises(ConfigError, match=message):
        rules.check(config, 1)


def test_attention_dropout_defaults_to_zero_with_local_layers():
    """Local layers refuse attention dropout, so a run that leaves it unset gets 0 (an HF ModernBERT
    folder's or a --local-attention-window run failed on the 0.1 default); all-global keeps 0.1."""
    from megatron.config import resolve

    small = dict(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=64, max_position_embeddings=64,
                 position_embedding_type="rope")
    ds = {"train_micro_batch_size_per_gpu": 2, "sequence_parallel": {"attention": "ulysses"}}
    local = {**small, "local_attention_window": 8, "global_attention_every": 2}
    assert resolve(local, ds, world_size=1).model.attention_dropout == 0.0
    assert resolve(small, ds, world_size=1).model.attention_dropout == 0.1


def test_a_window_that_spans_the_sequence_is_named_in_the_config_line():
    """A query sees keys up to window // 2 away: from window 2s - 2 on, a local layer over s tokens (or
    packed segments of up to s) sees every token, as a fine-tune of ModernBERT (window 128) at
    --seq-length 64 does. That is the model's own function, not a mistake: the config line says so."""
    from megatron.config import TrainConfig
    from megatron.model.args import BertConfig

    q, k, v, _, segment_ids = inputs()
    every_token = naive_masked_attention(q, k, v, window_allowed(segment_ids, 4 * S))
    for window, spans in ((2 * S - 4, False), (2 * S - 2, True)):
        out = local.LocalAttention(SimpleNamespace(local_attention_window=window, head_dim=D))(q, k, v, segment_ids)
        assert torch.allclose(out, every_token) == spans, window

    def line(window: int, **fields) -> str:
        model = BertConfig(num_layers=3, hidden_size=32, num_attention_heads=4, seq_length=64,
                           max_position_embeddings=64, local_attention_window=window, global_attention_every=3,
                           **fields)
        return TrainConfig(model=model).summary()

    assert line(124).endswith(", local window 124 (global every 3)")
    assert line(126).endswith(", local window 126 (global every 3; it spans the whole sequence of 64 tokens: the "
                              "local layers see every token)")
    assert line(32, max_segment_length=16).endswith(", local window 32 (global every 3; it spans every segment of "
                                                    "up to 16 tokens: the local layers see every token)")

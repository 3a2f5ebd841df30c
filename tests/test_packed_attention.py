"""Packed samples: a sample of segments s1..sk behaves as k separate samples.

- Every attention core (dense, ring, ulysses, bigbird) under segment ids equals a float64
  softmax(QK^T + mask)V whose mask lets a token see only its own segment (and, for BigBird, its
  block pattern), at SP = 1, 2, 4.
- A whole BERT on a packed batch at SP = 1, 2, 4 gives each segment the hidden states, and the
  loss and gradients, of running that segment alone as its own padded sample (dense, ring,
  ulysses; BigBird's sparsity depends on absolute block positions, so it is held to SP = 1).
- The ring does not compute blocks in which no query shares a segment with any key, in forward
  or backward (kernel calls counted).
Segments cross the SP chunk boundaries and some chunks hold only padding (PACKED_LAYOUTS).
The engine paths (PP x SP, ZeRO 0-3) train on packed micro-batches in test_deepspeed_engine.
"""
import collections
import functools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bert_fixtures import (PACKED_LAYOUTS, bigbird_allowed, naive_masked_attention, packed_batch, segment_allowed,
                           small_config, small_model)
from megatron.model import attention
from megatron.model.attention import kernels, masks
from megatron.model.attention.bigbird import BigBirdAttention, block_pattern
from megatron.model.loss import bert_batch_loss
from megatron.parallel import state
from megatron.parallel.reduce import sum_over_sequence
from megatron.parallel.spawn import run_on_ranks
from test_sequence_parallel_bert import REL_TOL, max_relative_diff

S, HEADS, D = 48, 4, 8
OPTIONS = {"dense": {}, "ring": {}, "ulysses": {}, "bigbird": dict(bigbird_block_size=4),
           "hybrid": dict(ulysses_size=2)}
ITERATION, LAYER = 2, 3  # the BigBird core's pattern


def core_inputs():
    g = torch.Generator().manual_seed(5)
    b = len(PACKED_LAYOUTS)
    q, k, v, grad_out = (torch.randn(b, S, HEADS, D, generator=g, dtype=torch.float64) for _ in range(4))
    return q, k, v, grad_out, packed_batch()[0].segment_ids


def core_chunk(variant: str, size: int):
    """This rank's attention output and q/k/v gradients (float32) for its chunk. "ring tiles":
    the ring with a tile per segment (of 2+ rows), cut every 5 rows."""
    if variant == "ring tiles":
        defaults = masks.ROWS_PER_TILE, masks.MIN_ROWS_PER_TILE
        masks.ROWS_PER_TILE, masks.MIN_ROWS_PER_TILE = 5, 2  # a tile per segment, cut every 5 rows
        try:
            return core_chunk("ring", size)
        finally:
            masks.ROWS_PER_TILE, masks.MIN_ROWS_PER_TILE = defaults
    core = attention.build(small_config(variant, seq_length=S, hidden_size=HEADS * D, num_attention_heads=HEADS,
                                        **OPTIONS[variant]))
    if isinstance(core, BigBirdAttention):
        core.iteration, core.layer = ITERATION, LAYER
    rank, step = state.get_sequence_parallel_rank(), S // size
    q, k, v, grad_out, segment_ids = (t[:, rank * step:(rank + 1) * step] for t in core_inputs())
    q, k, v = (t.float().requires_grad_(True) for t in (q, k, v))
    out = core(q, k, v, segment_ids)
    out.backward(grad_out.float())
    return out.detach(), q.grad, k.grad, v.grad


def core_reference(variant: str):
    q, k, v, grad_out, segment_ids = core_inputs()
    allowed = segment_allowed(segment_ids)  # the ring's tiles compute the same math
    if variant == "bigbird":  # and only the blocks of the pattern
        block = OPTIONS["bigbird"]["bigbird_block_size"]
        allowed &= bigbird_allowed(*block_pattern(S // block, 3, 2, 0, ITERATION, LAYER), block)
    for t in (q, k, v):
        t.requires_grad_(True)
    out = naive_masked_attention(q, k, v, allowed)
    out.backward(grad_out)
    return out.detach(), q.grad, k.grad, v.grad


def model_chunk(variant: str, size: int):
    """This rank's final hidden states, loss share and (unreduced) gradients on the packed batch."""
    model = small_model(small_config(variant, **OPTIONS[variant]))
    hidden = []
    model.final_layernorm.register_forward_hook(lambda module, inputs, output: hidden.append(output.detach()))
    chunk = packed_batch()[0].sequence_chunk(state.get_sequence_parallel_rank(), size)
    loss = bert_batch_loss(*model(*chunk.model_inputs()), chunk, sum_over_sequence)
    loss.total.backward()
    return hidden[0], loss.total.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def dropout_leaks(variant: str, size: int) -> list:
    """The segments (numbers) whose attention output on this rank's chunk changes, bitwise, when the K/V
    of every other segment and of the padding are replaced by random values: attention dropout 0.1 in
    training, the same dropout draws (seed) in both runs."""
    core = attention.build(small_config(variant, seq_length=S, hidden_size=HEADS * D, num_attention_heads=HEADS,
                                        attention_dropout=0.1))
    q, k, v, _, segment_ids = core_inputs()
    noise = torch.Generator().manual_seed(11)
    rank, step = state.get_sequence_parallel_rank(), S // size
    chunk = slice(rank * step, (rank + 1) * step)

    def out(k, v):
        torch.manual_seed(0)
        return core(q[:, chunk].float(), k[:, chunk].float(), v[:, chunk].float(), segment_ids[:, chunk])
    plain, leaks = out(k, v), []
    for number in range(1, int(segment_ids.max()) + 1):
        others = (segment_ids != number)[:, :, None, None]
        k_other, v_other = (t.where(~others, torch.randn(t.shape, generator=noise, dtype=t.dtype)) for t in (k, v))
        own = segment_ids[:, chunk] == number
        if not torch.equal(out(k_other, v_other)[own], plain[own]):
            leaks.append(number)
    return leaks


def alone_reference():
    """Each segment run alone (dense attention, one unpadded segment per sample) with its share
    of the packed loss: summed MLM cross-entropy / masked tokens of the packed batch + its SOP
    cross-entropy / segments of the packed batch. -> (hidden per sample [1, s, h] at the packed
    positions, total loss, gradients)."""
    model = small_model(small_config("dense"))
    packed, alone = packed_batch()
    masked, segments = packed.loss_mask.sum(), packed.cls_mask.sum()
    hidden, total = [], 0.0
    for singles in alone:
        pieces = []
        for single in singles:
            length = int((single.segment_ids != 0).sum())
            pieces.append(model.encode(*single.model_inputs()[:4])[:, :length].detach())
            mlm_logits, sop_logits = model(*single.model_inputs())
            loss = (F.cross_entropy(mlm_logits, single.labels[single.loss_mask], reduction="sum") / masked
                    + F.cross_entropy(sop_logits, single.sop_labels[:, 0]) / segments)
            loss.backward()
            total += loss.item()
        sample = torch.cat(pieces, 1)
        hidden.append(F.pad(sample, (0, 0, 0, S - sample.shape[1])))
    return torch.cat(hidden), total, {name: p.grad.clone() for name, p in model.named_parameters()}


class CountingOps:
    """Stands in for torch.ops.aten inside blocks.py: counts the kernel calls by name."""

    def __init__(self):
        self.calls = collections.Counter()

    def __getattr__(self, name):
        op = getattr(torch.ops.aten, name)

        def counted(*args, **kwargs):
            self.calls[name] += 1
            return op(*args, **kwargs)
        return counted


def ring_kernel_calls(segment_ids):
    """(forward, backward) kernel calls of one ring core call on this rank's chunk of segment_ids [b, S]."""
    core = attention.build(small_config("ring", seq_length=S, hidden_size=HEADS * D, num_attention_heads=HEADS))
    size, rank = state.get_sequence_parallel_world_size(), state.get_sequence_parallel_rank()
    step = S // size
    q, k, v = (torch.randn(segment_ids.shape[0], step, HEADS, D, requires_grad=True) for _ in range(3))
    counting = CountingOps()
    kernels.ATEN = counting
    try:
        core(q, k, v, segment_ids[:, rank * step:(rank + 1) * step]).sum().backward()
    finally:
        kernels.ATEN = torch.ops.aten
    calls = counting.calls
    return (calls["_scaled_dot_product_flash_attention_for_cpu"],
            calls["_scaled_dot_product_flash_attention_for_cpu_backward"])


def rank_checks(size: int) -> dict:
    """Everything one rank of an SP = size run reports (one spawn per size: start-up dominates)."""
    state.initialize(sequence=size)
    aligned = torch.arange(S).div(S // size, rounding_mode="floor")[None] + 1  # one segment per chunk
    return {"core": {variant: core_chunk(variant, size) for variant in ("ring", "ring tiles", "ulysses", "bigbird")},
            "model": {variant: model_chunk(variant, size) for variant in ("ring", "ulysses", "bigbird")},
            "dropout leaks": {"ulysses": dropout_leaks("ulysses", size)},
            "calls": {"aligned": ring_kernel_calls(aligned), "one segment": ring_kernel_calls(torch.ones(1, S).long()),
                      "half padding": ring_kernel_calls((torch.arange(S) < S // 2).long()[None])}}


@functools.cache
def spawned(size: int) -> list:
    return run_on_ranks(rank_checks, size, size, timeout=300)


def results(size: int, key: str, variant: str) -> list:
    if size == 1:
        return [{"core": core_chunk, "model": model_chunk, "dropout leaks": dropout_leaks}[key](variant, 1)]
    return [result[key][variant] for result in spawned(size)]


def assert_close(label, got, want):
    assert torch.isfinite(got).all(), f"{label} has NaN/inf"
    diff = ((got.double() - want.double()).abs().max() / want.abs().max()).item()
    assert diff <= REL_TOL, f"{label}: max relative diff {diff:.2e}"


@pytest.mark.parametrize("variant,size", [("dense", 1), ("ring", 1), ("ring tiles", 1), ("ulysses", 1), ("bigbird", 1),
                                          ("ring", 2), ("ring tiles", 2), ("ulysses", 2), ("bigbird", 2),
                                          ("ring", 4), ("ring tiles", 4), ("ulysses", 4), ("bigbird", 4)])
def test_core_sees_only_its_own_segment(variant, size):
    chunks = results(size, "core", variant)
    expected = core_reference(variant.split()[0])
    for name, got, want in zip(("out", "dq", "dk", "dv"), (torch.cat(c, dim=1) for c in zip(*chunks)), expected):
        assert_close(f"{variant} sp={size} {name}", got, want)
    padding = core_inputs()[-1] == 0
    assert (torch.cat([c[0] for c in chunks], dim=1)[padding] == 0).all(), "padding must attend to nothing"


@functools.cache
def alone():
    return alone_reference()


@pytest.mark.parametrize("variant,size", [("dense", 1), ("ring", 1), ("ulysses", 1),
                                          ("ring", 2), ("ulysses", 2), ("ring", 4), ("ulysses", 4)])
def test_packed_segments_equal_segments_alone(variant, size):
    """Hidden states per segment, the loss, and every gradient (summed over the seq ranks)."""
    ranks = results(size, "model", variant)
    hidden = torch.cat([r[0] for r in ranks], dim=1)
    loss = sum(r[1] for r in ranks).item()
    grads = {name: sum(r[2][name] for r in ranks) for name in ranks[0][2]}
    expected_hidden, expected_loss, expected_grads = alone()
    real = packed_batch()[0].segment_ids != 0
    assert_close(f"{variant} sp={size} hidden", hidden[real], expected_hidden[real])
    assert loss == pytest.approx(expected_loss, rel=REL_TOL)
    diff = max_relative_diff(grads, expected_grads)
    assert diff <= REL_TOL, f"{variant} sp={size}: gradients differ by {diff:.2e}"


@pytest.mark.parametrize("variant,size", [("dense", 1), ("ulysses", 1), ("ulysses", 2), ("ulysses", 4)])
def test_dropout_path_sees_only_its_own_segment(variant, size):
    """Under attention dropout dense and Ulysses attend tile by tile through SDPA's dropout kernel, with
    its own mask: a segment's output must not depend on the other segments' or the padding's K/V."""
    for rank, leaks in enumerate(results(size, "dropout leaks", variant)):
        assert leaks == [], f"{variant} sp={size} rank {rank}: segments {leaks} see other segments' keys"


@pytest.mark.parametrize("size", [2, 4])
def test_bigbird_packed_sequence_parallel_equals_single_rank(size):
    ranks, (reference,) = results(size, "model", "bigbird"), results(1, "model", "bigbird")
    real = packed_batch()[0].segment_ids != 0
    assert_close(f"bigbird sp={size} hidden", torch.cat([r[0] for r in ranks], dim=1)[real], reference[0][real])
    assert sum(r[1] for r in ranks).item() == pytest.approx(reference[1].item(), rel=REL_TOL)
    diff = max_relative_diff({name: sum(r[2][name] for r in ranks) for name in reference[2]}, reference[2])
    assert diff <= REL_TOL, f"bigbird sp={size}: gradients differ by {diff:.2e}"


@pytest.mark.parametrize("size", [2, 4])
def test_ring_skips_blocks_without_a_shared_segment(size):
    """Forward and backward kernel calls per rank: P of each with one segment over the whole
    sequence, 1 with one segment per chunk, none on a chunk of padding."""
    for rank, result in enumerate(spawned(size)):
        calls = result["calls"]
        assert calls["one segment"] == (size, size), f"rank {rank}: {calls['one segment']}"
        assert calls["aligned"] == (1, 1), f"rank {rank}: {calls['aligned']}"
        real_chunks = size // 2  # half padding: the first P/2 chunks attend to each other only
        expected = (real_chunks, real_chunks) if rank < real_chunks else (0, 0)
        assert calls["half padding"] == expected, f"rank {rank}: {calls['half padding']}"


def rectangles(tiles, s_q, s_k):
    covered = torch.zeros(s_q, s_k, dtype=torch.int64)
    for tile in tiles:
        covered[tile.q_start:tile.q_stop, tile.k_start:tile.k_stop] += 1
    return covered


@pytest.mark.parametrize("size,rows,shortest", [(1, 5, 2), (1, 512, 64), (1, 512, 6), (2, 7, 1), (4, 3, 4)])
def test_tiles_cover_every_pair_that_may_attend(size, rows, shortest):
    """Across all (query chunk, key chunk) pairs of PACKED_LAYOUTS: the tiles' rectangles hold every
    query-key pair of a shared segment, never overlap, and leave out the pairs no sample needs."""
    segment_ids = packed_batch()[0].segment_ids
    step = S // size
    for r in range(size):
        for c in range(size):
            q, k = segment_ids[:, r * step:(r + 1) * step], segment_ids[:, c * step:(c + 1) * step]
            covered = rectangles(masks.tile_plan(q.numpy(), k.numpy(), rows, shortest), step, step)
            needed = ((q[:, :, None] == k[:, None, :]) & (k[:, None, :] != 0)).any(0)
            assert covered.max() <= 1, f"chunks {r}, {c}: overlapping tiles"
            assert not (needed & (covered == 0)).any(), f"chunks {r}, {c}: a pair that may attend is not computed"
            if not needed.any():
                assert covered.sum() == 0, f"chunks {r}, {c}: a block without a shared segment is computed"


def test_tiles_of_packed_segments_cost_their_squares():
    """A tile per segment, each seeing only its own keys: 16 segments of 16 tokens cost 16 x 16^2
    scores instead of 256^2; segments of 500 in 4096 (a default-corpus sample), the sum of their
    squares; segments shorter than MIN_ROWS_PER_TILE share a tile."""
    segment_ids = (torch.arange(256) // 16 + 1)[None].numpy()
    tiles = masks.tile_plan(segment_ids, segment_ids, 512, 16)
    assert len(tiles) == 16 and all(t.kind == "full" for t in tiles)  # one segment, no padding: unmasked
    assert int(rectangles(tiles, 256, 256).sum()) == 16 * 16 ** 2
    long = (torch.arange(4096) // 500 + 1)[None].numpy()
    assert int(rectangles(masks.tile_plan(long, long), 4096, 4096).sum()) == 8 * 500 ** 2 + 96 ** 2
    merged = masks.tile_plan(segment_ids, segment_ids, 512, 64)
    assert len(merged) == 4 and int(rectangles(merged, 256, 256).sum()) == 4 * 64 ** 2
    unpacked = masks.tile_plan(np.ones((1, 256), dtype=np.int64), np.ones((1, 256), dtype=np.int64), 16)
    assert unpacked == [masks.Tile(0, 256, 0, 256, "full")], "one segment: one tile, no cutting"

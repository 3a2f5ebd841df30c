"""`local`: sliding-window attention over an SP-split sequence in O(s/P * W) per rank. A query
sees the keys at most `half = local_attention_window // 2` positions away on either side, in its
own segment (ModernBERT's local layers: window 128, 64 keys each side).

Besides its chunk a rank needs the `half` keys and values on each side of it: one halo exchange
per local layer with the ranks that hold them (comm.SeqComm.exchange: one batch, the same issue
order on every rank: NCCL-safe), never a ring pass or an all-to-all. Usually that is the two
neighbours; when a chunk is shorter than `half`, the halo spans several ranks, and rank r
receives from each rank within ceil(half / chunk) of it the part of that rank's chunk that lies
within `half` of r's chunk (`halo`). Backward sends the halo's dK, dV home the same way.

The chunk's own attention is banded: query rows in tiles of `_TILE_ROWS`, each against the keys of
the extended chunk [left halo | chunk | right halo] that its rows' windows reach (rows + 2 half),
with the tile's mask (window, same segment, no padding): never an s x s mask. A query row's keys
all lie in its tile, so each tile's softmax is final and backward recomputes it from its saved
lse. On CUDA in fp16/bf16 the chunk is one varlen flash call with flash's window instead
(local_plan says how its queries line up with their keys). What a token may see is data: the
whole sequence's segment ids are all-gathered once per micro-batch (plans.py; b * s integers,
also the collective that gives NCCL the group's communicator) and every tile's mask and the
varlen offsets are made from them once, for every local layer.
"""
import functools
from typing import NamedTuple

import numpy as np
import torch

from megatron.data.batch import PAD_SEGMENT
from megatron.model.attention import blocks, kernels, masks, plans
from megatron.model.attention.comm import SeqComm
from megatron.model.attention.masks import BlockMask
from megatron.model.attention.registry import AttentionCore, register
from megatron.parallel import state

_TILE_ROWS = 64  # query rows per tile (at least `half`: a tile's keys are then at most 3x its rows)


class Halo(NamedTuple):
    """Rank r's halo: `left` / `right` keys beyond its chunk; `send[peer]` = (start, stop) of
    its chunk that `peer` needs; `recv[peer]` = how many keys `peer` sends (ascending peer rank
    is ascending position: the received pieces concatenate in sequence order)."""
    left: int
    right: int
    send: dict
    recv: dict


def halo(rank: int, size: int, chunk: int, half: int, ranks: list) -> Halo:
    """The halo of seq rank `rank` of `size`, chunks of `chunk` tokens, global ranks `ranks`."""
    total = size * chunk

    def reach(r):  # the positions rank r's queries may see
        return max(0, r * chunk - half), min(total, (r + 1) * chunk + half)

    def overlap(r, span):
        start, stop = max(r * chunk, span[0]), min((r + 1) * chunk, span[1])
        return (start - r * chunk, stop - r * chunk) if start < stop else None

    span = reach(rank)
    send, recv = {}, {}
    for peer in range(size):
        if peer == rank:
            continue
        if (part := overlap(rank, reach(peer))) is not None:
            send[ranks[peer]] = part
        if (part := overlap(peer, span)) is not None:
            recv[ranks[peer]] = part[1] - part[0]
    return Halo(rank * chunk - span[0], span[1] - (rank + 1) * chunk, send, recv)


class Tile(NamedTuple):
    """Query rows [q_start, q_stop) of the chunk against keys [k_start, k_stop) of the extended
    chunk, with their mask."""
    q_start: int
    q_stop: int
    k_start: int
    k_stop: int
    mask: BlockMask


class LocalPlan:
    """The halo, the tiles (CPU, and CUDA in fp32; made on first use: a GPU run in fp16/bf16 never
    needs them) and, on CUDA, the windowed varlen sequences of the whole chunk (`Varlen` of queries
    [chunk | right halo] against keys [left halo | chunk | right halo]; None where varlen cannot
    describe the layout)."""

    def __init__(self, halo: Halo, half: int, varlen: "masks.Varlen | None", make_tiles):
        self.halo, self.half, self.varlen, self._make_tiles = halo, half, varlen, make_tiles

    @functools.cached_property
    def tiles(self) -> list:
        return self._make_tiles()


def local_plan(segment_ids, seq, half: int) -> LocalPlan:
    """This rank's LocalPlan from its chunk of segment ids [b, s/P]: the halo, every tile with its
    mask (tiles in which no query sees a key are left out) and on CUDA the windowed varlen plan."""
    b, chunk = segment_ids.shape
    whole = torch.cat(seq.all_gather(segment_ids), 1) if seq.size > 1 else segment_ids  # [b, s]
    host = plans.to_host(whole)  # the plan's one host synchronisation
    geometry = halo(seq.rank, seq.size, chunk, half, seq.ranks)
    first = seq.rank * chunk  # global position of the chunk's first token
    start = first - geometry.left  # ... and of the extended chunk's first key
    stop = first + chunk + geometry.right

    def tiles() -> list:
        made = []
        for q_start in range(0, chunk, _TILE_ROWS):
            q_stop = min(chunk, q_start + _TILE_ROWS)
            k_start, k_stop = max(start, first + q_start - half), min(stop, first + q_stop + half)  # global
            q_ids, k_ids = host[:, first + q_start:first + q_stop], host[:, k_start:k_stop]
            rows, keys = np.arange(first + q_start, first + q_stop), np.arange(k_start, k_stop)
            near = np.abs(rows[:, None] - keys[None]) <= half
            if not ((q_ids[:, :, None] == k_ids[:, None, :]) & (k_ids != PAD_SEGMENT)[:, None, :] & near).any():
                continue
            q_dev, k_dev = whole[:, first + q_start:first + q_stop], whole[:, k_start:k_stop]
            allowed = ((q_dev[:, :, None] == k_dev[:, None, :]) & (k_dev != PAD_SEGMENT)[:, None, :]
                       & plans.to_device(near, whole.device))[:, None]  # [b, 1, rows, keys]
            made.append(Tile(q_start, q_stop, k_start - start, k_stop - start,
                             BlockMask(allowed, ~allowed[:, 0].any(-1))))
        return made

    # flash aligns a varlen sequence's queries to the bottom-right corner of its keys: with the right
    # halo's rows after the chunk on the query side (dummies: zeros, their output dropped, their
    # gradient zero), a segment has as many keys more than queries as it has keys in the left
    # halo, so each query faces its own position and a window of `half` each side is the layer's
    cuda = kernels.on_cuda(whole)
    varlen = masks.varlen_plan(host[:, first:stop], host[:, start:stop], whole.device) if cuda else None
    return LocalPlan(geometry, half, varlen, tiles)


def _sides(peers, seq) -> tuple:
    """Peers (global ranks) before and after this rank in the sequence, each in sequence order."""
    ordered = sorted(peers, key=seq.ranks.index)
    return [p for p in ordered if seq.ranks.index(p) < seq.rank], [p for p in ordered if seq.ranks.index(p) > seq.rank]


def _exchange_halo(x, geometry: Halo, seq):
    """[b, s/P, ...] of this rank -> the extended [b, left + s/P + right, ...]: the pieces of
    other ranks' chunks in its halo, in sequence order."""
    incoming = {peer: x.new_empty(x.shape[0], count, *x.shape[2:]) for peer, count in geometry.recv.items()}
    received = dict(zip(sorted(incoming), seq.exchange(
        {peer: x[:, a:b].contiguous() for peer, (a, b) in geometry.send.items()}, incoming)))
    before, after = _sides(geometry.recv, seq)
    return torch.cat([*(received[p] for p in before), x, *(received[p] for p in after)], 1)


def _send_halo_home(grad_extended, geometry: Halo, seq):
    """dK or dV of the extended chunk -> this rank's [b, s/P, ...], with the halo parts other
    ranks computed for its keys added in."""
    chunk = grad_extended.shape[1] - geometry.left - geometry.right
    before, after = _sides(geometry.recv, seq)
    outgoing = {}
    for peers, offset in ((before, 0), (after, geometry.left + chunk)):  # the received pieces' places
        for peer in peers:
            outgoing[peer] = grad_extended[:, offset:offset + geometry.recv[peer]].contiguous()
            offset += geometry.recv[peer]
    own = grad_extended[:, geometry.left:geometry.left + chunk].clone()
    incoming = {peer: own.new_empty(own.shape[0], b - a, *own.shape[2:]) for peer, (a, b) in geometry.send.items()}
    for peer, grad in zip(sorted(incoming), seq.exchange(outgoing, incoming)):
        a, b = geometry.send[peer]
        own[:, a:b] += grad
    return own


def _tile_masks(tiles):
    """LocalPlan tiles -> (query rows, extended key columns, BlockMask) for blocks.forward_tiles."""
    return [(slice(t.q_start, t.q_stop), slice(t.k_start, t.k_stop), t.mask) for t in tiles]


def _with_rows_after(x, rows: int):
    """[b, s, ...] -> [b, s + rows, ...], zeros after: the right halo's dummy query rows (local_plan)."""
    if not rows:  # no right halo (SP = 1, the last rank): x itself
        return x
    return torch.cat([x, x.new_zeros(x.shape[0], rows, *x.shape[2:])], 1)


def _windowed(q, plan) -> bool:
    """Whether the chunk runs as one windowed varlen flash call (CUDA, fp16/bf16, flash's head dims)."""
    return blocks.kernel(q, masked=True, varlen=plan.varlen is not None) == "varlen_flash"


class _LocalAttention(torch.autograd.Function):
    """q, k, v [b, s/P, heads, d] of this rank -> out [b, s/P, heads, d]. The windowed flash call keeps
    the lse as the kernel writes it (blocks.varlen_flash): it goes only to this core's backward."""

    @staticmethod
    def forward(ctx, q, k, v, plan, seq, scale):
        if seq.size > 1:  # [b, left + s/P + right, heads, d]
            k, v = _exchange_halo(torch.stack([k, v], 2), plan.halo, seq).unbind(2)
        chunk, windowed = q.shape[1], _windowed(q, plan)
        if windowed:
            q = _with_rows_after(q, plan.halo.right)
        q_t, k_t, v_t = (x.transpose(1, 2) for x in (q, k, v))  # the kernels' layout (views)
        if windowed:
            out, lse = blocks.varlen_flash(q_t, k_t, v_t, plan.varlen, scale, window=plan.half)
        else:
            out, lse = blocks.forward_tiles(q_t, k_t, v_t, _tile_masks(plan.tiles), scale)
        ctx.save_for_backward(q_t, k_t, v_t, out, lse)
        ctx.plan, ctx.seq, ctx.scale, ctx.windowed = plan, seq, scale, windowed
        return out[:, :, :chunk].transpose(1, 2)

    @staticmethod
    def backward(ctx, grad_out):
        q_t, k_t, v_t, out, lse = ctx.saved_tensors
        plan, seq, chunk = ctx.plan, ctx.seq, grad_out.shape[1]
        if ctx.windowed:  # the forward's kernel: gradients in q's dtype
            grad_out = _with_rows_after(grad_out, plan.halo.right).transpose(1, 2)
            dq, dk, dv = blocks.varlen_flash_backward(grad_out, q_t, k_t, v_t, out, lse, plan.varlen, ctx.scale,
                                                      window=plan.half)
        else:  # float32
            grad_out = grad_out.transpose(1, 2)
            dq, dk, dv = blocks.backward_tiles(grad_out, q_t, k_t, v_t, _tile_masks(plan.tiles), out, lse, ctx.scale)
        dq, dk, dv = (x.transpose(1, 2) for x in (dq[:, :, :chunk], dk, dv))  # [b, s/P or extended, heads, d]
        if seq.size > 1:  # the halo's dK, dV go home, summed in float32
            dk, dv = _send_halo_home(torch.stack([dk, dv], 2).float(), plan.halo, seq).unbind(2)
        dtype = q_t.dtype
        return dq.to(dtype), dk.to(dtype), dv.to(dtype), None, None, None


@register("local")
class LocalAttention(AttentionCore):

    def __init__(self, config):
        super().__init__()
        self.seq = SeqComm(state.get_sequence_parallel_group(), state.get_sequence_parallel_ranks())
        self.half = config.local_attention_window // 2
        self.scale = config.head_dim ** -0.5

    def plan(self, segment_ids) -> LocalPlan:
        """Once per micro-batch, shared by every local layer (plans.py)."""
        key = ("local", self.half, self.seq.rank, tuple(self.seq.ranks))
        return plans.cached(key, segment_ids, lambda: local_plan(segment_ids, self.seq, self.half))

    def forward(self, q, k, v, segment_ids):
        return _LocalAttention.apply(q, k, v, self.plan(segment_ids), self.seq, self.scale)

"""`ring`: exact attention over the whole sequence with K/V chunks passed around the seq ring.

Forward, on seq rank r of P: step t attends the local queries to the K/V chunk of rank r - t
and merges by log-sum-exp; while one block computes, the next chunk is already in flight
(comm.SeqComm.shift: one batched send/receive into a fresh buffer, NCCL-safe). What a query may
see comes from segment ids (masks.py), all-gathered once per call (b * s integers), so the kind
of every block is known before the ring starts: a block in which no query shares a segment with
any key (packed samples, chunks of padding) is neither computed nor recomputed, though its K/V
still travel on, and the others are cut into tiles cropped to the rows and keys that can see
each other (masks.tile_plan). Saved for backward are only q, k, v, the segment ids, the output
and the lse: all O(s/P), never a [heads, s/P, s] score matrix.

Backward sends the K/V chunks around the ring again and recomputes each block from the saved
lse. The dK/dV of a chunk travel with it as an accumulator that every rank adds its share to;
one last hop takes it home to the chunk's owner.

Attention dropout is refused: recomputing blocks exactly in backward would need the same
dropout masks, and the SDPA kernels used here take no RNG state.
"""
from typing import NamedTuple

import torch

from megatron.model.attention import blocks, kernels, masks, plans
from megatron.model.attention.comm import SeqComm
from megatron.model.attention.registry import AttentionCore, register
from megatron.parallel import state

# Point-to-point goes through comm.SeqComm (NCCL-safe: one batch_isend_irecv per exchange, no
# tags). Every rank issues, per forward step, one K/V shift; per backward step, one K/V shift
# then one dK/dV shift: the same sequence on every rank, so the two backward streams (same
# size in fp32) pair up by issue order alone.


class RingPlan(NamedTuple):
    """The ring's plan of a micro-batch on this rank: the segment ids of the K/V chunk held at
    each step and that block's masks.BlockPlan (None: skipped)."""
    k_segments: list
    blocks: list


def schedule(segment_ids, ring) -> RingPlan:
    """This rank's RingPlan. Every rank learns every chunk's segment ids up front (b * s
    integers), so all blocks are planned before the ring starts, in one host synchronisation."""
    chunks = ring.all_gather(segment_ids) if ring.size > 1 else [segment_ids]
    k_segments = [chunks[(ring.rank - step) % ring.size] for step in range(ring.size)]
    host = plans.to_host(torch.stack(chunks))  # the plan's one host synchronisation
    cuda = kernels.on_cuda(segment_ids)
    return RingPlan(k_segments, [masks.block_plan(host[ring.rank], host[(ring.rank - step) % ring.size],
                                                  segment_ids.device, cuda) for step in range(ring.size)])


def _pack(k, v):
    """K and V of a chunk, [b, heads, s/P, d] views of [b, s/P, heads, d], in one flat buffer in
    that memory order, so that _unpack gives back the kernels' layout."""
    return torch.cat([x.transpose(1, 2).reshape(-1) for x in (k, v)])


def _unpack(flat, shape, dtype):
    """flat -> two [b, heads, s/P, d] views of [b, s/P, heads, d] memory (in `dtype`)."""
    b, heads, s, d = shape
    numel = shape.numel()
    return [flat[i * numel:(i + 1) * numel].view(b, s, heads, d).transpose(1, 2).to(dtype) for i in range(2)]


class RingAttentionFunction(torch.autograd.Function):
    """The ring's forward and backward on plain tensors; `ring` is the SeqComm (or simulate's
    SimulatedComm) of the ring's ranks. Also dense.py's one-rank path and simulate.py's driver."""

    @staticmethod
    def forward(ctx, q, k, v, q_segments, plan, ring, scale):
        # q, k, v: [b, heads, s/P, d] views of [b, s/P, heads, d] (the kernels' layout); q_segments
        # [b, s/P]; plan: this rank's RingPlan
        block = (k, v)  # step 0 attends to the local chunk
        kv = _pack(k, v) if ring.size > 1 else None
        out = lse = None
        for step in range(ring.size):
            pending = ring.shift(kv) if step < ring.size - 1 else None
            if plan.blocks[step]:
                out, lse = blocks.merge(out, lse, *blocks.attend(q, *block, q_segments, plan.k_segments[step],
                                                                 plan.blocks[step], scale))
            if pending:
                kv = pending()
                block = _unpack(kv, k.shape, k.dtype)
        if out is None:  # no query of this chunk sees any key (a chunk of padding)
            out, lse = blocks.empty_result(q)
        out = out.to(q.dtype)  # keeps the [b, s/P, heads, d] memory order (blocks.empty_result)
        ctx.save_for_backward(q, k, v, q_segments, out, lse, *plan.k_segments)
        ctx.plan, ctx.ring, ctx.scale = plan, ring, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, q_segments, out, lse, *k_segments = ctx.saved_tensors
        plan, ring, scale = ctx.plan, ctx.ring, ctx.scale
        nothing = (None, None, None, None)
        if ring.size == 1:  # one block: its gradients are the result (in q's dtype unless summed over tiles)
            if not plan.blocks[0]:
                return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), *nothing
            grads = blocks.attend_backward(grad_out, q, k, v, q_segments, k_segments[0], plan.blocks[0], out, lse,
                                           scale)
            return (*(grad.to(x.dtype) for grad, x in zip(grads, (q, k, v))), *nothing)
        block = (k, v)
        kv = _pack(k, v)
        dq = blocks.kernel_layout(q.shape, torch.float32, q.device)
        grad_waiter = None  # the (dk, dv) accumulator of the held chunk, from rank r-1
        for step in range(ring.size):
            kv_waiter = ring.shift(kv) if step < ring.size - 1 else None
            dk_blk = dv_blk = None
            if plan.blocks[step]:  # a skipped block adds nothing to dq, dk or dv
                dq_blk, dk_blk, dv_blk = blocks.attend_backward(grad_out, q, *block, q_segments, k_segments[step],
                                                                plan.blocks[step], out, lse, scale)
                dq.add_(dq_blk)
            if grad_waiter:  # add our share into the received accumulator and pass it on
                dkv = grad_waiter()
                if dk_blk is not None:
                    dk_acc, dv_acc = _unpack(dkv, k.shape, torch.float32)
                    dk_acc.add_(dk_blk)
                    dv_acc.add_(dv_blk)
            elif dk_blk is not None:  # the accumulator travels in float32
                dkv = _pack(dk_blk.float(), dv_blk.float())
            else:
                dkv = k.new_zeros(k.numel() + v.numel(), dtype=torch.float32)
            del dk_blk, dv_blk
            grad_waiter = ring.shift(dkv)  # the last of these hops takes it home
            if kv_waiter:
                kv = kv_waiter()
                block = _unpack(kv, k.shape, k.dtype)
        dk, dv = _unpack(grad_waiter(), k.shape, k.dtype)
        return dq.to(q.dtype), dk, dv, *nothing


@register("ring")
class RingAttention(AttentionCore):

    def __init__(self, config, ring: tuple | None = None):
        """`ring`: (process group, its global ranks) of the ring, hybrid's ring group; None: the seq group.
        One pair: a group given without its ranks was ignored (the seq group's taken instead)."""
        super().__init__()
        self.group, ranks = ring if ring is not None else (state.get_sequence_parallel_group(),
                                                          state.get_sequence_parallel_ranks())
        self.comm = SeqComm(self.group, ranks)
        self.scale = config.head_dim ** -0.5

    def plan(self, segment_ids) -> RingPlan:
        """This micro-batch's RingPlan, made by the first layer and reused (plans.py)."""
        key = ("ring", self.comm.rank, tuple(self.comm.ranks))
        return plans.cached(key, segment_ids, lambda: schedule(segment_ids, self.comm))

    def forward(self, q, k, v, segment_ids):
        return self.attend(q, k, v, self.plan(segment_ids))

    def attend(self, q, k, v, plan: RingPlan):
        """q, k, v [b, s/P, heads, d] of the chunk whose segment ids are plan.k_segments[0]."""
        # -> the kernels' [b, heads, s/P, d] (strided views) and back: free
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
        out = RingAttentionFunction.apply(q, k, v, plan.k_segments[0], plan, self.comm, self.scale)
        return out.transpose(1, 2)

"""`ring`: exact attention over the whole sequence with K/V chunks passed around the seq ring.

Forward, on seq rank r of P: step t attends the local queries to the K/V chunk of rank r - t
and merges by log-sum-exp; while one block computes, the next chunk is already in flight
(isend/irecv into a fresh buffer). What a query may see comes from segment ids (masks.py),
all-gathered once per call (b * s integers), so the kind of every block is known before the
ring starts: a block in which no query shares a segment with any key (packed samples, chunks
of padding) is neither computed nor recomputed, though its K/V still travel on. Saved for
backward are only q, k, v, the segment ids, the output and the lse: all O(s/P), never a
[heads, s/P, s] score matrix.

Backward sends the K/V chunks around the ring again and recomputes each block from the saved
lse. The dK/dV of a chunk travel with it as an accumulator that every rank adds its share to;
one last hop takes it home to the chunk's owner.

Attention dropout is refused: recomputing blocks exactly in backward would need the same
dropout masks, and the SDPA kernels used here take no RNG state.
"""
import torch
import torch.distributed as dist

from megatron.model.attention import blocks, masks
from megatron.model.attention.registry import AttentionCore, register
from megatron.parallel import state

_KV_TAG, _GRAD_TAG = 0, 1


class _Ring:
    """Point-to-point neighbours on the seq ring: send to rank r+1, receive from r-1."""

    def __init__(self, group, ranks):
        self.group = group
        self.size = len(ranks)
        self.rank = ranks.index(dist.get_rank()) if self.size > 1 else 0
        self.next, self.prev = ranks[(self.rank + 1) % self.size], ranks[(self.rank - 1) % self.size]

    def shift(self, tensor, tag):
        """Starts sending `tensor` forward and receiving the previous rank's; returns a waiter."""
        received = torch.empty_like(tensor)
        works = [dist.isend(tensor, self.next, group=self.group, tag=tag),
                 dist.irecv(received, self.prev, group=self.group, tag=tag)]

        def wait():
            for work in works:
                work.wait()
            return received
        return wait


def _pack(*tensors):
    return torch.cat([t.reshape(-1) for t in tensors])


def _unpack(flat, shapes, dtypes):
    out, offset = [], 0
    for shape, dtype in zip(shapes, dtypes):
        numel = shape.numel()
        out.append(flat[offset:offset + numel].view(shape).to(dtype))
        offset += numel
    return out


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, q_segments, k_segments, kinds, ring, scale):
        # q, k, v: [b, heads, s/P, d] (strided views are fine); q_segments [b, s/P]; k_segments[t],
        # kinds[t]: the segment ids of the K/V chunk held at step t and that block's kind (masks.py)
        layout = ((k.shape, v.shape), (k.dtype, v.dtype))
        block = (k, v)  # step 0 attends to the local chunk
        kv = _pack(k, v) if ring.size > 1 else None
        out = lse = None
        for step in range(ring.size):
            pending = ring.shift(kv, _KV_TAG) if step < ring.size - 1 else None
            if kinds[step] != "skip":
                mask = masks.block_mask(q_segments, k_segments[step], kinds[step])
                out, lse = blocks.merge(out, lse, *blocks.forward(q, *block, mask, scale))
            if pending:
                kv = pending()
                block = _unpack(kv, *layout)
        if out is None:  # no query of this chunk sees any key (a chunk of padding)
            out, lse = q.new_zeros(q.shape), q.new_full(q.shape[:3], float("-inf"), dtype=torch.float32)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, q_segments, out, lse, *k_segments)
        ctx.kinds, ctx.ring, ctx.scale = kinds, ring, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, q_segments, out, lse, *k_segments = ctx.saved_tensors
        kinds, ring, scale = ctx.kinds, ctx.ring, ctx.scale
        layout = ((k.shape, v.shape), (k.dtype, v.dtype))
        block = (k, v)
        kv = _pack(k, v) if ring.size > 1 else None
        dq = q.new_zeros(q.shape, dtype=torch.float32)
        grad_waiter = None  # the (dk, dv) accumulator of the held chunk, from rank r-1
        nothing = (None, None, None, None, None, None)
        for step in range(ring.size):
            kv_waiter = ring.shift(kv, _KV_TAG) if step < ring.size - 1 else None
            dk_blk = dv_blk = None
            if kinds[step] != "skip":  # a skipped block adds nothing to dq, dk or dv
                mask = masks.block_mask(q_segments, k_segments[step], kinds[step])
                dq_blk, dk_blk, dv_blk = blocks.backward(grad_out, q, *block, mask, out, lse, scale)
                dq.add_(dq_blk)
            if ring.size == 1:
                if dk_blk is None:
                    return dq.to(q.dtype), torch.zeros_like(k), torch.zeros_like(v), *nothing
                return dq.to(q.dtype), dk_blk, dv_blk, *nothing
            if grad_waiter:  # add our share into the received accumulator and pass it on
                dkv = grad_waiter()
                if dk_blk is not None:
                    dk_acc, dv_acc = _unpack(dkv, (k.shape, v.shape), (torch.float32, torch.float32))
                    dk_acc.add_(dk_blk)
                    dv_acc.add_(dv_blk)
            elif dk_blk is not None:
                dkv = _pack(dk_blk.float(), dv_blk.float())
            else:
                dkv = k.new_zeros(k.numel() + v.numel(), dtype=torch.float32)
            del dk_blk, dv_blk
            grad_waiter = ring.shift(dkv, _GRAD_TAG)  # the last of these hops takes it home
            if kv_waiter:
                kv = kv_waiter()
                block = _unpack(kv, *layout)
        dk, dv = _unpack(grad_waiter(), (k.shape, v.shape), (k.dtype, v.dtype))
        return dq.to(q.dtype), dk, dv, *nothing


@register("ring")
class RingAttention(AttentionCore):
    supports_attention_dropout = False

    def __init__(self, config, group=None, ranks=None):
        """`group`, `ranks`: the ranks of the ring (default: the seq group; hybrid's ring group)."""
        super().__init__()
        self.group = state.get_sequence_parallel_group() if ranks is None else group
        self.ring = _Ring(self.group, state.get_sequence_parallel_ranks() if ranks is None else ranks)
        self.scale = config.head_dim ** -0.5

    def forward(self, q, k, v, segment_ids):
        # Every rank learns every chunk's segment ids up front (b * s integers), so the kinds of all
        # its blocks are settled before the ring starts, in one host synchronisation.
        ring = self.ring
        chunks = masks.gather_chunks(segment_ids, self.group, ring.size) if ring.size > 1 else [segment_ids]
        k_segments = [chunks[(ring.rank - step) % ring.size] for step in range(ring.size)]
        kinds = masks.block_kinds(masks.id_range(segment_ids), [masks.id_range(c) for c in k_segments])
        # [b, s/P, heads, d] -> the kernels' [b, heads, s/P, d] (strided views) and back
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
        out = _RingAttention.apply(q, k, v, segment_ids, k_segments, kinds, ring, self.scale)
        return out.transpose(1, 2)

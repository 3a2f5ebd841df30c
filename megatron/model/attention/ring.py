"""`ring`: exact attention over the whole sequence with K/V chunks passed around the seq ring.

Forward, on seq rank r of P: step t attends the local queries to the K/V chunk of rank r - t
(arriving with its key-padding mask) and merges by log-sum-exp; while one block computes, the
next chunk is already in flight (isend/irecv into a fresh buffer). Saved for backward are only
q, k, v, the mask, the output and the lse: all O(s/P), never a [heads, s/P, s] score matrix.

Backward sends the K/V chunks around the ring again and recomputes each block from the saved
lse. The dK/dV of a chunk travel with it as an accumulator that every rank adds its share to;
one last hop takes it home to the chunk's owner.

Attention dropout is refused: recomputing blocks exactly in backward would need the same
dropout masks, and the SDPA kernels used here take no RNG state.
"""
import torch
import torch.distributed as dist

from megatron.model.attention import blocks
from megatron.model.attention.registry import AttentionCore, register
from megatron.parallel import state

_KV_TAG, _GRAD_TAG = 0, 1


class _Ring:
    """Point-to-point neighbours on the seq ring: send to rank r+1, receive from r-1."""

    def __init__(self, group, ranks):
        self.group = group
        self.size = len(ranks)
        me = ranks.index(dist.get_rank()) if self.size > 1 else 0
        self.next, self.prev = ranks[(me + 1) % self.size], ranks[(me - 1) % self.size]

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
    def forward(ctx, q, k, v, key_padding_mask, ring, scale):
        # q, k, v: [b, heads, s/P, d] (strided views are fine); key_padding_mask: [b, s/P] bool
        layout = ((k.shape, v.shape, key_padding_mask.shape), (k.dtype, v.dtype, torch.bool))
        block = (k, v, key_padding_mask)  # step 0 attends to the local chunk
        kv = _pack(k, v, key_padding_mask.to(k.dtype)) if ring.size > 1 else None
        out = lse = None
        for step in range(ring.size):
            pending = ring.shift(kv, _KV_TAG) if step < ring.size - 1 else None
            out, lse = blocks.merge(out, lse, *blocks.forward(q, *block, scale))
            if pending:
                kv = pending()
                block = _unpack(kv, *layout)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, key_padding_mask, out, lse)
        ctx.ring, ctx.scale = ring, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, key_padding_mask, out, lse = ctx.saved_tensors
        ring, scale = ctx.ring, ctx.scale
        layout = ((k.shape, v.shape, key_padding_mask.shape), (k.dtype, v.dtype, torch.bool))
        block = (k, v, key_padding_mask)
        kv = _pack(k, v, key_padding_mask.to(k.dtype)) if ring.size > 1 else None
        dq = grad_waiter = None  # grad_waiter: the (dk, dv) accumulator of the held chunk, from rank r-1
        for step in range(ring.size):
            kv_waiter = ring.shift(kv, _KV_TAG) if step < ring.size - 1 else None
            dq_blk, dk_blk, dv_blk = blocks.backward(grad_out, q, *block, out, lse, scale)
            dq = dq_blk.float() if dq is None else dq.add_(dq_blk)
            if ring.size == 1:
                return dq.to(q.dtype), dk_blk, dv_blk, None, None, None
            if grad_waiter:  # add our share into the received accumulator and pass it on
                dkv = grad_waiter()
                dk_acc, dv_acc = _unpack(dkv, (k.shape, v.shape), (torch.float32, torch.float32))
                dk_acc.add_(dk_blk)
                dv_acc.add_(dv_blk)
            else:
                dkv = _pack(dk_blk.float(), dv_blk.float())
            del dk_blk, dv_blk
            grad_waiter = ring.shift(dkv, _GRAD_TAG)  # the last of these hops takes it home
            if kv_waiter:
                kv = kv_waiter()
                block = _unpack(kv, *layout)
        dk, dv = _unpack(grad_waiter(), (k.shape, v.shape), (k.dtype, v.dtype))
        return dq.to(q.dtype), dk, dv, None, None, None


@register("ring")
class RingAttention(AttentionCore):
    supports_attention_dropout = False

    def __init__(self, config):
        super().__init__()
        self.ring = _Ring(state.get_sequence_parallel_group(), state.get_sequence_parallel_ranks())
        self.scale = config.head_dim ** -0.5

    def forward(self, q, k, v, key_padding_mask):
        # [b, s/P, heads, d] -> the kernels' [b, heads, s/P, d] (strided views) and back
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
        out = _RingAttention.apply(q, k, v, key_padding_mask, self.ring, self.scale)
        return out.transpose(1, 2)

"""`dense`: softmax(q k^T / sqrt(d) + mask) v over the keys this rank holds (the whole sequence).

The sequence is planned as the ring plans a block (masks.block_plan, once per micro-batch:
plans.py): cut at segment starts into tiles that each see only their own keys, or on CUDA one
varlen flash call, so packed samples cost the sum of their segments' squares and no mask is
larger than a tile (never s x s). Without attention dropout it runs the ring's exact kernels at
one rank (ring.RingAttentionFunction: lse-based backward, no score matrix kept); with dropout
each tile goes through torch's SDPA under autograd, with the tile's mask.
"""
import torch
import torch.nn.functional as F

from megatron.model.attention import kernels, masks, plans
from megatron.model.attention.comm import SeqComm
from megatron.model.attention.registry import AttentionCore, register
from megatron.model.attention.ring import RingAttentionFunction, RingPlan

_ONE_RANK = SeqComm(None, [0])  # the ring's schedule at P = 1: no communication


def whole_sequence_plan(segment_ids) -> RingPlan:
    """The plan of a sequence attending to itself: segment ids [b, s] -> RingPlan of one block."""
    host = plans.to_host(segment_ids)  # the plan's one host synchronisation
    block = masks.block_plan(host, host, segment_ids.device, kernels.on_cuda(segment_ids))
    return RingPlan([segment_ids], [block])


def attend(q, k, v, plan: RingPlan, dropout_p: float = 0.0):
    """q, k, v: [b, s, heads, d] over the sequence plan was made for -> [b, s, heads, d]. A query
    that may see no key (padding) gets zeros."""
    scale = q.shape[-1] ** -0.5
    if dropout_p == 0.0:
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))  # the kernels' [b, heads, s, d] (views)
        out = RingAttentionFunction.apply(q, k, v, plan.k_segments[0], plan, _ONE_RANK, scale)
        return out.transpose(1, 2)
    out, block, segment_ids = torch.zeros_like(q), plan.blocks[0], plan.k_segments[0]
    for tile in block.tiles if block else []:
        rows, columns = slice(tile.q_start, tile.q_stop), slice(tile.k_start, tile.k_stop)
        mask = masks.block_mask(segment_ids[:, rows], segment_ids[:, columns], tile.kind)
        # a row that may see nothing attends to every key inside the kernel (no NaN), then gets 0
        keep = None if mask.allowed is None else mask.allowed | ~mask.allowed.any(-1, keepdim=True)
        tile_out = F.scaled_dot_product_attention(q[:, rows].transpose(1, 2), k[:, columns].transpose(1, 2),
                                                  v[:, columns].transpose(1, 2), attn_mask=keep, dropout_p=dropout_p)
        if mask.blind is not None:
            tile_out = tile_out.masked_fill(mask.blind[:, None, :, None], 0.0)
        out[:, rows] = tile_out.transpose(1, 2)
    return out


@register("dense")
class DenseAttention(AttentionCore):
    def __init__(self, config):
        super().__init__()
        self.dropout_p = config.attention_dropout

    def plan(self, segment_ids) -> RingPlan:
        return plans.cached(("dense",), segment_ids, lambda: whole_sequence_plan(segment_ids))

    def forward(self, q, k, v, segment_ids):
        return attend(q, k, v, self.plan(segment_ids), self.dropout_p if self.training else 0.0)

"""`ulysses`: all-to-all from sequence-split to head-split, full-sequence SDPA, and back.

DeepSpeed's DistributedAttention does both all-to-alls (q/k/v in, output back). Each rank then
attends over the whole sequence for heads/P heads as `dense` does (segment-tiled, no s x s
mask), so it needs the segment ids of the whole sequence: all-gathered over the seq group (b * s
integers) and planned once per micro-batch (plans.py).
"""
import torch
from torch import nn

from megatron.model.attention import plans
from megatron.model.attention.comm import SeqComm
from megatron.model.attention.dense import attend, whole_sequence_plan
from megatron.model.attention.registry import AttentionCore, register
from megatron.parallel import state


class _LocalAttention(nn.Module):
    def __init__(self, dropout_p):
        super().__init__()
        self.dropout_p = dropout_p

    def forward(self, q, k, v, plan):  # [b, s, heads/P, d], the whole sequence's plan
        return attend(q, k, v, plan, self.dropout_p if self.training else 0.0)


@register("ulysses")
class UlyssesAttention(AttentionCore):
    def __init__(self, config):
        super().__init__()
        self.group = state.get_sequence_parallel_group()
        self.seq = SeqComm(self.group, state.get_sequence_parallel_ranks())
        self.size = self.seq.size
        self.local = _LocalAttention(config.attention_dropout)
        if self.size > 1:
            from deepspeed.sequence.layer import DistributedAttention

            # [b, s/P, heads, d]: scatter heads (dim 2), gather sequence (dim 1)
            self.distributed = DistributedAttention(self.local, self.group, scatter_idx=2, gather_idx=1)

    def plan(self, segment_ids):
        """The whole sequence's plan (dense.whole_sequence_plan of the gathered ids), once per micro-batch."""
        def make():
            whole = torch.cat(self.seq.all_gather(segment_ids), dim=1) if self.size > 1 else segment_ids
            return whole_sequence_plan(whole)
        return plans.cached(("ulysses", self.seq.rank, self.size), segment_ids, make)

    def forward(self, q, k, v, segment_ids):
        if self.size == 1:
            return self.local(q, k, v, self.plan(segment_ids))
        return self.distributed(q, k, v, 0, None, self.plan(segment_ids))

"""Gradient reductions applied from outside the model."""
import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from megatron.parallel import state


def allreduce_sequence_parallel_grads(params) -> None:
    """SUMS gradients of replicated parameters over the seq group, in one coalesced all-reduce.

    Each seq rank's loss is its chunk's share of the sequence loss (see model/loss.py), so the
    sum of the per-rank gradients is the full-sequence gradient. A parameter without a
    gradient on some rank contributes zeros.
    """
    if state.get_sequence_parallel_world_size() == 1:
        return
    params = [p for p in params if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in params]
    flat = _flatten_dense_tensors(grads)
    dist.all_reduce(flat, group=state.get_sequence_parallel_group())
    for grad, reduced in zip(grads, _unflatten_dense_tensors(flat, grads)):
        grad.copy_(reduced)

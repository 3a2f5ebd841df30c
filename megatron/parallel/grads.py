"""Gradient reductions applied from outside the model."""
import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from megatron.parallel import state


def allreduce_sequence_parallel_grads(params) -> None:
    """SUMS gradients of replicated parameters over the seq group, in one coalesced all-reduce.

    Each seq rank's loss is its chunk's share of the sequence loss (see model/loss.py), so the
    sum of the per-rank gradients is the full-sequence gradient. A parameter without a
    gradient on some rank contributes zeros. Where DeepSpeed's BF16_Optimizer keeps an fp32
    copy of a gradient (`_hp_grad`, which it steps with), that copy is summed.
    """
    if state.get_sequence_parallel_world_size() == 1:
        return
    params = [p for p in params if p.requires_grad]
    for p in params:
        if p.grad is None and getattr(p, "_hp_grad", None) is None:
            p.grad = torch.zeros_like(p)
    grads = [p.grad if getattr(p, "_hp_grad", None) is None else p._hp_grad for p in params]
    flat = _flatten_dense_tensors(grads)
    dist.all_reduce(flat, group=state.get_sequence_parallel_group())
    for grad, reduced in zip(grads, _unflatten_dense_tensors(flat, grads)):
        grad.copy_(reduced)


def sum_sequence_grads_in_zero3_reduce_scatter(optimizer) -> None:
    """Makes DeepSpeed's ZeRO 3 reduce-scatter SUM over the seq group (it averaged over data x seq).

    ZeRO 3 reduces each gradient bucket over its partition group, here data x seq (see
    engine._zero3_model). Its all-reduce path divides by (data x seq) / seq = data, as our
    loss shares need; its reduce-scatter path (`reduce_scatter: true`, the default, and any
    bucket of one parameter larger than `reduce_bucket_size`) divides by data x seq, which
    leaves every gradient, and the norm that clipping reads, 1/seq of its value. The
    partitions that path returns are multiplied by the seq degree: mean over data x seq, times
    seq, is the sum over seq averaged over data (design.md, data flow step 4).
    """
    seq_size = state.get_sequence_parallel_world_size()
    if seq_size == 1:
        return
    name = "_DeepSpeedZeroOptimizer_Stage3__avg_scatter_grads"  # DeepSpeed 0.19's private reduce-scatter path
    avg_scatter_grads = getattr(optimizer, name, None)
    if avg_scatter_grads is None:
        raise RuntimeError(f"{type(optimizer).__name__} has no {name}: check ZeRO 3's gradient averaging over "
                           "the seq group for this DeepSpeed version")

    def sum_over_seq(*args, **kwargs):
        return [partition.mul_(seq_size) for partition in avg_scatter_grads(*args, **kwargs)]

    setattr(optimizer, name, sum_over_seq)

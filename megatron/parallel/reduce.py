"""Sums over the seq group that code outside the model applies to what the model computes."""
import torch
import torch.distributed as dist

from megatron.parallel import state


def sum_over_sequence(values: torch.Tensor) -> torch.Tensor:
    """`values` summed in place over this rank's seq group (unchanged at SP = 1), and returned.

    The loss takes it as its `sum_counts` (model/loss.py): each seq rank counts the masked tokens
    and segments of its own chunk, and its loss share divides by those of the whole micro-batch.
    """
    if state.get_sequence_parallel_world_size() > 1:
        dist.all_reduce(values, group=state.get_sequence_parallel_group())
    return values

"""BertModelPipe as the pipeline engine trains it: the seq axis applied from outside the model.

DeepSpeed's topology gets the seq axis under the name 'model' (pipe x data x model, model fastest
= our pipe x data x seq), so every stage sends to the next stage's rank with the same (data, seq)
coordinates. Activation partitioning over that axis stays off (megatron.config sets
pipe_partitioned / grad_partitioned false). DeepSpeed's pipeline engine averages gradients over
the data axis only; SeqParallelPipe adds the seq-group SUM, and the loss's counts summed over the
seq group (model/loss.py).
"""
from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

from megatron.model.pipe import BertModelPipe
from megatron.parallel import state
from megatron.parallel.grads import allreduce_sequence_parallel_grads
from megatron.parallel.reduce import sum_over_sequence


def pipe_topology() -> PipeModelDataParallelTopology:
    """The initialised pipe x data x seq grid, seq as DeepSpeed's 'model' axis."""
    dims = state.get_dims()
    return PipeModelDataParallelTopology(num_pp=dims.pipeline, num_mp=dims.sequence, num_dp=dims.data)


class SeqParallelPipe(BertModelPipe):
    """BertModelPipe on the initialised grid, with the seq-group sums of its loss counts and gradients."""

    def __init__(self, config, **options):
        super().__init__(config, pipe_topology(), sum_counts=sum_over_sequence, **options)

    def get_tied_weights_and_groups(self):
        """The tied embedding's (weight, group) pairs, after the seq-group SUM of every gradient.

        Why a getter: DeepSpeed's pipeline engine has no gradient hook of its own for us, but it
        calls this once per training step (ReduceTiedGrads, after the last backward and right
        before its data-parallel reduction), and all-reduces each returned pair on its own. The
        seq-group sum is therefore done here, as one flattened all-reduce instead of one per
        parameter. The engine then sums the embedding over its two stages; the two sums run over
        different axes, so their order does not matter."""
        allreduce_sequence_parallel_grads(self.parameters())
        return super().get_tied_weights_and_groups()

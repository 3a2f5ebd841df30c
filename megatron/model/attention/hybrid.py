"""`hybrid`: Ulysses all-to-all inside a group of adjacent seq ranks, the ring across those groups.

The seq group of P = U x R ranks is split by megatron.parallel.state: Ulysses group i holds
the adjacent seq ranks [i * U, (i + 1) * U) (one node under the launcher: the all-to-all runs
on NVLink), and ring group u holds seq ranks u, u + U, u + 2U, ... (one rank per Ulysses
group: only the ring crosses nodes).

    q, k, v [b, s/P, heads, d]
      -> all-to-all in the Ulysses group (DeepSpeed's _SeqAllToAll, as `ulysses`): scatter the
         heads, gather the sequence: [b, s/R, heads/U, d], the contiguous tokens of all U ranks
      -> the ring (ring.py's RingAttention, its LSE merge and recompute, unchanged) over the
         ring group on that longer chunk, for heads/U heads
      -> all-to-all back: [b, s/P, heads, d]

Both all-to-alls are differentiable (backward is the reverse all-to-all), so backward is the
ring's own backward between two all-to-alls. What a query may see stays data: the chunk's
segment ids are all-gathered over the Ulysses group (b * s/R integers) and then handed to the
ring, which gathers them over its group as usual. U = 1 is the ring, U = P is Ulysses; any P
works as long as U divides the heads (P = 6 with 4 heads: U = 2, R = 3).

Bytes sent per rank per layer (benchmarks/comm_model.py, RESULTS.md): the all-to-alls move
4 x b s h / P x (U - 1) / U elements each way, the ring (R - 1) K/V chunks of 2 x b s h / P.
"""
import torch

from megatron.errors import ConfigError
from megatron.model.attention import plans
from megatron.model.attention.comm import SeqComm
from megatron.model.attention.registry import AttentionCore, register
from megatron.model.attention.ring import RingAttention, RingPlan, schedule
from megatron.model.attention.rules import ulysses_degree
from megatron.parallel import state


@register("hybrid")
class HybridAttention(AttentionCore):

    def __init__(self, config):
        super().__init__()
        size = state.get_sequence_parallel_world_size()
        # one process (a reference, a checkpoint converter): plain attention, whatever ulysses_size says
        self.ulysses_size = ulysses_degree(config.ulysses_size, config.num_attention_heads, size) if size > 1 else 1
        self.ulysses_group = state.get_ulysses_parallel_group()
        self.ulysses = SeqComm(self.ulysses_group, state.get_ulysses_parallel_ranks())
        built = self.ulysses.size
        if built != self.ulysses_size:
            raise ConfigError(f"hybrid attention wants ulysses_size {self.ulysses_size} but the process groups were "
                              f"made with {built}", "pass ulysses=config.model.ulysses_size to "
                              "megatron.parallel.state.initialize (engine.initialize_parallel does)")
        self.ring = RingAttention(config, (state.get_ring_parallel_group(), state.get_ring_parallel_ranks()))

    def plan(self, segment_ids) -> RingPlan:
        """The ring's plan of the Ulysses group's chunk (its segment ids gathered, b * s/R
        integers), once per micro-batch (plans.py)."""
        key = ("hybrid", self.ring.comm.rank, tuple(self.ring.comm.ranks), tuple(self.ulysses.ranks))

        def make():
            chunk = torch.cat(self.ulysses.all_gather(segment_ids), dim=1)  # [b, s/R]
            return schedule(chunk, self.ring.comm)
        return plans.cached(key, segment_ids, make)

    def forward(self, q, k, v, segment_ids):
        # q, k, v [b, s/P, heads, d]; segment_ids [b, s/P]
        if self.ulysses_size == 1:
            return self.ring(q, k, v, segment_ids)
        from deepspeed.sequence.layer import _SeqAllToAll

        group, batch_dim = self.ulysses_group, 0
        # scatter heads (dim 2), gather sequence (dim 1): [b, s/R, heads/U, d]
        q, k, v = (_SeqAllToAll.apply(group, x, 2, 1, batch_dim) for x in (q, k, v))
        out = self.ring.attend(q, k, v, self.plan(segment_ids))
        return _SeqAllToAll.apply(group, out, 1, 2, batch_dim)  # back to [b, s/P, heads, d]

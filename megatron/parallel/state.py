"""The single owner of process groups: axes pipe x data x seq, seq varying fastest.

Sequence-parallel ranks exchange K/V every layer, so they are made neighbours (consecutive
global ranks, hence on one node). Global rank = (pipe * data_size + data) * seq_size + seq.
Hybrid attention splits the seq group once more (ulysses x ring, ulysses fastest): seq ranks
[i * U, (i + 1) * U) form Ulysses group i (adjacent: one node under the launcher) and the seq
ranks with the same seq % U form a ring across those groups.

This module is also the `mpu` handed to DeepSpeed: it answers the `get_*` names DeepSpeed
looks up. Before `initialize()` every accessor answers as a single process would (world 1,
rank 0, group None), so the model runs in one process with no distributed setup.
"""
import contextlib
from dataclasses import dataclass

import torch.distributed as dist

from megatron.errors import ConfigError
from megatron.parallel import device
from megatron.parallel.launch_check import LayoutError


@dataclass(frozen=True)
class ParallelDims:
    pipeline: int = 1
    data: int = 1
    sequence: int = 1
    ulysses: int = 1  # hybrid attention: ranks of one all-to-all group inside the seq group (divides sequence)

    @property
    def world_size(self) -> int:
        return self.pipeline * self.data * self.sequence


@dataclass
class _Groups:
    dims: ParallelDims
    coord: dict  # axis -> this rank's index along it
    ranks: dict  # group name -> global ranks of this rank's group
    handles: dict  # group name -> ProcessGroup


_STATE: _Groups | None = None


def resolve_dims(world_size: int, pipeline: int = 1, sequence: int = 1, data: int | None = None) -> ParallelDims:
    """Derives the data degree (when not given) and checks world == pp * dp * sp."""
    for name, value in (("pipeline", pipeline), ("sequence", sequence), ("data", data)):
        if value is not None and value < 1:
            raise ConfigError(f"{name}-parallel size {value} must be >= 1",
                              f"set --{name}-parallel-size to a positive integer")
    if data is None:
        if world_size % (pipeline * sequence) != 0:
            raise LayoutError(f"world size {world_size} is not divisible by pipeline {pipeline} x sequence {sequence}",
                              world_size, pipeline, sequence)
        data = world_size // (pipeline * sequence)
    dims = ParallelDims(pipeline=pipeline, data=data, sequence=sequence)
    if dims.world_size != world_size:
        raise ConfigError(
            f"world size {world_size} != pipeline {pipeline} x data {data} x sequence {sequence} = {dims.world_size}",
            "launch pp*dp*sp processes or change the parallel sizes",
        )
    return dims


def coord_of(dims: ParallelDims, rank: int) -> dict:
    seq = rank % dims.sequence
    data = (rank // dims.sequence) % dims.data
    pipe = rank // (dims.sequence * dims.data)
    return {"pipe": pipe, "data": data, "seq": seq}


def _group_lists(dims: ParallelDims) -> dict:
    """Every group of each kind, as lists of global ranks; all ranks create them in this order."""
    everyone = range(dims.world_size)
    ulysses = dims.ulysses
    keys = {
        "seq": lambda c: (c["pipe"], c["data"]),
        "data": lambda c: (c["pipe"], c["seq"]),
        "pipe": lambda c: (c["data"], c["seq"]),
        "seq_data": lambda c: (c["pipe"],),
        "model": lambda c: (c["pipe"], c["data"], c["seq"]),  # tensor parallel degree is 1
        "seq_ulysses": lambda c: (c["pipe"], c["data"], c["seq"] // ulysses),  # adjacent seq ranks
        "seq_ring": lambda c: (c["pipe"], c["data"], c["seq"] % ulysses),  # one rank of each Ulysses group
    }
    lists = {}
    for name, key in keys.items():
        grouped: dict = {}
        for rank in everyone:
            grouped.setdefault(key(coord_of(dims, rank)), []).append(rank)
        lists[name] = list(grouped.values())
    return lists


def initialize(pipeline: int = 1, sequence: int = 1, data: int | None = None, backend: str | None = None,
               ulysses: int = 1) -> ParallelDims:
    """Creates the groups. Starts torch.distributed and deepspeed.comm (env:// rendezvous) if needed.
    `ulysses`: hybrid attention's all-to-all degree inside the seq group (1: no hybrid split)."""
    global _STATE
    import deepspeed

    if not dist.is_initialized():
        device.select_device()  # cuda:LOCAL_RANK before NCCL starts (parallel/device.py)
        device.init_distributed(backend)
    elif not deepspeed.comm.is_initialized():
        device.init_distributed(dist.get_backend())
    dims = resolve_dims(dist.get_world_size(), pipeline=pipeline, sequence=sequence, data=data)
    if ulysses < 1 or sequence % ulysses:
        raise ConfigError(f"ulysses size {ulysses} does not divide the sequence-parallel size {sequence}",
                          "set --ulysses-size to a divisor of --sequence-parallel-size")
    dims = ParallelDims(dims.pipeline, dims.data, dims.sequence, ulysses)
    rank = dist.get_rank()
    ranks, handles, made = {}, {}, {}
    for name, groups in _group_lists(dims).items():
        for members in groups:
            # a group with the members of one made before (the hybrid groups at ulysses 1 or =
            # sequence) shares its handle: every rank skips the same creations
            handle = made.get(tuple(members))
            if handle is None:
                handle = made[tuple(members)] = dist.new_group(members)
            if rank in members:
                ranks[name], handles[name] = members, handle
    _STATE = _Groups(dims=dims, coord=coord_of(dims, rank), ranks=ranks, handles=handles)
    return dims


def destroy() -> None:
    global _STATE
    _STATE = None


@contextlib.contextmanager
def one_process():
    """Every accessor answers as a single process would while inside, whatever groups this run made:
    a checkpoint's model built only for its tensor shapes (checkpoint_compat.check_model_shapes), whose
    attention was split over its own run's groups (hybrid's Ulysses size), not this run's."""
    global _STATE
    made, _STATE = _STATE, None
    try:
        yield
    finally:
        _STATE = made


def is_initialized() -> bool:
    return _STATE is not None


def get_dims() -> ParallelDims:
    return _STATE.dims if _STATE else ParallelDims()


def _group(name):
    return _STATE.handles[name] if _STATE else None


def _size(name):
    return len(_STATE.ranks[name]) if _STATE else 1


def _rank(name):
    return _STATE.ranks[name].index(dist.get_rank()) if _STATE else 0


# Sequence-parallel axis: the ranks that share one sample's sequence.
def get_sequence_parallel_group():
    return _group("seq")


def get_sequence_parallel_world_size() -> int:
    return _size("seq")


def get_sequence_parallel_rank() -> int:
    return _rank("seq")


def get_sequence_parallel_ranks() -> list:
    return list(_STATE.ranks["seq"]) if _STATE else [0]


# Hybrid attention's split of the seq group: all-to-all inside a Ulysses group (adjacent seq
# ranks), the ring across Ulysses groups (one rank of each). Single process: world 1, group None.
def get_ulysses_parallel_group():
    return _group("seq_ulysses")


def get_ulysses_parallel_ranks() -> list:
    return list(_STATE.ranks["seq_ulysses"]) if _STATE else [0]


def get_ring_parallel_group():
    return _group("seq_ring")


def get_ring_parallel_ranks() -> list:
    return list(_STATE.ranks["seq_ring"]) if _STATE else [0]


# Data x seq: the ranks holding replicas of the same parameters (ZeRO shards over them).
# Also DeepSpeed's mpu interface: DeepSpeed reads get_sequence_data_parallel_* through mpu=state.
def get_sequence_data_parallel_group():
    return _group("seq_data")


def get_sequence_data_parallel_world_size() -> int:
    return _size("seq_data")


def get_sequence_data_parallel_rank() -> int:
    return _rank("seq_data")


# Data axis: the ranks reading different samples; batch-size arithmetic uses this degree only.
def get_data_parallel_group():
    return _group("data")


def get_data_parallel_world_size() -> int:
    return _size("data")


def get_data_parallel_rank() -> int:
    return _rank("data")


def get_data_parallel_group_ranks() -> list:
    return list(_STATE.ranks["data"]) if _STATE else [0]


# Pipeline axis.
def get_pipe_parallel_group():
    return _group("pipe")


def get_pipe_parallel_world_size() -> int:
    return _size("pipe")


def get_pipe_parallel_rank() -> int:
    return _rank("pipe")


# DeepSpeed's mpu interface: DeepSpeed reads these names through mpu=state (no caller here).
get_pipeline_model_parallel_group = get_pipe_parallel_group
get_pipeline_model_parallel_world_size = get_pipe_parallel_world_size
get_pipeline_model_parallel_rank = get_pipe_parallel_rank


# Tensor (model) parallelism is not used: degree 1, each rank its own group. Part of DeepSpeed's
# mpu interface, like the aliases below: DeepSpeed reads them through mpu=state.
def get_model_parallel_group():
    return _group("model")


def get_model_parallel_world_size() -> int:
    return 1


def get_model_parallel_rank() -> int:
    return 0


def get_tensor_model_parallel_src_rank() -> int:
    return dist.get_rank() if _STATE else 0


# DeepSpeed's mpu interface: DeepSpeed reads these names through mpu=state (no caller here).
get_tensor_model_parallel_group = get_model_parallel_group
get_tensor_model_parallel_world_size = get_model_parallel_world_size
get_tensor_model_parallel_rank = get_model_parallel_rank
get_slice_parallel_group = get_model_parallel_group
get_slice_parallel_world_size = get_model_parallel_world_size
get_slice_parallel_rank = get_model_parallel_rank

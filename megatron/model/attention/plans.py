"""One attention plan per micro-batch: made on the first layer that sees the segment ids, reused
by every other layer, every recompute and every backward.

What a query may see is the same in every layer of a micro-batch, so which blocks of which
ranks' chunks meet, and how each is cut into tiles or variable-length sequences, is worked out
once: the segment ids are gathered over the seq group and copied to the host (the one host
synchronisation of the plan), planned there, and whatever the kernels need on the device goes
back in one pinned, non-blocking copy. A core asks `cached(key, segment_ids, make)`.

The cache is keyed by the segment-id tensor's memory (storage address, offset, shape, strides,
device) and its version counter, and it holds the tensor: while an entry lives, no other tensor
can occupy that memory, so a hit means the same ids. A recompute under activation checkpointing
gets a detached view of the same memory (a hit); a pipeline stage's layers get the tensor the
previous layer passed on (a hit); the next micro-batch brings a new tensor (a miss). Hits and
misses follow the program, which is the same on every seq rank, so the collectives of a miss
(the gather) are issued by all ranks or by none.

The cache keeps the `_ENTRIES` most recently used plans. A plan asked for again after it was
evicted (a micro-batch still waiting for its backward: more pipeline stages or core kinds than the
bound expects) is made again, which stays correct and costs one more host synchronisation and
gather; that is warned about once per process. An evicted plan nobody asks for again (a finished
micro-batch that the step still holds) costs nothing and says nothing.
"""
import warnings
import weakref
from collections import OrderedDict

import numpy as np
import torch

_ENTRIES = 32  # micro-batches in flight (pipeline 1F1B holds up to one per stage) times core kinds
_cache: OrderedDict = OrderedDict()
_evicted: OrderedDict = OrderedDict()  # full key -> weak reference to its segment ids, the last _ENTRIES evicted
_warned_remade = False
_alive: dict = {}  # while_alive's entries: full key -> value, each dropped with its tensor


def _full_key(key: tuple, tensor) -> tuple:
    """`key` and what names the tensor's values while it lives: its memory and version."""
    return (key, tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tensor.stride(),
            str(tensor.device), tensor._version)


def cached(key: tuple, segment_ids, make):
    """make() once per (core key, segment-id tensor); the same object afterwards. `key` names the
    planner (variant, seq rank and size, what else the plan depends on)."""
    full_key = _full_key(key, segment_ids)
    entry = _cache.get(full_key)
    if entry is None:
        _warn_if_remade(full_key, segment_ids)
        entry = (segment_ids, make())
        _cache[full_key] = entry
        while len(_cache) > _ENTRIES:
            evicted_key, (evicted_ids, _) = _cache.popitem(last=False)
            _evicted[evicted_key] = weakref.ref(evicted_ids)
            if len(_evicted) > _ENTRIES:
                _evicted.popitem(last=False)
    else:
        _cache.move_to_end(full_key)
    return entry[1]


def _warn_if_remade(full_key: tuple, segment_ids) -> None:
    """Warns once if this plan was evicted while its segment ids lived on (the same tensor: a live
    tensor's memory is not reused, so the key names the same ids)."""
    global _warned_remade
    held = _evicted.pop(full_key, None)
    if held is None or held() is not segment_ids or _warned_remade:
        return
    _warned_remade = True
    warnings.warn(f"an attention plan was made again after more than {_ENTRIES} others (micro-batches in flight x "
                  "attention kinds): one more host synchronisation and gather each time; raise "
                  "megatron.model.attention.plans._ENTRIES", stacklevel=3)


def while_alive(key: tuple, tensor, make):
    """make() once per (key, tensor), kept while that tensor object lives (a recompute's detached
    view of it hits; once it is gone the next call makes it again). Trusts the tensor's version
    counter, as cached() does: a write that bypasses it (through .data or numpy) is not seen."""
    full_key = _full_key(key, tensor)
    value = _alive.get(full_key)
    if value is None:
        value = _alive[full_key] = make()
        weakref.finalize(tensor, _alive.pop, full_key, None)
    return value


def clear() -> None:
    _cache.clear()
    _evicted.clear()
    _alive.clear()


def to_host(tensor) -> np.ndarray:
    """The plan's device -> host copy (the one that waits for the device)."""
    return tensor.cpu().numpy()


def to_device(array: np.ndarray, device) -> torch.Tensor:
    """Host plan data -> `device` without waiting: through pinned memory, non-blocking."""
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    if torch.device(device).type != "cuda":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)

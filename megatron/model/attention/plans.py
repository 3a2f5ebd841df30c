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

The cache keeps the `_ENTRIES` most recently used plans. A plan evicted while its segment ids
are still held elsewhere (a micro-batch waiting for its backward: more pipeline stages than the
bound expects) is made again when asked for, which stays correct and costs one more host
synchronisation and gather; that is warned about once per process.
"""
import warnings
import weakref
from collections import OrderedDict

import numpy as np
import torch

_ENTRIES = 32  # micro-batches in flight (pipeline 1F1B holds up to one per stage) times core kinds
_cache: OrderedDict = OrderedDict()
_warned_live_eviction = False


def cached(key: tuple, segment_ids, make):
    """make() once per (core key, segment-id tensor); the same object afterwards. `key` names the
    planner (variant, seq rank and size, what else the plan depends on)."""
    full_key = (key, segment_ids.untyped_storage().data_ptr(), segment_ids.storage_offset(),
                tuple(segment_ids.shape), segment_ids.stride(), str(segment_ids.device), segment_ids._version)
    entry = _cache.get(full_key)
    if entry is None:
        entry = (segment_ids, make())
        _cache[full_key] = entry
        while len(_cache) > _ENTRIES:
            _evict_oldest()
    else:
        _cache.move_to_end(full_key)
    return entry[1]


def _evict_oldest() -> None:
    """Drops the least recently used entry; warns once if its segment ids outlive it elsewhere
    than in another core's entry (a live micro-batch, whose layers will plan again)."""
    global _warned_live_eviction
    held = weakref.ref(_cache.popitem(last=False)[1][0])  # the entry and its plan are gone here
    segment_ids = held()
    if segment_ids is None or _warned_live_eviction:
        return
    memory = segment_ids.untyped_storage().data_ptr()
    if all(kept.untyped_storage().data_ptr() != memory for kept, _ in _cache.values()):
        _warned_live_eviction = True
        warnings.warn(f"more than {_ENTRIES} attention plans in use (micro-batches in flight x attention "
                      "kinds): evicted plans are made again, one host synchronisation and gather each; "
                      "raise megatron.model.attention.plans._ENTRIES", stacklevel=3)


def clear() -> None:
    _cache.clear()


def to_host(tensor) -> np.ndarray:
    """The plan's device -> host copy (the one that waits for the device)."""
    return tensor.cpu().numpy()


def to_device(array: np.ndarray, device) -> torch.Tensor:
    """Host plan data -> `device` without waiting: through pinned memory, non-blocking."""
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    if torch.device(device).type != "cuda":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)

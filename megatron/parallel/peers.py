"""The other ranks as a rank sees them: a collective that fails because another rank ended (killed,
crashed, or left alone after a signal) or did not answer within the collective timeout (frozen,
hung, far slower), told apart from every other error, so the survivors end with one line
(training.lost_rank_problem) instead of the backend's traceback; and the wait where one rank
works alone for long while the others stand by, polled through the store under a bound of its own.

What torch 2.13 raises: NCCL a DistBackendError (a DistError), the TCP store a DistNetworkError
or DistStoreError (DistErrors too); gloo a plain RuntimeError whose message starts with the source
location in gloo's transport layer ("[.../gloo/transport/tcp/pair.cc:537] Read error ...:
Connection reset by peer", "[.../gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting
3000ms for recv operation to complete"). gloo's transport only fails on a connection or its
deadline, so that location, not the wording after it, is what is matched.
"""
import re
import time

import torch.distributed as dist

GLOO_TRANSPORT = re.compile(r"gloo/transport/[\w/]+\.cc:\d+\]")
TIMED_OUT = re.compile(r"timed? ?out|timeout", re.IGNORECASE)
POLL_SECONDS = 0.5


def lost(error: BaseException) -> str | None:
    """'timeout' when a collective (or the store) waited past its timeout for another rank, 'ended'
    when another rank's connection broke, None for any other error (a bug keeps its traceback)."""
    text = str(error)
    if not isinstance(error, dist.DistError) and not (isinstance(error, RuntimeError) and GLOO_TRANSPORT.search(text)):
        return None
    return "timeout" if TIMED_OUT.search(text) else "ended"


_arrivals = [0]  # how many waits this rank has entered: every rank enters them in the same order


def wait_for_all(bound_seconds: float) -> bool:
    """Returns once every rank has called it (True), or False after `bound_seconds`. For a rank that
    waits while another works alone for longer than a collective may wait (rank 0 building the index
    maps of a large corpus): the count is polled through the store, so its own bound applies, a
    signal is handled between polls, and the store's host (rank 0) ending raises at once (lost)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return True
    store = dist.distributed_c10d._get_default_store()
    _arrivals[0] += 1
    key = f"megatron/arrived/{_arrivals[0]}"
    deadline = time.monotonic() + bound_seconds
    arrived = store.add(key, 1)
    while arrived < dist.get_world_size():
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_SECONDS)
        arrived = store.add(key, 0)
    return True

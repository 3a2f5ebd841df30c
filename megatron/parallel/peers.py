"""The other ranks as a rank sees them: a collective that fails because another rank ended (killed,
crashed, or left alone after a signal) or did not answer within the collective timeout (frozen,
hung, far slower), told apart from every other error, so the survivors end with one line
(training.lost_rank_problem) instead of the backend's traceback; and the wait where one rank
works alone for long while the others stand by (while_some_build), polled through the store with
no fixed bound while the builder's heartbeat goes on. An error line is printed once per run, not once
per rank (report_once), and a lost rank's line says what happened to it (lost_rank_text).

What torch 2.13 raises: NCCL a DistBackendError (a DistError), the TCP store a DistNetworkError
or DistStoreError (DistErrors too); gloo a plain RuntimeError whose message starts with the source
location in gloo's transport layer ("[.../gloo/transport/tcp/pair.cc:537] Read error ...:
Connection reset by peer", "[.../gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting
3000ms for recv operation to complete"). gloo's transport only fails on a connection or its
deadline, so that location, not the wording after it, is what is matched. A DistError counts only
for a timeout or a lost peer's wording (the store's "Connection was likely closed", "Broken pipe";
NCCL's "remote process exited"): its other causes (a store port in use, NCCL's init errors) keep the
backend's traceback, as rerunning would fail the same way.
"""
import contextlib
import json
import os
import re
import socket
import sys
import threading
import time
from contextlib import contextmanager
from datetime import timedelta

import torch.distributed as dist

from megatron.parallel import device
from megatron.parallel.launch_check import RENDEZVOUS
from megatron.parallel.launch_env import PRINTER_WAIT, outlive_rank_0, prints_for_its_node

GLOO_TRANSPORT = re.compile(r"gloo/transport/[\w/]+\.cc:\d+\]")
TIMED_OUT = re.compile(r"timed? ?out|timeout", re.IGNORECASE)
PEER_GONE = re.compile(r"connection (was likely )?closed|closed by peer|reset by peer|remote process exited"
                       r"|broken pipe",
                       re.IGNORECASE)
POLL_SECONDS = 0.5  # the longest pause between two looks at the store (the first ones are shorter)
HEARTBEAT_SECONDS = 5.0  # how often a builder tells the waiting ranks it is alive (or a quarter of the timeout)


def lost(error: BaseException) -> str | None:
    """'timeout' when a collective (or the store) waited past its timeout for another rank, 'ended'
    when another rank's connection broke, None for any other error: a bug, and a DistError of another
    cause (the store's port in use, NCCL's own errors), keep their traceback, which says why."""
    text = str(error)
    if isinstance(error, RuntimeError) and GLOO_TRANSPORT.search(text):
        return "timeout" if TIMED_OUT.search(text) else "ended"
    if not isinstance(error, dist.DistError):
        return None
    return "timeout" if TIMED_OUT.search(text) else "ended" if PEER_GONE.search(text) else None


_waits = [0]  # how many waits this rank has entered: every rank enters them in the same order


def while_some_build(builds: bool, build):
    """`build()`'s result on the ranks where `builds` (None on the others), returned on every rank once
    every builder is done: for work one rank does alone for longer than a collective may wait (rank 0
    building the index maps of a large corpus).

    Who builds is gathered first (a collective: every rank is here). Then the others poll the store for
    the builders' "done" keys, so no fixed bound applies, a signal is handled between polls, and the
    store's host (rank 0) ending raises at once (lost: 'ended'). A builder refreshes a heartbeat key
    meanwhile (from a thread; the C++ builds release the GIL): one silent for longer than the store's
    timeout (--distributed-timeout-minutes) fails the wait as a timeout (lost: 'timeout'), so a build of
    any length finishes while a frozen or lost builder does not stall the others. A non-builder that
    ends meanwhile is met by the caller's next collective, which fails at once on a closed connection."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return build() if builds else None
    _waits[0] += 1
    prefix = f"megatron/build/{_waits[0]}"
    every = [False] * dist.get_world_size()
    dist.all_gather_object(every, builds)
    store = dist.distributed_c10d._get_default_store()
    silence = store.timeout.total_seconds()
    result = None
    if builds:
        with _heartbeat(store, f"{prefix}/beat/{dist.get_rank()}", min(HEARTBEAT_SECONDS, silence / 4)):
            result = build()
        store.set(f"{prefix}/done/{dist.get_rank()}", "1")
    _wait_for(store, prefix, [rank for rank, its in enumerate(every) if its], silence)
    return result


@contextmanager
def _heartbeat(store, key: str, period: float):
    """Adds 1 to `key` every `period` seconds while the body runs."""
    stop = threading.Event()

    def beat():
        while not stop.wait(period):
            store.add(key, 1)

    thread = threading.Thread(target=beat, name="build heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _wait_for(store, prefix: str, builders: list, silence: float) -> None:
    """Until every builder has set its done key; a DistStoreError when one's heartbeat stops for `silence` s."""
    heard = {rank: (-1, time.monotonic()) for rank in builders}  # its last beat count, and when it changed
    pause = 0.005  # doubling up to POLL_SECONDS: a short build (most maps) is not waited on for half a second
    while heard:
        for rank in list(heard):
            if store.check([f"{prefix}/done/{rank}"]):
                del heard[rank]
                continue
            beats, since = store.add(f"{prefix}/beat/{rank}", 0), time.monotonic()
            if beats != heard[rank][0]:
                heard[rank] = (beats, since)
            elif since - heard[rank][1] > silence:
                raise dist.DistStoreError(f"timed out: rank {rank}, building alone, gave no heartbeat for "
                                          f"{silence:g} s (frozen, or its node lost)")
        if heard:
            time.sleep(pause)
            pause = min(2 * pause, POLL_SECONDS)


def report_once(line: str, by_rank_0: bool = False) -> None:
    """Prints an error line once per run, not once per rank, while every rank still exits non-zero.
    `by_rank_0`: every rank met the error at once (a verdict all of them reached together): rank 0 prints it,
    where the launch's output is read, not whichever rank counted first.

    Before the process group exists the ranks of a node fail alike (same flags): rank 0 and each other node's
    first rank print (prints_for_its_node: a node whose ranks alone fail, or a rendezvous that rank 0 never
    reached, is told in that node's output). After, the
    first rank to report wins a counter in the rendezvous store, which also covers an error that
    only some ranks meet (a file missing on one node). Rank 0 hosts the store: it lingers briefly
    so that ranks failing the same way can still reach it.

    Rank 0 repeats a line another node's rank printed, named by that rank and host (point_at_the_printer).

    A rank that leaves the line to another does not exit before it is printed: the launcher ends
    every rank once one exits non-zero, the printing one too. After the process group exists the
    store says when it is; before, nothing can (outlive_rank_0). After PRINTER_WAIT seconds it
    prints the line itself. Before the process group exists a rank other than rank 0 also posts its line to
    rank 0's store if that is up within PRINTER_WAIT (device.post_refusal): a node whose flags are refused
    would otherwise leave the other nodes' ranks waiting out --rendezvous-timeout, to blame the rendezvous."""
    # a partial launcher environment (launch_check.launch_environment) is a process started by hand: it prints
    partial = any(name in os.environ for name in RENDEZVOUS[:3]) and not all(name in os.environ for name in RENDEZVOUS)
    first = prints_for_its_node() or partial
    store = None
    if dist.is_available() and dist.is_initialized() and device.store_host_alive():
        try:
            store = dist.distributed_c10d._get_default_store()
            first = store.add("megatron/errors_reported", 1) == 1
            first = dist.get_rank() == 0 if by_rank_0 else first
            deadline = time.monotonic() + 2.0
            while (dist.get_rank() == 0 and time.monotonic() < deadline
                   and store.add("megatron/errors_reported", 0) < dist.get_world_size()):
                time.sleep(0.05)
        except Exception:  # the store is gone (rank 0 exited): better twice than never
            first, store = True, None
    if first:
        write_line(line)
        if store is not None:
            with contextlib.suppress(Exception):
                store.set(PRINTED_BY, json.dumps([dist.get_rank(), socket.gethostname(), line]))
                store.set("megatron/error_printed", "1")
        else:  # a node's first rank that prints for its node tells rank 0's ranks too
            device.post_refusal(line, time.monotonic() + PRINTER_WAIT)
        return
    try:
        if store is None:
            since = time.monotonic()
            device.post_refusal(line, since + PRINTER_WAIT)  # the ranks that arrived at rank 0 end at once
            outlive_rank_0(since)
        else:
            store.wait(["megatron/error_printed"], timedelta(seconds=PRINTER_WAIT))
            if dist.get_rank() == 0:
                point_at_the_printer(store)
            return
    except Exception:  # not printed in time, or the store is gone: better twice than never
        pass
    write_line(line)


PRINTED_BY = "megatron/error_printed_by"  # [rank, host, line] of the rank that printed the run's error line


def point_at_the_printer(store) -> None:
    """On rank 0, the line another node's rank printed (a --data-path missing on that node alone), named by its
    rank and host: a launch per node (NODE_RANK) shows each node's output apart, and rank 0's node, where the run's
    output is read, said nothing."""
    with contextlib.suppress(Exception):
        rank, host, line = json.loads(store.get(PRINTED_BY))
        if host != socket.gethostname():
            where = f"rank {rank} on {host}"
            write_line(line.replace(": error: ", f": error: {where}: ", 1) if ": error: " in line else
                       f"{line} ({where})")


def write_line(line: str) -> None:
    """`line` on stderr in one write (print writes the newline apart), so another rank's output that
    interleaves lands before or after it, not glued to its end."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def lost_rank_text(how: str, args, phase: str) -> tuple[str, str]:
    """What happened to the other rank (peers.lost's `how`) during `phase`, and the advice a fix ends
    with for a timeout."""
    if how == "timeout":
        return (f"another rank did not answer within --distributed-timeout-minutes "
                f"{args.distributed_timeout_minutes:g} during {phase} (frozen, hung or slower than that)",
                ", with a larger --distributed-timeout-minutes if that phase is this slow")
    return f"another rank ended during {phase} (its own output or its launcher's says why)", ""

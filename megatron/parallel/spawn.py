"""Runs a function on N ranks in real processes over gloo (tests and benchmarks).

Each rank is a fresh `spawn` process with torch.distributed initialised on 127.0.0.1 at a free
port. Results come back pickled through `torch.save`; a rank that raises surfaces its own
traceback in the parent, a rank that dies or hangs past `timeout` fails the call.
"""
import io
import multiprocessing
import os
import queue as queue_module
import socket
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist


class RankFailure(RuntimeError):
    """A rank raised, died or timed out; the message carries the child's traceback."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _serialize(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _child(fn, args, kwargs, rank, world_size, port, threads, timeout, results):
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size),
    )
    torch.set_num_threads(threads)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout))
        results.put((rank, None, _serialize(fn(*args, **kwargs))))
        dist.barrier()  # keep every rank's sockets open until all results are out
    except BaseException:
        results.put((rank, traceback.format_exc(), None))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_on_ranks(fn, world_size: int, *args, timeout: float = 180.0, threads_per_rank: int = 1, **kwargs) -> list:
    """Calls `fn(*args, **kwargs)` on every rank; returns the per-rank results in rank order.

    `fn` must be importable by name (a module-level function): ranks are spawned, not forked.
    """
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = free_port()
    procs = [
        context.Process(
            target=_child,
            args=(fn, args, kwargs, rank, world_size, port, threads_per_rank, timeout, results),
            name=f"rank{rank}",
        )
        for rank in range(world_size)
    ]
    for proc in procs:
        proc.start()
    outputs: dict = {}
    deadline = time.monotonic() + timeout
    try:
        while len(outputs) < world_size:
            try:
                rank, error, payload = results.get(timeout=1.0)
            except queue_module.Empty:
                dead = [p.name for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RankFailure(f"{', '.join(dead)} exited without a result (exit codes "
                                      f"{[p.exitcode for p in procs]})") from None
                if time.monotonic() > deadline:
                    missing = sorted(set(range(world_size)) - set(outputs))
                    raise RankFailure(f"ranks {missing} did not finish within {timeout:.0f}s") from None
                continue
            if error is not None:
                raise RankFailure(f"rank {rank} of {world_size} failed:\n{error}")
            outputs[rank] = torch.load(io.BytesIO(payload), weights_only=False)
        for proc in procs:
            proc.join(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join()
    return [outputs[rank] for rank in range(world_size)]

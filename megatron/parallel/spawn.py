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


def _failure_message(procs, silent, errors, world_size) -> str:
    """Ranks that died silently come first: the others' errors are usually their echo."""
    lines = [f"rank{r} exited without a result (exit code {procs[r].exitcode})" for r in silent]
    lines += [f"rank {r} of {world_size} failed:\n{tb}" for r, tb in sorted(errors.items())]
    return "\n".join(lines)


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
    outputs, errors = {}, {}
    deadline = give_up = time.monotonic() + timeout
    try:
        while len(outputs) + len(errors) < world_size:
            if errors and time.monotonic() > give_up:
                break  # other ranks are most likely stuck waiting for the failed one
            try:
                rank, error, payload = results.get(timeout=0.5)
            except queue_module.Empty:
                silent = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)
                          and r not in outputs and r not in errors]
                if silent and not errors:
                    raise RankFailure(_failure_message(procs, silent, errors, world_size)) from None
                if time.monotonic() > deadline:
                    missing = sorted(set(range(world_size)) - set(outputs) - set(errors))
                    raise RankFailure(f"ranks {missing} did not finish within {timeout:.0f}s") from None
                continue
            if error is not None:
                errors[rank] = error
                give_up = time.monotonic() + 2.0  # collect the other ranks' view of the failure
            else:
                outputs[rank] = torch.load(io.BytesIO(payload), weights_only=False)
        if errors:
            silent = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in errors]
            raise RankFailure(_failure_message(procs, silent, errors, world_size))
        for proc in procs:
            proc.join(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join()
    return [outputs[rank] for rank in range(world_size)]

"""Runs a function on N ranks in real processes over gloo (tests and benchmarks).

Each rank is a fresh process with torch.distributed initialised on 127.0.0.1 at a free port. Ranks
are forked from a `forkserver` that has imported torch, DeepSpeed, the trainer and what a first
engine imports once (a spawned rank spends seconds importing them, more than most multi-rank tests
spend running); with CUDA they are spawned, as a process that has asked for the GPUs must not fork.
Either way a rank gets the caller's environment, working directory and stdout/stderr as they are at
the call. What comes from the server instead: the umask, what the preloaded modules read from the
environment when imported (e.g. DeepSpeed's accelerator from DS_ACCELERATOR, inductor's
TORCHINDUCTOR_* settings), and the string hash seed, the same in every rank (the real launcher's
ranks each have their own: tests/test_launch_scripts.py runs through it). A preloaded module whose
import raises (other than ImportError) stops the server: the calls fail with EOFError, the module's
traceback printed where the first call's output went. A rank whose megatron is another tree than its
caller's (the server imports it through its own sys.path) fails the call at once rather than running
other code than its caller compares it with. Results come back pickled through `torch.save`; a rank
that raises surfaces its own traceback in the parent, a rank that dies or hangs past `timeout` fails
the call.
"""
import contextlib
import io
import multiprocessing
import os
import queue as queue_module
import socket
import time
import traceback
from datetime import timedelta
from multiprocessing import reduction
from pathlib import Path

import torch
import torch.distributed as dist


class RankFailure(RuntimeError):
    """A rank raised, died or timed out; the message carries the child's traceback."""


# The megatron tree this process imported. Python 3.11's forkserver imports its preloads with its
# own sys.path ('' = its working directory, then the editable install), not the caller's, so a
# rank may run another tree's code than its caller (run from one checkout with another's venv).
TREE = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _serialize(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


# torch, DeepSpeed and the trainer; and what a rank's first engine imports besides (~4 s of CPU a rank,
# more than most multi-rank tests spend running): DeepSpeed's optimizer check imports its Muon optimizer
# and with it torch.compile's stack, its CPU op loads torch's extension builder. A name that another
# version lacks is passed over (the server ignores an ImportError).
PRELOADED = ["torch", "torch.distributed", "deepspeed", "megatron.training", "torch._dynamo",
             "torch._inductor.compile_fx", "deepspeed.runtime.zero.muon.muon_optimizer", "torch.utils.cpp_extension"]


def _context():
    if torch.cuda.is_available():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOADED)  # read when the server starts, at the first call
    return context


class _CallersOutput:
    """The caller's stdout and stderr as they are at the call (pytest's capture of the running
    test), handed to a rank as file descriptors: a forked rank's own are the server's."""

    def __reduce__(self):
        return _CallersOutput._descriptors, (reduction.DupFd(1), reduction.DupFd(2))

    @staticmethod
    def _descriptors(*duplicates) -> list:
        return [duplicate.detach() for duplicate in duplicates]


def _write_where_the_caller_does(descriptors: list) -> None:
    for target, descriptor in zip((1, 2), descriptors):
        if descriptor != target:  # a spawned rank inherits the same numbers
            os.dup2(descriptor, target)
            os.close(descriptor)


def _child(fn, args, kwargs, rank, world_size, port, threads, timeout, results, environ, output, tree):
    os.environ.clear()
    os.environ.update(environ)
    _write_where_the_caller_does(output)
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size),
    )
    torch.set_num_threads(threads)
    try:
        if TREE != tree:
            raise RuntimeError(f"this rank imported megatron from {TREE}, its caller from {tree}: start the caller "
                               f"from the checkout its Python imports megatron from (python -m pytest there)")
        dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout))
        payload = _serialize(fn(*args, **kwargs))
    except BaseException:
        results.put((rank, traceback.format_exc(), None))
    else:
        results.put((rank, None, payload))
        # keep every rank's sockets open until all results are out; a rank that never gets here is
        # reported by the parent (its own error, or the timeout), not as this rank's failure
        with contextlib.suppress(RuntimeError):
            if dist.is_initialized():  # the function may have closed it (training.main does)
                dist.barrier()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _failure_message(procs, silent, errors, world_size) -> str:
    """Ranks that died silently come first: the others' errors are usually their echo."""
    lines = [f"rank{r} exited without a result (exit code {procs[r].exitcode})" for r in silent]
    lines += [f"rank {r} of {world_size} failed:\n{tb}" for r, tb in sorted(errors.items())]
    return "\n".join(lines)


def run_on_ranks(fn, world_size: int, *args, timeout: float = 180.0, threads_per_rank: int = 1,
                 ending_ranks: tuple = (), **kwargs) -> list:
    """Calls `fn(*args, **kwargs)` on every rank; returns the per-rank results in rank order.

    `fn` must be importable by name (a module-level function): ranks do not inherit the caller's
    memory. `ending_ranks`: ranks that may end without a result (a test of how the others meet a
    rank that dies): their result is None, and the call waits for the others' results.
    """
    context = _context()
    results = context.Queue()
    port = free_port()
    procs = [
        context.Process(
            target=_child,
            args=(fn, args, kwargs, rank, world_size, port, threads_per_rank, timeout, results, dict(os.environ),
                  _CallersOutput(), TREE),
            name=f"rank{rank}",
        )
        for rank in range(world_size)
    ]
    for proc in procs:
        proc.start()
    outputs, errors = {}, {}
    deadline = give_up = time.monotonic() + timeout
    def ended() -> set:
        return {r for r in ending_ranks if procs[r].exitcode is not None and r not in outputs and r not in errors}

    try:
        while len(outputs) + len(errors) + len(ended()) < world_size:
            if errors and time.monotonic() > give_up:
                break  # other ranks are most likely stuck waiting for the failed one
            try:
                rank, error, payload = results.get(timeout=0.5)
            except queue_module.Empty:
                silent = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)
                          and r not in outputs and r not in errors and r not in ending_ranks]
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
            silent = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in errors
                      and r not in ending_ranks]
            raise RankFailure(_failure_message(procs, silent, errors, world_size))
        for proc in procs:
            proc.join(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join()
    return [outputs.get(rank) for rank in range(world_size)]

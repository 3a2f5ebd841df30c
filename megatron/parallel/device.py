"""Which device a rank computes on, and how a micro-batch gets there.

Under the deepspeed launcher (`deepspeed ...` or, per node, `python -m deepspeed.launcher.launch`,
which the AzureML job runs on every instance) each rank finds its GPU index on the node in the
LOCAL_RANK environment variable (and as --local_rank). `select_device` binds the rank to
cuda:LOCAL_RANK BEFORE torch.distributed starts: NCCL creates its communicators on the current
device, and an unbound rank would put every rank of a node on cuda:0. Without CUDA the rank
stays on the CPU and the backend is gloo; with CUDA it is NCCL (never gloo by default).

DeepSpeed's FusedAdam is a CUDA op: prebuilt into the deepspeed install (DS_BUILD_FUSED_ADAM=1,
as the AzureML image does) or JIT-built by each rank at start-up with the machine's nvcc, which
torch's cpp_extension refuses when its CUDA major differs from torch's, and DeepSpeed's own
build refuses when TORCH_CUDA_ARCH_LIST names an architecture-specific target. `fused_adam_problem`
says beforehand whether that would happen, so the trainer takes torch's Adam instead of failing.
"""
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from megatron.ds_schema import cpu_optimizer_op
from megatron.errors import ConfigError
from megatron.quiet import c10d_log_quieted, quiet_shm_build
from megatron.parallel import jit_locks, launcher_watch, master_address
from megatron.parallel.launch_env import (NOTICE_WAIT, RENDEZVOUS_BEGUN, STOP_NOTICE, launcher_rank, local_rank,
                                          note_rank_0_state, rendezvous_setting)


def select_device() -> torch.device:
    """cuda:LOCAL_RANK, made the current CUDA device, where CUDA is present; else the CPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    index = local_rank()
    if index >= torch.cuda.device_count():
        raise RuntimeError(f"LOCAL_RANK {index} but this node has {torch.cuda.device_count()} GPUs: start at most "
                           "one rank per GPU (deepspeed --num_gpus / --include)")
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


COLLECTIVE_TIMEOUT = timedelta(minutes=10)  # --distributed-timeout-minutes' default, as Megatron-LM's


def init_distributed(dist_backend: str | None = None, rendezvous_timeout: float = 300.0,
                     collective_timeout: timedelta = COLLECTIVE_TIMEOUT) -> None:
    """The env:// rendezvous (`rendezvous`, bounded by `rendezvous_timeout` seconds), then
    deepspeed.init_distributed, every group bounded by `collective_timeout` (bound_collectives),
    then the /dev/shm name of this rank's DeepSpeed CPU all-reduce buffer removed.

    DeepSpeed's CPU comm op (ops/csrc/cpu/comm/shm.cpp) gives each rank of a one-node launch
    (LOCAL_SIZE = world size) a 66 MB `/dev/shm/deepspeed_allreduce_buffer_<uid>_<addr>_<port>_<rank>`
    that every rank maps during init and nothing removes: launches with new ports fill /dev/shm
    until ranks are OOM-killed. Once all ranks are past init (the barrier) each has mapped every
    buffer, so the names can go; the memory stays while the ranks map it and is freed at exit."""
    import deepspeed

    say_before_the_ops_build()
    # under torchrun its agent has gathered the workers already and hosts the store they join
    if not dist.is_initialized() and all(name in os.environ for name in ENV_RENDEZVOUS) \
            and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        rendezvous(dist_backend or backend(), rendezvous_timeout, collective_timeout)
    if backend() == "gloo" and os.environ.get("LOCAL_SIZE", "-") == os.environ.get("WORLD_SIZE"):  # DeepSpeed's test
        if local_rank() == 0 and (removed := clear_left_over_buffers()):
            print(f"warning: {removed}", file=sys.stderr, flush=True)
        if dist.is_initialized():
            dist.barrier()  # removed before any rank counts the free space
        found = [shm_problem(int(os.environ["LOCAL_SIZE"]))]
        if dist.is_initialized():  # one answer for all: a rank whose write would fit still waits for the others'
            problems = [None] * dist.get_world_size()
            dist.all_gather_object(problems, found[0])
            found = [next((problem for problem in problems if problem), None)]
        if found[0]:
            raise ConfigError(*found[0])
    quiet_shm_build()  # its CPU comm op's "built successfully", once per rank and start
    deepspeed.init_distributed(dist_backend=dist_backend or backend(), timeout=collective_timeout)  # or wraps it
    bound_collectives(collective_timeout)
    if dist.get_backend() == "nccl" or os.environ.get("LOCAL_SIZE") != str(dist.get_world_size()):
        return
    dist.barrier()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(f"{SHM_DIR}/{_launch_buffers()}{dist.get_rank()}")


def say_before_the_ops_build() -> None:
    """On each node's first rank, before DeepSpeed's ops build during its init (or wait for ever on the lock of a
    build that was killed): the left-over JIT build locks named or removed (jit_locks), and on the first rank the
    note of the CPU all-reduce op's build. Here, so that every start of a process group says it: the trainer's and
    a benchmark's (run_on_ranks, whose ranks waited in silence on a lock an interrupted first run left)."""
    if local_rank() != 0:
        return
    for line in jit_locks.clear_left_over():
        print(line, file=sys.stderr, flush=True)
    if launcher_rank() == 0 and (line := shm_build_note()):
        print(line, flush=True)


ENV_RENDEZVOUS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
SHM_DIR = "/dev/shm"
SHM_BUFFER = "deepspeed_allreduce_buffer_"  # then uid_addr_port_rank
SHM_WORKSPACE = 2 * 2**20 + 2 * 32 * 2**20 + 8  # DeepSpeed's struct allreduce_workspace (shm.cpp): one per rank


def _launch_buffers() -> str:
    """The name of this launch's all-reduce buffers in SHM_DIR, but their rank (shm.cpp's shm_initialize)."""
    return f"{SHM_BUFFER}{os.getuid()}_{os.environ.get('MASTER_ADDR', '')}_{os.environ.get('MASTER_PORT', '')}_"


def shm_problem(local_ranks: int) -> tuple[str, str] | None:
    """(problem, fix) when SHM_DIR cannot take DeepSpeed's CPU all-reduce buffers of this node's ranks. Each
    rank write()s its SHM_WORKSPACE there; a write that finds no space at all returns -1, which DeepSpeed maps
    as a size, and the rank dies by SIGSEGV in init (Docker's default --shm-size is 64 MB: a 2-rank run crashed
    about half the time, naming no cause). Buffers of this launch's name already there are rewritten in place."""
    try:
        stats = os.statvfs(SHM_DIR)
        entries = [entry for entry in os.scandir(SHM_DIR) if entry.name.startswith(SHM_BUFFER)]
    except OSError:
        return None  # no /dev/shm: DeepSpeed's op says so itself
    mine = _launch_buffers()
    held = sum(min(_allocated(entry), SHM_WORKSPACE) for entry in entries if entry.name.startswith(mine))
    free = stats.f_bavail * stats.f_frsize
    page = stats.f_frsize
    if free + held >= (local_ranks - 1) * -(-SHM_WORKSPACE // page) * page + page:  # whole pages each
        return None
    others = [entry for entry in entries if not entry.name.startswith(mine)]
    size = _megabytes(sum(map(_allocated, others)))
    left = (f"; {len(others)} all-reduce buffers of other jobs (running, or killed in the last "
            f"{BUFFER_STALE_S // 60} min) or users take {size} there ({SHM_DIR}/{SHM_BUFFER}*)" if others else
            "; no buffer of a killed run is left there: running launches (whose buffers have no name once they "
            "started) or other files fill it")
    ranks = f"each of this node's {local_ranks} ranks" if local_ranks > 1 else "this node's one rank"
    fewer = " or start fewer ranks per node" if local_ranks > 1 else ""
    return (f"{SHM_DIR} has {_megabytes(free)} free, but DeepSpeed's CPU all-reduce writes a "
            f"{_megabytes(SHM_WORKSPACE)} buffer there for {ranks}",
            f"give it more (docker run --shm-size={_gigabytes(local_ranks * SHM_WORKSPACE)}g, or a larger "
            f"{SHM_DIR} tmpfs){fewer}{left}")


BUFFER_STALE_S = 600  # an all-reduce buffer still named this long after its creation is a killed run's


def clear_left_over_buffers() -> str | None:
    """Removes this user's all-reduce buffers in SHM_DIR that no process holds open and that are older than
    BUFFER_STALE_S: those of runs killed before their names were removed (init_distributed removes them once
    every rank has mapped them, seconds after their creation; DeepSpeed holds each open from its creation on,
    but a container sharing this /dev/shm shows none of its processes here). -> what was removed, or None."""
    mine = f"{SHM_BUFFER}{os.getuid()}_"
    try:
        entries = [entry for entry in os.scandir(SHM_DIR) if entry.name.startswith(mine)]
    except OSError:
        return None
    if not entries or not os.path.isdir("/proc/self/fd"):
        return None
    held, removed, size = jit_locks.held_open(), [], 0
    for entry in entries:
        with contextlib.suppress(OSError):
            status = entry.stat()
            if (status.st_dev, status.st_ino) not in held and time.time() - status.st_mtime > BUFFER_STALE_S:
                os.unlink(entry.path)
                removed.append(entry.name)
                size += status.st_blocks * 512
    if not removed:
        return None
    return (f"removed {len(removed)} DeepSpeed all-reduce buffer{'s' if len(removed) > 1 else ''} of killed runs "
            f"from {SHM_DIR} ({_megabytes(size)}), which no process held")


def _allocated(entry: os.DirEntry) -> int:
    with contextlib.suppress(OSError):
        return entry.stat().st_blocks * 512
    return 0


def _gigabytes(size: int) -> int:
    """Whole GiB that hold `size` bytes and the rest of a container's shared memory (at least 1)."""
    return max(1, -(-size // 2**30))


def _megabytes(size: int) -> str:
    return f"{size / 2**20:.0f} MiB"


def bound_collectives(timeout: timedelta) -> None:
    """Every wait on another rank takes at most `timeout`, then fails (peers.lost names it): the
    default group's collectives, also of a group made before init_distributed (a test's spawn), the
    store's waits, and the groups made later. Those (parallel/state.py's, DeepSpeed's, the pipeline's)
    are made by new_group with no timeout, which torch reads from its module defaults at the call:
    30 minutes for gloo, 10 for NCCL, whatever the default group's is; so the defaults are set too.
    A test (tests/test_fault_tolerance.py) sees a data-parallel all-reduce end at this bound."""
    c10d = dist.distributed_c10d
    c10d._set_pg_timeout(timeout)
    c10d._get_default_store().set_timeout(timeout)
    c10d.default_pg_timeout = c10d.default_pg_nccl_timeout = timeout


def rendezvous(dist_backend: str, timeout: float, collective_timeout: timedelta = COLLECTIVE_TIMEOUT) -> None:
    """torch.distributed's default process group over a TCPStore at MASTER_ADDR:MASTER_PORT, once all
    WORLD_SIZE ranks have arrived there, or a ConfigError after `timeout` seconds naming how many did.

    torch's own env:// rendezvous waits for missing ranks as long as the process group's collective
    timeout (DeepSpeed's 10 minutes, torch's 30), silently: a node that never started reads as a
    hang. Here the wait is bounded on its own; the store then takes the collective timeout."""

    _rendezvous_begun[0] = True  # an error from here on is the rendezvous' own, not one to post (post_refusal)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    address = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    fix = (f"start every rank of the {world} ({rendezvous_setting('MASTER_ADDR', 'MASTER_PORT')} the same on "
           "every node), check that the address is reachable from every node, or raise --rendezvous-timeout")
    if not launcher_watch.launcher_processes():  # `python pretrain_bert.py` in a shell that kept an old job's exports
        fix += (f"; no launcher started this process: if RANK, WORLD_SIZE={world}, MASTER_ADDR and MASTER_PORT are "
                "left in the environment by another job, unset them to run one process")
    note_rank_0_state(RENDEZVOUS_BEGUN)  # rank 0's launch.py tells the other nodes nothing now (serve_stop_notice)
    deadline = time.monotonic() + timeout
    while rank != 0 and (found := _listening(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                                             deadline)) is not True:
        if found:  # rank 0's node stopped before it opened its store: no wait for the rest of the timeout
            raise ConfigError(f"rank 0's node ({address}) stopped before the rendezvous: {found}",
                              "fix the error that node printed and launch every node again")
        if time.monotonic() >= deadline:  # torch's own retries would print C++ stack traces meanwhile
            raise ConfigError(f"rank {rank} could not reach the rendezvous at {address} (rank 0's) within "
                              f"{timeout:g} s: 0 of {world} ranks known to have arrived; rank 0 may have "
                              f"stopped at start-up on its node (its own error line there) or its launcher "
                              f"ended: look at that node's output first", fix)
        time.sleep(0.2)
    with c10d_log_quieted():  # c10d's retries and failures, with their C++ stack frames: the ConfigError says it
        store = _gathered_store(rank, world, address, timeout, deadline, fix)
    store.set_timeout(collective_timeout)
    options = {"device_id": torch.device("cuda", local_rank())} if dist_backend == "nccl" and world > 1 else {}
    dist.init_process_group(dist_backend, store=store, rank=rank, world_size=world, timeout=collective_timeout,
                            **options)


def _gathered_store(rank: int, world: int, address: str, timeout: float, deadline: float, fix: str):
    """The TCPStore at `address` once all `world` ranks have joined it by `deadline` (rank 0's count), or a
    ConfigError naming how many did."""
    until = min(deadline, time.monotonic() + JOIN_WAIT)
    try:
        store = _joined_store(rank, world, timeout, until)
    except TimeoutError:  # a program that answers no store's handshake: TCPStore's own wait has no end
        waited = JOIN_WAIT if until < deadline else timeout
        raise ConfigError(f"rank {rank} could not join the rendezvous at {address}: the program listening there "
                          f"accepted its connection but did not answer as rank 0's store within {waited:g} s: another "
                          "program holds MASTER_PORT on rank 0's node, whose rank 0 then stopped with its own line "
                          "there", fix) from None
    except (RuntimeError, ValueError) as error:  # DistNetworkError / DistStoreError: the port is not a store
        if "EADDRINUSE" in str(error):  # rank 0's store cannot listen: another run (or program) has the port
            raise master_address.port_in_use_error(address)
        raise ConfigError(f"rank {rank} could not join the rendezvous at {address} "
                          f"({str(error).splitlines()[0][:200]})", fix) from None
    arrived, missing, refused = 0, "", ""
    try:
        store.set(f"{ARRIVED}/{rank}", "1")
        arrived = store.add("megatron/rendezvous", 1)
        if rank == 0:  # rank 0 alone decides, so no rank goes on while another gives up
            while arrived < world and time.monotonic() < deadline and not store.check([REFUSED]):
                time.sleep(0.1)
                arrived = store.add("megatron/rendezvous", 0)
            if arrived < world:
                missing = _missing_ranks(store, world)
                refused = store.get(REFUSED).decode() if store.check([REFUSED]) else ""
            store.set("megatron/rendezvous_verdict", json.dumps([arrived, missing, refused]))
            read_by = time.monotonic() + 5.0  # a store that closes under a rank's read prints C++ stack frames
            while (arrived < world and store.add("megatron/verdict_read", 0) < arrived - 1
                   and time.monotonic() < read_by):
                time.sleep(0.05)
        else:  # rank 0, which started the clock before this rank could connect, gives its count by then
            until = time.monotonic() + timeout + 30  # polled: a stop in start-up is handled between polls
            while not store.check(["megatron/rendezvous_verdict"]):
                if time.monotonic() >= until:
                    raise RuntimeError("rank 0 gave no verdict")
                time.sleep(0.1)
            arrived, missing, refused = json.loads(store.get("megatron/rendezvous_verdict"))
            if arrived < world:  # rank 0 waits for this before its store goes
                store.add("megatron/verdict_read", 1)
    except RuntimeError:  # rank 0 gave up and its store went with it
        arrived = min(arrived, world - 1)
    if refused:  # a rank that stopped at start-up said so: no wait for the rest of the timeout
        raise ConfigError(f"{refused}, so the rendezvous at {address} cannot complete ({arrived} of {world} ranks "
                          "arrived)", "fix that rank's error, above or in its node's output, and launch again")
    if arrived < world:
        missing = f" ({missing} missing)" if missing else ""
        raise ConfigError(f"the rendezvous at {address} timed out after {timeout:g} s: {arrived} of {world} ranks "
                          f"arrived{missing}; the missing ranks may have stopped at start-up on their node (their "
                          "own error line there) or their launcher ended: look at that node's output first", fix)
    return store


JOIN_WAIT = 30.0  # seconds at most for rank 0's store to answer a connection (it takes milliseconds)


def _joined_store(rank: int, world: int, timeout: float, until: float):
    """dist.TCPStore at MASTER_ADDR:MASTER_PORT: rank 0's, listening, or another rank's connection to it; a
    TimeoutError when the connection's handshake is not answered by `until` (time.monotonic()). TCPStore waits
    for that answer without end (seen for 11 minutes: a program that is no store holding the port): the
    connection is made in a daemon thread, left behind then (it holds no lock, the process may exit)."""
    def store():
        return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=rank == 0,
                             timeout=timedelta(seconds=timeout), wait_for_workers=False)

    if rank == 0:
        return store()
    made = []
    joining = threading.Thread(target=lambda: made.append(_outcome(store)), daemon=True)
    joining.start()
    joining.join(max(0.0, until - time.monotonic()))
    if not made:
        raise TimeoutError
    if isinstance(made[0], BaseException):
        raise made[0]
    return made[0]


def _outcome(make):
    """make()'s result, or the exception it raised."""
    try:
        return make()
    except BaseException as error:  # noqa: B036 (handed to the waiting thread, which raises it)
        return error


ARRIVED = "megatron/arrived"  # then /RANK: set by each rank that joined rank 0's store
REFUSED = "megatron/refused"  # what a rank that stopped before the rendezvous posted (post_refusal)
_rendezvous_begun = [False]  # this process has begun its rendezvous (its errors are the rendezvous' own)


def _missing_ranks(store, world: int) -> str:
    """The ranks that have not joined the store, as `rank 3` or `ranks 2-3, 6` (rank 0's verdict names them)."""
    missing = [rank for rank in range(world) if not store.check([f"{ARRIVED}/{rank}"])]
    spans = []
    for rank in missing:
        if spans and spans[-1][1] == rank - 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    text = ", ".join(f"{first}-{last}" if last > first else str(first) for first, last in spans)
    return f"rank{'s' if len(missing) > 1 else ''} {text}" if missing else ""


def post_refusal(line: str, until: float) -> bool:
    """A rank that stopped at start-up before its rendezvous (its flags refused, a file missing on its node) tells
    rank 0's store, if it is up by `until` (time.monotonic()), so that the ranks that arrived end at once with a line
    naming it, not after the whole --rendezvous-timeout with one that blames the rendezvous. Whether it was posted;
    nothing for rank 0 (the store's host), a world of 1, or a rank whose error came from the rendezvous itself."""
    if _rendezvous_begun[0] or not all(name in os.environ for name in ENV_RENDEZVOUS) \
            or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return False
    rank, world, host = launcher_rank(), os.environ["WORLD_SIZE"].strip(), os.environ["MASTER_ADDR"]
    port = os.environ["MASTER_PORT"].strip()
    if rank == 0:  # its launch.py tells the other nodes (launch_env.serve_stop_notice)
        note_rank_0_state(line)
    if rank == 0 or not world.isdigit() or int(world) < 2 or not port.isdigit():
        return False
    while (found := _listening(host, int(port), until)) is not True:
        if found or time.monotonic() >= until:  # found: rank 0's node stopped, no store to post to
            return False
        time.sleep(0.2)
    try:
        with c10d_log_quieted():
            store = dist.TCPStore(host, int(port), int(world), is_master=False,
                                  timeout=timedelta(seconds=max(1.0, until - time.monotonic())),
                                  wait_for_workers=False)
            own = line.split(": error: ", 1)[-1]  # the trainer's prefix: the survivors' line has its own
            store.set(REFUSED, f"rank {rank} on {socket.gethostname()} stopped at start-up, before the rendezvous, "
                               f"with its own error ({own})")
        return True
    except (RuntimeError, ValueError):  # not a store, or it went meanwhile
        return False


def store_host_alive() -> bool:
    """Whether rank 0's store (at MASTER_ADDR:MASTER_PORT) still takes connections: a store call to a
    host that is gone prints C++ stack frames before it raises (a lost rank 0, peers.lost)."""
    if not all(name in os.environ for name in ("MASTER_ADDR", "MASTER_PORT")):
        return True
    return _reachable(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), time.monotonic() + 2.0)


def _listening(host: str, port: int, deadline: float) -> bool | str:
    """True when a connection to host:port opens before `deadline` (one try) and the listener says nothing first,
    as rank 0's store; why rank 0's node stopped when it is that node's launch.py answering with STOP_NOTICE
    (launch_env.serve_stop_notice); False when no connection opens. A rank on rank 0's node (its rank is its local
    rank) reads nothing: that node's launch.py answers the other nodes only, and the read would cost NOTICE_WAIT."""
    try:
        with socket.create_connection((host, port), timeout=max(0.1, min(5.0, deadline - time.monotonic()))) as peer:
            if launcher_rank() == local_rank():
                return True
            peer.settimeout(NOTICE_WAIT)
            said = b""
            with contextlib.suppress(OSError):  # TimeoutError: silent, as a store is
                while not said.endswith(b"\n") and (part := peer.recv(4096)):
                    said += part
    except OSError:
        return False
    if said.startswith(STOP_NOTICE):
        return said[len(STOP_NOTICE):].decode(errors="replace").strip() or "no reason given"
    return True


def _reachable(host: str, port: int, deadline: float) -> bool:
    """Whether a TCP connection to host:port opens before `deadline` (one try)."""
    try:
        with socket.create_connection((host, port), timeout=max(0.1, min(5.0, deadline - time.monotonic()))):
            return True
    except OSError:
        return False


def to_device(batch, device):
    """A BertBatch's tensors (or a host tensor) on `device`. To a GPU they go through pinned (page-locked) host
    memory with non_blocking copies: the copy is queued on the stream and the host goes on
    (the pinned staging buffer is kept alive by torch's caching host allocator until the copy
    has run). A rank's slice of the batch is strided: pinned as it is, the copy would go through
    a pageable contiguous temporary, so a contiguous copy of it is what gets pinned."""
    device = torch.device(device)
    if device.type != "cuda":
        return batch

    def move(tensor):
        return tensor.contiguous().pin_memory().to(device, non_blocking=True)
    return move(batch) if torch.is_tensor(batch) else batch.mapped(move)


TOOLKIT_FIX = ("install the CUDA toolkit torch was built with, or prebuild it: DS_BUILD_FUSED_ADAM=1 pip install "
               "deepspeed")
READABLE_ARCH = re.compile(r"\d+\.\d+(\+PTX)?", re.IGNORECASE)  # what DeepSpeed 0.19.8's JIT build can parse


def cpu_optimizer_build_note(ds_config: dict) -> str | None:
    """The line before deepspeed.initialize JIT-builds the CPU optimizer that ZeRO offload runs (ds_schema's
    cpu_optimizer_op: cpu_adam for DeepSpeedCPUAdam), a minute or so with nothing said meanwhile; None when
    there is none to build: not asked for, prebuilt into DeepSpeed, or built in an extensions folder already."""
    op = cpu_optimizer_op(ds_config)
    if op is None:
        return None
    name, optimizer = op
    if _op_built(name):
        return None
    return (f"note: building DeepSpeed's {name} op for {optimizer} (the offloaded optimizer) into {_build_folder()}: "
            "a minute or more, once")


def shm_build_note() -> str | None:
    """The line before deepspeed.init_distributed JIT-builds its CPU all-reduce op on a machine without CUDA
    (30-90 s on 2 idle cores, minutes under load, with nothing said meanwhile); None when it is built."""
    if backend() != "gloo" or _op_built(SHM_OP):
        return None
    return (f"note: building DeepSpeed's {SHM_OP} op (its CPU all-reduce) into {_build_folder()}: a minute or more, "
            "once; an interrupted build is started again by the next run")


SHM_OP = "deepspeed_shm_comm"  # DeepSpeed's ShareMemCommBuilder.NAME


def _op_built(name: str) -> bool:
    """The JIT op is prebuilt into DeepSpeed or built in an extensions folder already."""
    from deepspeed.git_version_info import installed_ops

    return bool(installed_ops.get(name)) or any((root / name / f"{name}.so").is_file()
                                                for root in jit_locks.extensions_roots())


def _build_folder() -> str:
    return os.environ.get("TORCH_EXTENSIONS_DIR") or "torch's extensions folder"


def fused_adam_problem() -> tuple[str, str] | None:
    """(why DeepSpeed's FusedAdam cannot be had on this CUDA machine, the fix), or None: not prebuilt,
    and no JIT build possible (no nvcc, an nvcc of another CUDA major than torch's, no ninja, an
    arch list DeepSpeed cannot read)."""
    from deepspeed.git_version_info import installed_ops
    from torch.utils import cpp_extension

    if installed_ops.get("fused_adam"):
        return None
    if cpp_extension.CUDA_HOME is None:
        return (f"it is not prebuilt and there is no CUDA toolkit (nvcc) to build it for torch's CUDA "
                f"{torch.version.cuda}"), TOOLKIT_FIX
    nvcc = os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc")
    try:
        output = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as error:
        return f"it is not prebuilt and {nvcc} does not run ({error})", TOOLKIT_FIX
    release = re.search(r"release (\d+)\.(\d+)", output)
    found = f"{release.group(1)}.{release.group(2)}" if release else "of unknown version"
    if not release or release.group(1) != str(torch.version.cuda).split(".")[0]:
        return (f"it is not prebuilt and {nvcc} is CUDA {found}, torch's is {torch.version.cuda} (the JIT build "
                "refuses)"), TOOLKIT_FIX
    if shutil.which("ninja") is None:
        return "it is not prebuilt and ninja, which its JIT build needs, is not installed", "pip install ninja"
    return arch_list_problem()


def arch_list_problem() -> tuple[str, str] | None:
    """(why DeepSpeed's JIT builds cannot read TORCH_CUDA_ARCH_LIST, the fix), or None. DeepSpeed 0.19.8
    sorts its entries as numbers ("9.0", "8.6+PTX"); an architecture-specific one ("9.0a", which CUDA
    images for Hopper set) stops every rank's build with a ValueError (seen on an H200)."""
    value = os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip()
    entries = [entry for entry in value.replace(" ", ";").split(";") if entry]
    unreadable = [entry for entry in entries if not READABLE_ARCH.fullmatch(entry)]
    if not unreadable:
        return None
    stripped = list(dict.fromkeys(re.sub(r"(?<=\d)[a-z]+", "", entry) for entry in entries))  # 9.0a -> 9.0
    fix = (f'set TORCH_CUDA_ARCH_LIST="{";".join(stripped)}"' if all(map(READABLE_ARCH.fullmatch, stripped)) else
           'set TORCH_CUDA_ARCH_LIST to the GPUs\' capabilities as numbers, e.g. "9.0" (H100, H200) or "8.0" (A100)')
    return (f"it is not prebuilt and its JIT build cannot read TORCH_CUDA_ARCH_LIST={value!r} "
            f"({', '.join(unreadable)}: DeepSpeed takes numbers only)"), fix

"""DeepSpeed's noise that says nothing to a user of this trainer, silenced before DeepSpeed loads.

- "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it."
  (logged on every import of DeepSpeed on a machine without CUDA, --help included): on such a
  machine the accelerator is named explicitly (DS_ACCELERATOR=cpu), which is what DeepSpeed
  then picks anyway. A DS_ACCELERATOR the user set is kept.
- torch's FutureWarning that DeepSpeed 0.19.8 calls `all_gather_into_tensor` /
  `_all_gather_base` / `_reduce_scatter_base` (deprecated names it still uses on every ZeRO
  step): filtered by message, other FutureWarnings still show.
- "DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully", printed by every rank (and
  process of a benchmark) on every start, the op being built once and loaded after: that line alone
  (quiet_shm_build); a build that fails still raises, with its compiler output.
- c10d's C++ log of a rendezvous that cannot reach MASTER_ADDR (`[W ... TCPStore.cpp] ... retrying`,
  `[E ... socket.cpp]` and some 30 `frame #N` lines per try) before the trainer's one line about it:
  silenced while the rendezvous runs (c10d_log_quieted), and errors only after it, unless --debug or the user
  set TORCH_CPP_LOG_LEVEL. The rendezvous' final failure is logged at ERROR, like NCCL's watchdog timeouts
  ("Watchdog caught collective operation timeout", "Some NCCL operations have failed or timed out", the
  heartbeat monitor's and desync reports): no start-up level (the variable, read once when torch loads) hides
  the first and shows the others, so the level is FATAL for the rendezvous alone and ERROR from before the
  process group exists; the store's warnings when a rank has gone (WARNING, ~30 stack frames each, before
  the trainer's one line about it) stay hidden.
"""
import ctypes
import importlib
import importlib.util
import os
import re
import sys
import warnings
from contextlib import contextmanager

from megatron.errors import ConfigError

# DeepSpeed 0.19.8's accelerators (DS_ACCELERATOR) that load from a package beside torch, by that package
ACCELERATOR_PACKAGES = {"npu": "torch_npu", "hpu": "habana_frameworks", "mlu": "torch_mlu", "sdaa": "torch_sdaa",
                        "supa": "torch_supa", "klxpu": "torch_xmlir"}
ACCELERATORS = ("cpu", "cuda", "xpu", "mps", *ACCELERATOR_PACKAGES)
C10_LIBRARIES = ("libc10.so", "libc10.dylib", "c10.dll")  # in torch/lib, by platform
C10_ERROR, C10_FATAL = 2, 3  # c10's log levels, TORCH_CPP_LOG_LEVEL's names: INFO 0, WARNING 1, ERROR 2, FATAL 3
DEPRECATED_COLLECTIVES = (r"`torch\.distributed\.(all_gather_into_tensor|_all_gather_base|_reduce_scatter_base|"
                          r"reduce_scatter_tensor)` (is|will be) (deprecated|a private function)")


def quiet_deepspeed(on_the_device: bool = False) -> None:
    """Call before the first `import deepspeed` of a process (imports torch to look for CUDA).
    `on_the_device`: the process trains (or launches ranks that do) on DeepSpeed's accelerator."""
    refuse_missing_accelerator(on_the_device)
    refuse_bad_thread_count()
    if "DS_ACCELERATOR" not in os.environ:
        import torch

        if not (torch.cuda.device_count() > 0 and torch.cuda.is_available()):
            os.environ["DS_ACCELERATOR"] = "cpu"
    warnings.filterwarnings("ignore", message=DEPRECATED_COLLECTIVES, category=FutureWarning)


def refuse_bad_thread_count() -> None:
    """An OMP_NUM_THREADS that OpenMP cannot read (`abc`, `0`, a profile's typo): libgomp printed `Invalid value
    for environment variable OMP_NUM_THREADS` when torch loaded and the run went on with its own count. One
    line before torch loads; a nested list (`4,2`) is OpenMP's and kept."""
    value = os.environ.get("OMP_NUM_THREADS")
    if value is not None and not re.fullmatch(r"\s*[1-9][0-9]*(\s*,\s*[1-9][0-9]*)*\s*", value):
        raise ConfigError(f"OMP_NUM_THREADS={value!r} is not a number of threads OpenMP reads",
                          "unset OMP_NUM_THREADS (torch then uses the CPUs) or set it to a positive integer")


@contextmanager
def c10d_log_quieted():
    """While the body runs (the rendezvous: c10d's connect retries and their failure, with ~30 C++ stack frames
    each, before the trainer's one line), no C++ log line below FATAL is written; after it, errors (NCCL's
    watchdog timeouts and failed collectives) but no warnings (the store's when a rank has gone, with their
    frames, before the trainer's line). Process-wide: no other thread is to log meanwhile (no process group
    exists yet). --debug, or a TORCH_CPP_LOG_LEVEL the user set, keeps torch's level throughout; a torch whose
    libc10 lacks the level's variable (c10_log_level) logs as it is."""
    level = None if "--debug" in sys.argv[1:] or "TORCH_CPP_LOG_LEVEL" in os.environ else c10_log_level()
    if level is None:
        yield
        return
    kept, level.value = level.value, C10_FATAL
    try:
        yield
    finally:
        level.value = max(kept, C10_ERROR)


def c10_log_level() -> ctypes.c_int | None:
    """c10's lowest C++ log level written, as a variable to change, or None where torch's libc10 does not export
    it. TORCH_CPP_LOG_LEVEL sets it when torch loads, and torch has no Python call to change it after
    (torch._logging sets the levels of Python loggers); c10's logger (pip builds) and c10d's (every build:
    logging.cpp's isLogLevelEnabled) read FLAGS_caffe2_log_level at each line."""
    import torch

    folder = os.path.join(os.path.dirname(torch.__file__), "lib")
    for path in [*loaded_c10(), *(os.path.join(folder, name) for name in C10_LIBRARIES)]:
        if os.path.isfile(path):
            try:
                return ctypes.c_int.in_dll(ctypes.CDLL(path), "FLAGS_caffe2_log_level")
            except (OSError, ValueError):  # not loadable here, or the variable is not exported
                return None
    return None


def loaded_c10() -> list:
    """The libc10 this process has loaded (Linux: /proc/self/maps), wherever its build keeps it (conda,
    a distribution's torch: not in torch/lib); [] where it cannot be read."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split(maxsplit=5)[-1].strip() for line in maps if "/libc10." in line}
    except OSError:
        return []
    return sorted(path for path in paths if os.path.basename(path).startswith(C10_LIBRARIES[0]))


def quiet_shm_build() -> None:
    """Drops the line DeepSpeed's comm module prints after loading its CPU comm op (deepspeed/comm/
    torch.py's build_shm_op), through that module's own `print`; its other prints show. Imports DeepSpeed."""
    comm_torch = importlib.import_module("deepspeed.comm.torch")  # not `from deepspeed.comm import torch`: torch itself

    def print_unless_built(*values, **options):
        line = " ".join(map(str, values))
        if not (line.startswith("DeepSpeed ") and line.endswith(" built successfully")):
            print(*values, **options)
    comm_torch.print = print_unless_built


def refuse_missing_accelerator(on_the_device: bool) -> None:
    """A DS_ACCELERATOR the user set (a cluster profile, a GPU job's script) that names a device this
    machine or this torch lacks: one line before any work, not DeepSpeed's traceback (xpu, npu, ... at
    its import; cuda once a rank binds its device, after the data is prepared, or in the deepspeed
    runner). A tool that only reads weights on the CPU runs under DS_ACCELERATOR=cuda as it is."""
    name = os.environ.get("DS_ACCELERATOR", "cpu")
    if name == "cpu" or name == "cuda" and not on_the_device:
        return
    if name not in ACCELERATORS:
        raise ConfigError(f"DS_ACCELERATOR={name} is not an accelerator DeepSpeed knows",
                          f"unset DS_ACCELERATOR (or set one of {', '.join(ACCELERATORS)})")
    lacking = _lacking(name)
    if lacking:
        raise ConfigError(f"DS_ACCELERATOR={name} names a device this machine lacks: {lacking}",
                          "unset DS_ACCELERATOR (DeepSpeed then picks what is there) or set it to cpu")


def _lacking(name: str) -> str | None:
    """What this machine lacks for DeepSpeed's accelerator `name`, or None."""
    if name in ACCELERATOR_PACKAGES:
        package = ACCELERATOR_PACKAGES[name]
        return None if importlib.util.find_spec(package) else f"{package} is not installed"
    import torch

    if name == "xpu":
        return None if hasattr(torch, "xpu") and torch.xpu.is_available() else f"torch {torch.__version__} finds no XPU"
    if name == "mps":
        return None if torch.backends.mps.is_available() else f"torch {torch.__version__} finds no MPS device"
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return None
    if torch.version.cuda is None and torch.version.hip is None:
        return f"torch {torch.__version__} is a CPU build"
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    return f"no GPU is visible (CUDA_VISIBLE_DEVICES={hidden!r})" if hidden is not None else "no GPU is visible"


if __name__ == "__main__":  # the launch scripts' check before DeepSpeed's runner: python -m megatron.quiet PROG
    from megatron.errors import run_tool

    sys.exit(run_tool(sys.argv[1], lambda: refuse_missing_accelerator(on_the_device=True)))

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
  TORCH_CPP_LOG_LEVEL=FATAL, read by torch when it loads (quiet_c10d), unless --debug or the user set it.
"""
import importlib
import importlib.util
import os
import re
import sys
import warnings

from megatron.errors import ConfigError

# DeepSpeed 0.19.8's accelerators (DS_ACCELERATOR) that load from a package beside torch, by that package
ACCELERATOR_PACKAGES = {"npu": "torch_npu", "hpu": "habana_frameworks", "mlu": "torch_mlu", "sdaa": "torch_sdaa",
                        "supa": "torch_supa", "klxpu": "torch_xmlir"}
ACCELERATORS = ("cpu", "cuda", "xpu", "mps", *ACCELERATOR_PACKAGES)
DEPRECATED_COLLECTIVES = (r"`torch\.distributed\.(all_gather_into_tensor|_all_gather_base|_reduce_scatter_base|"
                          r"reduce_scatter_tensor)` (is|will be) (deprecated|a private function)")


def quiet_deepspeed(on_the_device: bool = False) -> None:
    """Call before the first `import deepspeed` of a process (imports torch to look for CUDA).
    `on_the_device`: the process trains (or launches ranks that do) on DeepSpeed's accelerator."""
    refuse_missing_accelerator(on_the_device)
    refuse_bad_thread_count()
    quiet_c10d()
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


def quiet_c10d() -> None:
    """Before torch loads: its C++ warnings and errors (c10d's retries with their stack frames) are not
    logged; the Python exception they end in still reaches the trainer, which says it in one line.
    --debug, or a TORCH_CPP_LOG_LEVEL the user set, keeps them."""
    if "--debug" not in sys.argv[1:]:
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")


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

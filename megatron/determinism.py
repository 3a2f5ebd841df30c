"""`--deterministic`: the settings that make a GPU run repeat itself bit for bit.

On CPU a run with the same config, seed and world layout is already bit-exact (docs/resuming.md,
"Reproducibility"); these settings change nothing there. On CUDA they turn off what varies
from run to run: kernels that accumulate with atomics (SDPA's memory-efficient backward,
index_add / scatter_add), cuBLAS' split-K workspaces, TF32 and cuDNN autotuning, and NCCL's
choice of reduction algorithm. They must be set before the first CUDA kernel and before NCCL
creates its communicators, so the run calls `configure` first thing.
"""
import os

import torch


def configure(deterministic: bool) -> None:
    if not deterministic:
        return
    # read by cuBLAS when its handle is created; a fixed workspace per stream removes split-K races
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # read by NCCL when a communicator is created: one algorithm and protocol, one summation order
    os.environ.setdefault("NCCL_ALGO", "Ring")
    os.environ.setdefault("NCCL_PROTO", "Simple")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

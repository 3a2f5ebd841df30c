"""`--deterministic`: the settings that make a GPU run repeat itself bit for bit; and the seed of each
rank's dropout stream (seed_dropout).

On CPU a run with the same config, seed and world layout is already bit-exact (docs/resuming.md,
"Reproducibility"); these settings change nothing there. On CUDA they turn off what varies
from run to run: kernels that accumulate with atomics (SDPA's memory-efficient backward,
index_add / scatter_add), cuBLAS' split-K workspaces, TF32 and cuDNN autotuning, and NCCL's
choice of reduction algorithm. They must be set before the first CUDA kernel and before NCCL
creates its communicators, so the run calls `configure` first thing.
"""
import os

import torch

from megatron.parallel import state


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


def dropout_seed(seed: int) -> int:
    """This rank's dropout seed: Megatron's `seed + 100 * pipeline rank`, counted over the pipeline x
    sequence coordinates. A sequence-parallel rank holds other tokens (ring, hybrid) or other heads (Ulysses)
    of the same samples: with one seed the ranks drew the same masks for them (tokens j and j + s/P dropped
    together), which no single-process run does. Data-parallel ranks keep one seed, as in Megatron (their
    samples differ). The first coordinate's stream is `seed`'s, in every layout."""
    coordinate = state.get_pipe_parallel_rank() * state.get_sequence_parallel_world_size()
    return seed + 100 * (coordinate + state.get_sequence_parallel_rank())


def seed_dropout(seed: int) -> None:
    """Seeds the RNG the model's dropout draws from (torch's default generators, CPU and CUDA), once the
    model is built (its weights come from keyed generators, model/init.py, not from this stream)."""
    torch.manual_seed(dropout_seed(seed))

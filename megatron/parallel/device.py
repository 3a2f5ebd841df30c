"""Which device a rank computes on, and how a micro-batch gets there.

Under the deepspeed launcher (`deepspeed ...` or, per node, `python -m deepspeed.launcher.launch`,
which the AzureML job runs on every instance) each rank finds its GPU index on the node in the
LOCAL_RANK environment variable (and as --local_rank). `select_device` binds the rank to
cuda:LOCAL_RANK BEFORE torch.distributed starts: NCCL creates its communicators on the current
device, and an unbound rank would put every rank of a node on cuda:0. Without CUDA the rank
stays on the CPU and the backend is gloo; with CUDA it is NCCL (never gloo by default).
"""
import os

import torch


def local_rank() -> int:
    """This rank's index on its node (LOCAL_RANK; 0 for a single process)."""
    return int(os.environ.get("LOCAL_RANK", 0))


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


def to_device(batch, device):
    """A BertBatch's tensors on `device`. To a GPU they go through pinned (page-locked) host
    memory with non_blocking copies: the copy is queued on the stream and the host goes on
    (the pinned staging buffer is kept alive by torch's caching host allocator until the copy
    has run). A rank's slice of the batch is strided, so it is pinned here, after slicing."""
    device = torch.device(device)
    if device.type != "cuda":
        return batch
    return type(batch)(**{name: tensor.pin_memory().to(device, non_blocking=True)
                          for name, tensor in vars(batch).items()})

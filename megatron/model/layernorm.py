"""LayerNorm: apex's fused kernel on CUDA when apex is installed, torch's otherwise.

NVIDIA apex is not on PyPI (the PyPI `apex` is an unrelated package, whose import of
`apex.normalization` fails and so selects the fallback). Both have `weight` and `bias`, so
checkpoints do not depend on which one ran.
"""
import torch
from torch import nn


def layer_norm(hidden_size: int, eps: float) -> nn.Module:
    if torch.cuda.is_available():
        try:
            from apex.normalization import FusedLayerNorm
        except ImportError:
            pass
        else:
            return FusedLayerNorm(hidden_size, eps=eps)
    return nn.LayerNorm(hidden_size, eps=eps)

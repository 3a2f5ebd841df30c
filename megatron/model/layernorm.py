"""LayerNorm / RMSNorm: apex's fused kernels on CUDA when apex is installed, torch's otherwise.

NVIDIA apex is not on PyPI (the PyPI `apex` is an unrelated package, whose import of
`apex.normalization` fails and so selects the fallback). apex and torch name their parameters
alike (`weight`, and `bias` where there is one), so checkpoints do not depend on which one ran.
apex's LayerNorm always has a bias: a LayerNorm without one (ModernBERT's) is torch's.
"""
import importlib

import torch
from torch import nn


def layer_norm(hidden_size: int, eps: float, bias: bool = True, normalization: str = "LayerNorm") -> nn.Module:
    """A norm over the last dim: "LayerNorm" (with or without bias) or "RMSNorm" (a weight only)."""
    fused = "FusedRMSNorm" if normalization == "RMSNorm" else "FusedLayerNorm" if bias else None
    if fused and torch.cuda.is_available():
        try:
            apex_norms = importlib.import_module("apex.normalization")
        except ImportError:
            pass
        else:
            if hasattr(apex_norms, fused):
                return getattr(apex_norms, fused)(hidden_size, eps=eps)
    if normalization == "RMSNorm":
        return nn.RMSNorm(hidden_size, eps=eps)
    return nn.LayerNorm(hidden_size, eps=eps, bias=bias)

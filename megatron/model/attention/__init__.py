"""Attention cores, one file per variant, chosen by name through the registry."""
from megatron.model.attention import bigbird, dense, hybrid, linformer, ring, ulysses  # noqa: F401  (registers the variants)
from megatron.model.attention.registry import VARIANTS, build, check, variant_defaults

__all__ = ["VARIANTS", "build", "check", "variant_defaults"]

"""Attention cores, one file per variant, chosen by name through the registry.

The start-up checks (rules.py: check, ulysses_degree, without_new_head_count) import without torch; the
cores and the registry (VARIANTS, build) are imported on first use, so that resolving a config
(megatron.config, tools/ds_config.py) stays fast.
"""
from megatron.model.attention.rules import RULES, check, ulysses_degree, without_new_head_count

__all__ = ["RULES", "VARIANTS", "build", "check", "ulysses_degree", "without_new_head_count"]


def __getattr__(name: str):
    if name in ("VARIANTS", "build"):
        from megatron.model.attention import bigbird, dense, hybrid, linformer, local, ring, ulysses  # noqa: F401
        from megatron.model.attention import registry

        return getattr(registry, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Attention variants by name, and the start-up checks every variant shares.

A core maps q, k, v `[b, s/P, heads, d]` of this rank's chunk and the chunk's key-padding mask
`[b, s/P]` (True at padding) to the attention output `[b, s/P, heads, d]` over the WHOLE
sequence. The core is the only model code that communicates; it reads the seq group from
megatron.parallel.state when built.
"""
from torch import nn

from megatron.errors import ConfigError
from megatron.parallel import state

VARIANTS: dict = {}


class AttentionCore(nn.Module):
    """Base class: subclasses extend `check` with their own constraints."""

    @classmethod
    def check(cls, config, sequence_parallel_size: int) -> None:
        if config.seq_length % sequence_parallel_size:
            raise ConfigError(
                f"seq_length {config.seq_length} is not divisible by the sequence-parallel size {sequence_parallel_size}",
                "choose --seq-length as a multiple of --sequence-parallel-size")


def register(name: str):
    def decorate(cls):
        VARIANTS[name] = cls
        return cls
    return decorate


def variant(name: str):
    if name not in VARIANTS:
        raise ConfigError(f"unknown attention variant '{name}'", f"choose one of: {', '.join(sorted(VARIANTS))}")
    return VARIANTS[name]


def check(config, sequence_parallel_size: int | None = None) -> None:
    """Start-up validation of config.attention against the SP degree (default: the live one)."""
    size = sequence_parallel_size or state.get_sequence_parallel_world_size()
    variant(config.attention).check(config, size)


def build(config) -> AttentionCore:
    check(config)
    return variant(config.attention)(config)

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

    name = "attention"
    # False where backward recomputes blocks exactly (ring, bigbird): the SDPA kernels take no
    # RNG state, so recomputation cannot replay dropout masks
    supports_attention_dropout = True
    # True where a seq_length that SP does not divide may be padded at the tail to a multiple
    # (BertBatch.sequence_chunk; padding is seen by nothing, so the result is exact); False where
    # the padded length would change the math (linformer's projections span seq_length)
    accepts_tail_padding = True

    @classmethod
    def check(cls, config, sequence_parallel_size: int) -> None:
        if config.seq_length % sequence_parallel_size and not cls.accepts_tail_padding:
            raise ConfigError(
                f"seq_length {config.seq_length} is not divisible by the sequence-parallel size {sequence_parallel_size}"
                f" ({cls.name} cannot pad it: padding would change its result)",
                "choose --seq-length as a multiple of --sequence-parallel-size")
        if config.attention_dropout > 0 and not cls.supports_attention_dropout:
            raise ConfigError(
                f"attention_dropout {config.attention_dropout} is not supported by {cls.name} attention "
                "(its blocks are recomputed exactly in backward)",
                "set attention_dropout to 0 (--attention-dropout 0) or leave it unset")


def register(name: str):
    def decorate(cls):
        cls.name = name
        VARIANTS[name] = cls
        return cls
    return decorate


def variant_defaults(name: str) -> dict:
    """Settings whose default depends on the variant: no attention dropout where it is unsupported."""
    core = VARIANTS.get(name)
    return {"attention_dropout": 0.0} if core is not None and not core.supports_attention_dropout else {}


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

"""Attention cores by name (their start-up checks: rules.py).

A core maps q, k, v `[b, s/P, heads, d]` of this rank's chunk and the chunk's segment ids
`[b, s/P]` (0 at padding; packed samples have several) to the attention output
`[b, s/P, heads, d]` over the WHOLE sequence. The core is the only model code that communicates
inside a layer, through a comm.SeqComm of the seq group it reads from megatron.parallel.state
when built (plus DeepSpeed's all-to-alls in Ulysses and hybrid).
"""
from torch import nn

from megatron.model.attention import rules
from megatron.parallel import state

VARIANTS: dict = {}


class AttentionCore(nn.Module):
    """Base class of the cores; a core's start-up constraints live in rules.py under its name."""

    name = "attention"
    per_layer = False  # True: its math differs per layer, so build passes the layer's index to its constructor


def register(name: str):
    def decorate(cls):
        cls.name = name
        VARIANTS[name] = cls
        return cls
    return decorate


def variant(name: str):
    rules.variant_rules(name)  # an unknown name: one line listing the variants
    return VARIANTS[name]


def check(config, sequence_parallel_size: int | None = None) -> None:
    """Start-up validation of config.attention against the SP degree (default: the live one)."""
    size = sequence_parallel_size or state.get_sequence_parallel_world_size()
    rules.check(config, size)


def build(config, layer_index: int = 0) -> AttentionCore:
    """The core of layer `layer_index`: "local" for the local sliding-window layers, the
    configured variant for the others."""
    check(config)
    if config.is_local_layer(layer_index):
        return VARIANTS["local"](config)
    core = variant(config.attention)
    return core(config, layer_index=layer_index) if core.per_layer else core(config)

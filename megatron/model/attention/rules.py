"""The start-up checks of each attention variant, without torch.

A variant's constraints (SP degree vs heads, blocks, tail padding, dropout) are plain arithmetic on
the config; keeping them apart from the torch modules lets megatron.config resolve and validate
a layout without importing torch, so tools/ds_config.py answers in a fraction of a second. The
cores in this package (registered under the same names) build the attention; these rules decide
whether it can be built.
"""
import re

from megatron.errors import ConfigError, either

NODE_SIZE = 8  # the default Ulysses degree is at most one node of 8 GPUs


def ulysses_degree(ulysses_size: int | None, num_attention_heads: int, sequence_parallel_size: int) -> int:
    """ulysses_size, else the largest divisor of the SP size that divides the heads and is at most
    NODE_SIZE (the all-to-all stays inside a node)."""
    if ulysses_size is not None:
        return ulysses_size
    return max(u for u in range(1, min(NODE_SIZE, max(sequence_parallel_size, 1)) + 1)
               if sequence_parallel_size % u == 0 and num_attention_heads % u == 0)


class Rules:
    """What every variant checks; subclasses add their own constraints."""

    name = "attention"
    # False where backward recomputes blocks exactly (ring, bigbird, hybrid): the SDPA kernels take
    # no RNG state, so recomputation cannot replay dropout masks
    supports_attention_dropout = True
    # True where a seq_length that SP does not divide may be padded at the tail to a multiple
    # (BertBatch.sequence_chunk; padding is seen by nothing, so the result is exact); False where
    # the padded length would change the math (linformer's projections span seq_length)
    accepts_tail_padding = True

    @classmethod
    def check(cls, config, sequence_parallel_size: int) -> None:
        if config.seq_length % sequence_parallel_size and not cls.accepts_tail_padding:
            raise ConfigError(
                f"seq_length {config.seq_length} is not divisible by the sequence-parallel size "
                f"{sequence_parallel_size}"
                f" ({cls.name} cannot pad it: padding would change its result)",
                "choose --seq-length as a multiple of --sequence-parallel-size")
        if config.attention_dropout > 0 and not cls.supports_attention_dropout:
            raise ConfigError(
                f"attention_dropout {config.attention_dropout} is not supported by {cls.name} attention "
                "(its blocks are recomputed exactly in backward)",
                "set attention_dropout to 0 (--attention-dropout 0) or leave it unset")


class Dense(Rules):
    name = "dense"

    @classmethod
    def check(cls, config, sequence_parallel_size):
        super().check(config, sequence_parallel_size)
        if sequence_parallel_size > 1:
            raise ConfigError(
                f"attention 'dense' sees only the local chunk but the sequence-parallel size is "
                f"{sequence_parallel_size}",
                "use attention 'ring' or 'ulysses' with sequence parallelism")


class Ring(Rules):
    name = "ring"
    supports_attention_dropout = False


def ulysses_ways_out(heads: int, sequence_parallel_size: int) -> str:
    """The fixes of a head count Ulysses cannot split, those that keep the model first: the heads of
    weights a run starts from or resumes (--init-from-hf, --load) are fixed, so a new head count comes
    last, for a run from scratch. Hybrid is named only where its own Ulysses degree is above 1 (1: a ring)."""
    ways = ["--attention ring"]
    hybrid = ulysses_degree(None, heads, sequence_parallel_size)
    if hybrid > 1:
        ways.append(f"--attention hybrid --ulysses-size {hybrid} (Ulysses inside groups of {hybrid} ranks, a divisor "
                    "of the heads and the size, a ring across them)")
    sizes = [size for size in range(2, heads + 1) if heads % size == 0]
    if len(sizes) > 1:
        ways.append(f"a --sequence-parallel-size that divides the {heads} heads ({either(sizes)}) and the ranks")
    elif sizes:  # the head count itself ('divides the 3 heads (3)')
        ways.append(f"--sequence-parallel-size {heads} (the {heads} heads' only divisor) on a multiple of {heads} "
                    "ranks")
    ways.append(f"{NEW_HEAD_COUNT}{sequence_parallel_size}")
    return "use " + ", or ".join(ways)


NEW_HEAD_COUNT = "for a model from scratch, a head count that is a multiple of "  # ulysses_ways_out's last way


def without_new_head_count(fix: str) -> str:
    """A fix of ulysses_ways_out for a run whose weights fix the head count (it starts from them or resumes
    them): its other ways, not a new head count."""
    return re.sub(rf", or {re.escape(NEW_HEAD_COUNT)}\d+$", "", fix)


class Ulysses(Rules):
    name = "ulysses"

    @classmethod
    def check(cls, config, sequence_parallel_size):
        super().check(config, sequence_parallel_size)
        if config.num_attention_heads % sequence_parallel_size:
            raise ConfigError(
                f"ulysses needs num_attention_heads ({config.num_attention_heads}) divisible by the "
                f"sequence-parallel size ({sequence_parallel_size})",
                ulysses_ways_out(config.num_attention_heads, sequence_parallel_size))


class Hybrid(Rules):
    name = "hybrid"
    supports_attention_dropout = False  # the ring recomputes its blocks in backward

    @classmethod
    def check(cls, config, sequence_parallel_size):
        super().check(config, sequence_parallel_size)
        if sequence_parallel_size == 1:
            return
        heads = config.num_attention_heads
        ulysses = ulysses_degree(config.ulysses_size, heads, sequence_parallel_size)
        if ulysses < 1 or sequence_parallel_size % ulysses:
            raise ConfigError(f"ulysses_size {ulysses} does not divide the sequence-parallel size "
                              f"{sequence_parallel_size}", "set ulysses_size (--ulysses-size) to a divisor of size")
        if heads % ulysses:
            raise ConfigError(f"hybrid needs num_attention_heads ({heads}) divisible by ulysses_size ({ulysses})",
                              "set ulysses_size (--ulysses-size) to a divisor of the head count")


class Linformer(Rules):
    name = "linformer"
    accepts_tail_padding = False  # E and F span seq_length: padding would change the projections

    @classmethod
    def check(cls, config, sequence_parallel_size):
        super().check(config, sequence_parallel_size)
        if config.linformer_k > config.seq_length:
            raise ConfigError(f"linformer_k {config.linformer_k} exceeds seq_length {config.seq_length}",
                              "choose --linformer-k at most --seq-length")


class BigBird(Rules):
    name = "bigbird"
    supports_attention_dropout = False

    @classmethod
    def check(cls, config, sequence_parallel_size):
        super().check(config, sequence_parallel_size)
        block, window, num_random = (config.bigbird_block_size, config.bigbird_num_window_blocks,
                                     config.bigbird_num_random_blocks)
        if config.seq_length % (sequence_parallel_size * block):
            raise ConfigError(
                f"seq_length {config.seq_length} is not divisible by bigbird block size {block} x "
                f"sequence-parallel size {sequence_parallel_size}",
                f"choose --seq-length as a multiple of {sequence_parallel_size * block} or another --block-size")
        num_blocks = config.seq_length // block
        if num_blocks < window + 2 + num_random:
            raise ConfigError(
                f"bigbird needs at least {window + 2 + num_random} blocks (window {window} + 2 global + "
                f"{num_random} random) but seq_length {config.seq_length} / block size {block} gives {num_blocks}",
                "lower --block-size, --bigbird-num-window-blocks or --bigbird-num-random-blocks, or raise "
                "--seq-length")
        if num_blocks // sequence_parallel_size < window // 2:
            raise ConfigError(
                f"bigbird window {window} reaches {window // 2} blocks to each side but each of the "
                f"{sequence_parallel_size} sequence-parallel ranks holds {num_blocks // sequence_parallel_size}",
                "use a smaller --block-size or window, or fewer sequence-parallel ranks")


RULES = {rules.name: rules for rules in (Dense, Ring, Ulysses, Hybrid, Linformer, BigBird)}


def variant_rules(name: str) -> type:
    if name not in RULES:
        raise ConfigError(f"unknown attention variant '{name}'", f"choose one of: {', '.join(sorted(RULES))}")
    return RULES[name]


def refuse_local_layers(variant: str, layers_of: str | None = None) -> None:
    """Linformer and BigBird have no local layers: their global layers would change the math of a
    windowed model. `layers_of`: the weights whose layer rule makes the local layers (a run starting
    from them), which no flag can drop: a global-layer variant is then the one fix."""
    if variant in ("linformer", "bigbird"):
        layers = f"the local sliding-window layers of {layers_of}" if layers_of else "local sliding-window layers"
        raise ConfigError(f"{variant} attention cannot be combined with {layers} (its global layers would change the "
                          "math of a windowed model)", "use attention dense, ring, ulysses or hybrid for the global "
                          f"layers{'' if layers_of else ', or drop --local-attention-window'}")


def check(config, sequence_parallel_size: int) -> None:
    """Start-up validation of local layers, then of config.attention against the SP degree (a variant
    that cannot have local layers at all is named before its own limits)."""
    local = config.has_local_layers
    if local:
        refuse_local_layers(config.attention)
    variant_rules(config.attention).check(config, sequence_parallel_size)
    if local and config.attention_dropout > 0:
        raise ConfigError(f"attention_dropout {config.attention_dropout} is not supported with local layers "
                          "(their tiles are recomputed exactly in backward)", "set --attention-dropout 0")

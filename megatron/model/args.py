"""The model's configuration (BertConfig), without torch: megatron.config resolves and checks it,
and tools/ds_config.py does the same in a fraction of a second. bert.py builds the model from it.

The defaults are Megatron BERT (learned positions, GELU MLP, biases, LayerNorm). The modern layer
options are fields too, chosen per layer index by a rule (`is_local_layer`), never by subclasses;
MODEL_PRESETS sets them all at once (--model-preset modernbert-base)."""
import dataclasses
import math
import struct
from dataclasses import dataclass

from megatron.errors import ConfigError
from megatron.model.attention.rules import RULES
from megatron.model.fields import Role, flag_of, info, meta

ROPE_THETA_FLOOR = 1  # a rope theta must exceed it (angles that fall with the frequency index); config.py's rule too
# ... and be at most float32's largest value: bert.rotary_cos_sin computes base ** (2i / d) in fp32, where a larger
# base is inf and every pair but the first gets inv_freq 0 (no position); below it, base ** (2i / d) <= base is finite
FLOAT32_MAX = struct.unpack("<f", struct.pack("<I", 0x7F7FFFFF))[0]
ROPE_THETA_CEILING = FLOAT32_MAX


SIZE, MATH, WEIGHTLESS, VISIBILITY, REGIME, RUN = Role


def check_bounded(name: str, value) -> None:
    """A value of field `name` within its bounds (Field.above, Field.at_most): a number, finite, above
    the one and at most the other; the line names the field's flag."""
    facts = info(name)
    flag, floor, ceiling = facts.flag, facts.above, facts.at_most
    example = BertConfig.__dataclass_fields__[name].default
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and value > floor):
        raise ConfigError(f"{name} = {value} is not a finite number > {floor}", f"pass {flag} above {floor}, "
                          f"e.g. {example}")
    if ceiling is not None and value > ceiling:
        raise ConfigError(f"{name} = {value:g} overflows float32, in which the model computes with it (at most "
                          f"{ceiling:.7g})", f"pass {flag} between {floor} and {ceiling:.2g}, e.g. {example}")


def check_window(window) -> None:
    """A local attention window (None: none) is an even integer >= 2: W / 2 keys on each side of a query."""
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 2 or window % 2):
        raise ConfigError(f"local_attention_window = {window} is not an even integer >= 2 (W / 2 keys on each "
                          "side of a query)", "set --local-attention-window to an even window, e.g. 128")


@dataclass
class BertConfig:
    # the facts of each field (megatron/model/fields.py): its roles, flag, JSON key, bounds, and the order in
    # which a resume compares it (resume_order)
    vocab_size: int = meta(30522, roles=SIZE, flag="--vocab-size", positive=True, resume_order=5)
    hidden_size: int = meta(768, roles=SIZE, flag="--hidden-size", positive=True, resume_order=2)
    num_layers: int = meta(12, roles=SIZE, flag="--num-layers", positive=True, resume_order=1)
    num_attention_heads: int = meta(12, roles=MATH, flag="--num-attention-heads", positive=True, resume_order=6)
    ffn_hidden_size: int | None = meta(None, roles=SIZE, flag="--ffn-hidden-size", positive=True,
                                       resume_order=3)  # default 4 * hidden_size
    seq_length: int = meta(512, roles=RUN, flag="--seq-length", positive=True)
    # a table's rows (learned positions) or the trained length (rope); a resume checks the table's shape
    max_position_embeddings: int = meta(512, roles=SIZE, flag="--max-position-embeddings", positive=True,
                                        adjustable_start=True)
    # packed samples (--pack-samples): the longest segment, whose positions must fit the table;
    # None: unpacked, one segment of up to seq_length tokens
    max_segment_length: int | None = meta(None, roles=RUN, flag="--max-segment-length", json="max_segment_length")
    # 0: no token-type table (ModernBERT); the batch's token types are then unread; a resume checks its shape
    type_vocab_size: int = meta(2, roles=SIZE, flag="--type-vocab-size")
    hidden_dropout: float = meta(0.1, roles=REGIME, flag="--hidden-dropout")
    # None: Megatron's 0.1, but 0 where it is refused: local layers and the variants whose blocks are
    # recomputed exactly in backward (ring, hybrid, bigbird: attention/rules.py)
    attention_dropout: float | None = meta(None, roles=REGIME, flag="--attention-dropout")
    layernorm_epsilon: float = meta(1e-5, roles=MATH, flag="--layernorm-epsilon", above=0, resume_order=7)
    init_method_std: float = meta(0.02, roles=REGIME, flag="--init-method-std", above=0)
    # the padding's rows no token reaches; a resume checks the table's shape
    make_vocab_size_divisible_by: int = meta(128, roles=SIZE, flag="--make-vocab-size-divisible-by", positive=True,
                                             adjustable_start=True)
    # "pre": Megatron's x + f(LN(x)) with a final LayerNorm; "post": original BERT's LN(x + f(x)).
    layernorm_layout: str = meta("pre", roles=SIZE, flag="--layernorm-layout", resume_order=8)
    # a LayerNorm after the embeddings; None: the layout's own (post: yes, as HF Bert; pre: no, as
    # Megatron and HF MegatronBert), so that the defaults export to Hugging Face
    embedding_layernorm: bool | None = meta(None, roles=SIZE, on_flag="--embedding-layernorm",
                                            off_flag="--no-embedding-layernorm", resume_order=17)
    add_binary_head: bool = meta(True, roles=SIZE, off_flag="--bert-no-binary-head", adjustable_start=True,
                                 resume_order=16)
    # positions: "learned" (a table of max_position_embeddings rows) or "rope" (rotary: q and k of every
    # layer rotated by angles position * base^(-2i/d) from the batch's position_ids; no table)
    position_embedding_type: str = meta("learned", roles=SIZE, flag="--position-embedding-type", resume_order=4)
    # rope theta of the global layers (ModernBERT 160000)
    rotary_base: float = meta(10000.0, roles=WEIGHTLESS, flag="--rotary-base", above=ROPE_THETA_FLOOR,
                              at_most=ROPE_THETA_CEILING,
                              adjustable_start=True, resume_order=11, said_as="global rope theta")
    # rope theta of the local (sliding-window) layers (ModernBERT 10000)
    local_rotary_base: float = meta(10000.0, roles=WEIGHTLESS, flag="--local-rotary-base", above=ROPE_THETA_FLOOR,
                                    at_most=ROPE_THETA_CEILING,
                                    adjustable_start=True, resume_order=12, said_as="local rope theta")
    # local layers: key j visible from query i iff |i - j| <= window // 2, within the same segment
    # (ModernBERT 128: 64 keys each side); None: every layer global
    local_attention_window: int | None = meta(None, roles={WEIGHTLESS, VISIBILITY}, flag="--local-attention-window",
                                              adjustable_start=True, resume_order=13, said_as="local attention window")
    # layer i is global when i % this == 0 (ModernBERT 3); 1: all global
    global_attention_every: int = meta(1, roles=VISIBILITY, flag="--global-attention-every", resume_order=14)
    # "gelu": h -> ffn -> h; gated "geglu" / "swiglu": h -> 2 ffn, act(first half) * second half, ffn -> h
    mlp_type: str = meta("gelu", roles=SIZE, flag="--mlp-type", resume_order=10)
    # biases of every Linear in the layers and heads (not the decoder's) and the norms
    add_bias_linear: bool = meta(True, roles=SIZE, on_flag="--add-bias-linear", off_flag="--disable-bias-linear",
                                 resume_order=15)
    # "LayerNorm" or "RMSNorm", for every norm of the model
    normalization: str = meta("LayerNorm", roles=SIZE, flag="--normalization", resume_order=9)
    # False: layer 0 has no norm before its attention (ModernBERT)
    first_layer_attention_norm: bool = meta(True, roles=SIZE, on_flag="--first-layer-attention-norm",
                                            off_flag="--no-first-layer-attention-norm", resume_order=18)
    attention: str = meta("dense", roles=RUN, flag="--attention", json="attention")  # a name in the attention registry
    # linformer: keys and values projected from s to k rows (E, F: [heads or 1, k, s])
    linformer_k: int = meta(256, roles=SIZE, flag="--linformer-k", json="linformer.k", variant="linformer",
                            positive=True, resume_order=19)
    # one E (and F) for all heads of a layer
    linformer_share_heads: bool = meta(False, roles=SIZE, on_flag="--linformer-share-heads",
                                       json="linformer.share_heads", variant="linformer", resume_order=20)
    linformer_share_kv: bool = meta(False, roles=SIZE, on_flag="--linformer-share-kv", json="linformer.share_kv",
                                    variant="linformer", resume_order=21)  # F = E
    # bigbird: per query block, a window of blocks, the first and last (global) blocks, random blocks
    bigbird_block_size: int = meta(64, roles=VISIBILITY, flag="--block-size", dest="block_size",
                                   json="bigbird.block_size", variant="bigbird", positive=True)
    # odd: the block and (w - 1) / 2 neighbours on each side
    bigbird_num_window_blocks: int = meta(3, roles=VISIBILITY, flag="--bigbird-num-window-blocks",
                                          json="bigbird.num_window_blocks", variant="bigbird", positive=True)
    bigbird_num_random_blocks: int = meta(2, roles=VISIBILITY, flag="--bigbird-num-random-blocks",
                                          json="bigbird.num_random_blocks", variant="bigbird")
    # with the iteration and the layer, fixes the random blocks (drawn anew every step: a resume may change it)
    bigbird_seed: int = meta(0, roles=RUN, variant="bigbird")
    # hybrid: seq ranks per Ulysses (all-to-all) group; the ring spans size / ulysses_size groups
    # (None: the largest divisor of the SP size and the heads, at most 8)
    ulysses_size: int | None = meta(None, roles=RUN, flag="--ulysses-size", json="ulysses_size", variant="hybrid")

    def __post_init__(self):
        if self.embedding_layernorm is None:
            self.embedding_layernorm = self.layernorm_layout == "post"
        if self.ffn_hidden_size is None:
            self.ffn_hidden_size = 4 * self.hidden_size
        for name in (field.name for field in dataclasses.fields(self) if field.metadata["facts"].positive):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} = {getattr(self, name)} must be positive",
                                  f"set {flag_of(name)} to an integer >= 1")
        if self.type_vocab_size < 0:
            raise ConfigError(f"type_vocab_size = {self.type_vocab_size} is negative",
                              "set --type-vocab-size to 0 (no token types) or more")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"hidden_size {self.hidden_size} is not divisible by num_attention_heads {self.num_attention_heads}",
                "choose a head count that divides the hidden size")
        self._check_layer_options()
        if self.attention_dropout is None:
            rules = RULES.get(self.attention)  # an unknown name is refused by attention.check
            refused = self.has_local_layers or (rules is not None and not rules.supports_attention_dropout)
            self.attention_dropout = 0.0 if refused else 0.1
        learned = self.position_embedding_type == "learned"  # only a table bounds the positions
        if learned and self.max_segment_length is None and self.seq_length > self.max_position_embeddings:
            raise ConfigError(
                f"seq_length {self.seq_length} exceeds max_position_embeddings {self.max_position_embeddings}",
                "raise --max-position-embeddings or lower --seq-length (or pack samples: --pack-samples)")
        if self.max_segment_length is not None:  # positions restart per segment: only a segment must fit
            segment = self.max_segment_length
            if segment < 5:
                raise ConfigError(f"max_segment_length {segment} leaves no room for [CLS] A [SEP] B [SEP]",
                                  "set --max-segment-length to 5 or more")
            if segment > self.seq_length:
                raise ConfigError(f"max_segment_length {segment} exceeds seq_length {self.seq_length}",
                                  "lower --max-segment-length to at most --seq-length")
            if learned and segment > self.max_position_embeddings:
                raise ConfigError(
                    f"max_segment_length {segment} exceeds max_position_embeddings {self.max_position_embeddings}",
                    "lower --max-segment-length or raise --max-position-embeddings")
        if self.bigbird_num_window_blocks % 2 == 0:
            raise ConfigError(f"bigbird_num_window_blocks = {self.bigbird_num_window_blocks} is even",
                              "use an odd window (the block and the same number of neighbours on each side)")
        if self.bigbird_num_random_blocks < 0:
            raise ConfigError(f"bigbird_num_random_blocks = {self.bigbird_num_random_blocks} is negative",
                              "set --bigbird-num-random-blocks to 0 or more")
        if self.layernorm_layout not in ("pre", "post"):
            raise ConfigError(f"layernorm_layout '{self.layernorm_layout}' is unknown",
                              "use 'pre' (Megatron) or 'post' (BERT)")
        for name in ("hidden_dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"{name} = {getattr(self, name)} is outside [0, 1)",
                                  f"set {flag_of(name)} between 0 and 1")

    def _check_layer_options(self) -> None:
        choices = {"position_embedding_type": ("learned", "rope"), "mlp_type": ("gelu", "geglu", "swiglu"),
                   "normalization": ("LayerNorm", "RMSNorm")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                flag = flag_of(name)
                raise ConfigError(f"{name} '{getattr(self, name)}' is unknown",
                                  f"set {flag} to one of {', '.join(allowed)}")
        if self.position_embedding_type == "rope":
            if self.head_dim % 2:
                raise ConfigError(f"rope needs an even head dim, hidden_size {self.hidden_size} / "
                                  f"num_attention_heads {self.num_attention_heads} = {self.head_dim}",
                                  "choose a head count that gives an even head dim, or "
                                  "--position-embedding-type learned")
            for name in ("rotary_base", "local_rotary_base"):
                check_bounded(name, getattr(self, name))
        check_window(self.local_attention_window)
        if self.global_attention_every < 1:
            raise ConfigError(f"global_attention_every = {self.global_attention_every} must be >= 1",
                              "set --global-attention-every N (layer i is global when i % N == 0; 1: all global)")
        if not self.first_layer_attention_norm and self.layernorm_layout != "pre":
            raise ConfigError("first_layer_attention_norm false needs layernorm_layout 'pre' (a post-LN layer 0 "
                              "would leave its attention output unnormalised)",
                              "use --layernorm-layout pre or drop --no-first-layer-attention-norm")

    def is_local_layer(self, index: int) -> bool:
        """Layer `index` attends to a sliding window (local) rather than the whole sequence (global)."""
        return self.local_attention_window is not None and index % self.global_attention_every != 0

    @property
    def has_local_layers(self) -> bool:
        """Some layer is local: a window alone is not enough (--global-attention-every 1, or a model of
        one layer, leaves every layer global)."""
        return any(self.is_local_layer(index) for index in range(self.num_layers))

    def layer_rotary_base(self, index: int) -> float:
        """The rope theta of layer `index`: local layers have their own (ModernBERT: 10000 vs 160000)."""
        return self.local_rotary_base if self.is_local_layer(index) else self.rotary_base

    @property
    def padded_vocab_size(self) -> int:
        """Vocab rounded up so the decoder GEMM has friendly shapes; extra rows are never labels."""
        multiple = self.make_vocab_size_divisible_by
        return math.ceil(self.vocab_size / multiple) * multiple

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


# --model-preset (or the JSON's sequence_parallel.model_preset): BertConfig fields, each overridable
# by its own flag. ModernBERT (answerdotai, Hugging Face ModernBertConfig): rope with theta 160000
# (global) / 10000 (local), a local window of 128 with a global layer every 3rd (i % 3 == 0), GeGLU,
# no biases (norms included), LayerNorm eps 1e-5, a norm after the embeddings, pre-LN with a final
# norm, no attention norm in layer 0, no token types, no sentence-order head, no dropout, the vocab
# padded to a multiple of 64. The vocab size is not the architecture's: it is the run's vocab file's
# (or --vocab-size, or the weights it starts from), as ModernBERT's 50368 is its tokenizer's, padded.
_MODERNBERT = dict(make_vocab_size_divisible_by=64, max_position_embeddings=8192,
                   position_embedding_type="rope", rotary_base=160000.0, local_rotary_base=10000.0,
                   local_attention_window=128, global_attention_every=3, mlp_type="geglu", add_bias_linear=False,
                   normalization="LayerNorm", layernorm_epsilon=1e-5, layernorm_layout="pre",
                   embedding_layernorm=True, first_layer_attention_norm=False, type_vocab_size=0,
                   add_binary_head=False, hidden_dropout=0.0, attention_dropout=0.0, init_method_std=0.02)
MODEL_PRESETS = {
    "modernbert-base": dict(_MODERNBERT, num_layers=22, hidden_size=768, num_attention_heads=12, ffn_hidden_size=1152),
    "modernbert-large": dict(_MODERNBERT, num_layers=28, hidden_size=1024, num_attention_heads=16,
                             ffn_hidden_size=2624),
}


def preset_fields(name: str | None) -> dict:
    """The BertConfig fields of preset `name` ({} for None)."""
    if name is None:
        return {}
    if name not in MODEL_PRESETS:
        raise ConfigError(f"model preset '{name}' is unknown", f"use one of {', '.join(MODEL_PRESETS)}")
    return dict(MODEL_PRESETS[name])

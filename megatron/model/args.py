"""The model's configuration (BertConfig), without torch: megatron.config resolves and checks it,
and tools/ds_config.py does the same in a fraction of a second. bert.py builds the model from it."""
import math
from dataclasses import dataclass

from megatron.errors import ConfigError


@dataclass
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 768
    num_layers: int = 12
    num_attention_heads: int = 12
    ffn_hidden_size: int | None = None  # default 4 * hidden_size
    seq_length: int = 512
    max_position_embeddings: int = 512
    # packed samples (--pack-samples): the longest segment, whose positions must fit the table;
    # None: unpacked, one segment of up to seq_length tokens
    max_segment_length: int | None = None
    type_vocab_size: int = 2
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    layernorm_epsilon: float = 1e-5
    init_method_std: float = 0.02
    make_vocab_size_divisible_by: int = 128
    # "pre": Megatron's x + f(LN(x)) with a final LayerNorm; "post": original BERT's LN(x + f(x)).
    layernorm_layout: str = "pre"
    # a LayerNorm after the embeddings; None: the layout's own (post: yes, as HF Bert; pre: no, as
    # Megatron and HF MegatronBert), so that the defaults export to Hugging Face
    embedding_layernorm: bool | None = None
    add_binary_head: bool = True
    attention: str = "dense"  # a name in the attention registry
    # linformer: keys and values projected from s to k rows (E, F: [heads or 1, k, s])
    linformer_k: int = 256
    linformer_share_heads: bool = False  # one E (and F) for all heads of a layer
    linformer_share_kv: bool = False  # F = E
    # bigbird: per query block, a window of blocks, the first and last (global) blocks, random blocks
    bigbird_block_size: int = 64
    bigbird_num_window_blocks: int = 3  # odd: the block and (w - 1) / 2 neighbours on each side
    bigbird_num_random_blocks: int = 2
    bigbird_seed: int = 0  # with the iteration and the layer, fixes the random blocks
    # hybrid: seq ranks per Ulysses (all-to-all) group; the ring spans size / ulysses_size groups
    # (None: the largest divisor of the SP size and the heads, at most 8)
    ulysses_size: int | None = None

    def __post_init__(self):
        if self.embedding_layernorm is None:
            self.embedding_layernorm = self.layernorm_layout == "post"
        if self.ffn_hidden_size is None:
            self.ffn_hidden_size = 4 * self.hidden_size
        for name in ("vocab_size", "hidden_size", "num_layers", "num_attention_heads", "ffn_hidden_size",
                     "seq_length", "max_position_embeddings", "make_vocab_size_divisible_by", "linformer_k",
                     "bigbird_block_size", "bigbird_num_window_blocks"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} = {getattr(self, name)} must be positive", f"set {name} to an integer >= 1")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"hidden_size {self.hidden_size} is not divisible by num_attention_heads {self.num_attention_heads}",
                "choose a head count that divides the hidden size")
        if self.max_segment_length is None and self.seq_length > self.max_position_embeddings:
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
            if segment > self.max_position_embeddings:
                raise ConfigError(
                    f"max_segment_length {segment} exceeds max_position_embeddings {self.max_position_embeddings}",
                    "lower --max-segment-length or raise --max-position-embeddings")
        if self.bigbird_num_window_blocks % 2 == 0:
            raise ConfigError(f"bigbird_num_window_blocks = {self.bigbird_num_window_blocks} is even",
                              "use an odd window (the block and the same number of neighbours on each side)")
        if self.bigbird_num_random_blocks < 0:
            raise ConfigError(f"bigbird_num_random_blocks = {self.bigbird_num_random_blocks} is negative",
                              "set bigbird_num_random_blocks to 0 or more")
        if self.layernorm_layout not in ("pre", "post"):
            raise ConfigError(f"layernorm_layout '{self.layernorm_layout}' is unknown", "use 'pre' (Megatron) or 'post' (BERT)")
        for name in ("hidden_dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"{name} = {getattr(self, name)} is outside [0, 1)", f"set {name} between 0 and 1")

    @property
    def padded_vocab_size(self) -> int:
        """Vocab rounded up so the decoder GEMM has friendly shapes; extra rows are never labels."""
        multiple = self.make_vocab_size_divisible_by
        return math.ceil(self.vocab_size / multiple) * multiple

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

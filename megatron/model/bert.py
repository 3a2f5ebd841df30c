"""Megatron BERT, top to bottom: config, embeddings, self-attention, MLP, layer, heads, model.

No process groups here. Under sequence parallelism (SP) every tensor below holds one chunk of
the sequence, `[b, s/P, h]`; the attention core chosen by the registry (model/attention/) is the
only part that looks past the chunk. A sample may hold several segments (packed); what each
token may see (`segment_ids`), its position within its segment (`position_ids`) and where the
heads read (`mlm_mask`, `cls_mask`) come with the batch: the model passes them on and never
interprets them.
"""
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from megatron.errors import ConfigError
from megatron.model import attention
from megatron.model.init import init_bert_weights
from megatron.model.layernorm import layer_norm


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


class Embeddings(nn.Module):
    def __init__(self, config: BertConfig, word_embeddings: bool = True):
        super().__init__()
        # a pipeline keeps the word embedding in its own module, tied to the LM head (model/pipe.py)
        if word_embeddings:
            self.word_embeddings = nn.Embedding(config.padded_vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.layernorm = (layer_norm(config.hidden_size, config.layernorm_epsilon)
                          if config.embedding_layernorm else nn.Identity())
        self.dropout = nn.Dropout(config.hidden_dropout)

    def forward(self, input_ids, token_type_ids, position_ids):
        # input_ids, token_type_ids, position_ids: [b, s/P] -> [b, s/P, h]
        return self.add_positions_and_types(self.word_embeddings(input_ids), token_type_ids, position_ids)

    def add_positions_and_types(self, words, token_type_ids, position_ids):
        x = words + self.position_embeddings(position_ids) + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.layernorm(x))


class SelfAttention(nn.Module):
    """Projects q, k, v and hands them to the attention core, which may span the whole sequence."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads, self.head_dim = config.num_attention_heads, config.head_dim
        self.query_key_value = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.core = attention.build(config)
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, x, segment_ids):
        b, s, h = x.shape  # [b, s/P, h]
        q, k, v = self.query_key_value(x).view(b, s, 3, self.num_heads, self.head_dim).unbind(2)
        context = self.core(q, k, v, segment_ids)  # [b, s/P, heads, d]
        return self.dense(context.reshape(b, s, h))


class MLP(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense_h_to_4h = nn.Linear(config.hidden_size, config.ffn_hidden_size)
        self.dense_4h_to_h = nn.Linear(config.ffn_hidden_size, config.hidden_size)

    def forward(self, x):
        return self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(x)))


class TransformerLayer(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.pre_layernorm = config.layernorm_layout == "pre"
        self.attention_layernorm = layer_norm(config.hidden_size, config.layernorm_epsilon)
        self.attention = SelfAttention(config)
        self.mlp_layernorm = layer_norm(config.hidden_size, config.layernorm_epsilon)
        self.mlp = MLP(config)
        self.dropout = nn.Dropout(config.hidden_dropout)

    def forward(self, x, segment_ids):
        return self.mlp_sublayer(self.attention_sublayer(x, segment_ids))

    def attention_sublayer(self, x, segment_ids):
        if self.pre_layernorm:
            return x + self.dropout(self.attention(self.attention_layernorm(x), segment_ids))
        return self.attention_layernorm(x + self.dropout(self.attention(x, segment_ids)))

    def mlp_sublayer(self, x):
        """Local to the chunk (no communication), so it can be compiled whole (engine.compile_mlp_sublayers)."""
        if self.pre_layernorm:
            return x + self.dropout(self.mlp(self.mlp_layernorm(x)))
        return self.mlp_layernorm(x + self.dropout(self.mlp(x)))


class LMHead(nn.Module):
    """dense -> GELU -> LayerNorm -> logits with the (tied) word-embedding matrix plus a bias."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.layernorm = layer_norm(config.hidden_size, config.layernorm_epsilon)
        self.bias = nn.Parameter(torch.zeros(config.padded_vocab_size))

    def forward(self, hidden, word_embeddings_weight):
        # hidden: [n_masked, h] -> [n_masked, padded_vocab]
        return F.linear(self.layernorm(F.gelu(self.dense(hidden))), word_embeddings_weight, self.bias)


class BinaryHead(nn.Module):
    """Pooler (dense + tanh on [CLS]) and the two-way sentence-order classifier."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size)
        self.classifier = nn.Linear(config.hidden_size, 2)

    def forward(self, cls_hidden):  # [segments, h] -> [segments, 2]
        return self.classifier(torch.tanh(self.pooler(cls_hidden)))


def final_layernorm(config: BertConfig) -> nn.Module:
    """The pre-LN layout normalises the last layer's output; post-LN layers already did."""
    return layer_norm(config.hidden_size, config.layernorm_epsilon) if config.layernorm_layout == "pre" else nn.Identity()


class BertModel(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(TransformerLayer(config) for _ in range(config.num_layers))
        self.final_layernorm = final_layernorm(config)
        self.lm_head = LMHead(config)
        self.binary_head = BinaryHead(config) if config.add_binary_head else None
        # Megatron's init, each parameter from a generator keyed by (seed, name): the same weights
        # whatever the layout (model/init.py); the seed is the one torch.manual_seed set
        init_bert_weights(self, config, seed=torch.initial_seed())

    def encode(self, input_ids, token_type_ids, position_ids, segment_ids):
        """[b, s/P] token ids -> [b, s/P, h] final hidden states. segment_ids is 0 at padding."""
        x = self.embeddings(input_ids, token_type_ids, position_ids)
        for layer in self.layers:
            x = layer(x, segment_ids)
        return self.final_layernorm(x)

    def forward(self, input_ids, token_type_ids, position_ids, segment_ids, mlm_mask, cls_mask):
        """Returns (mlm_logits [n_masked, padded_vocab], sop_logits [n_cls, 2] or None).

        MLM logits are computed only where `mlm_mask` is True (never [b, s, vocab]), SOP logits
        at each segment's [CLS] (`cls_mask`) in this chunk, wherever it falls; a chunk without
        one gives [0, 2] logits, which still give the binary head (zero) gradients on every
        rank alike (ZeRO's gradient buckets must match across ranks). None when the binary head
        is off.
        """
        hidden = self.encode(input_ids, token_type_ids, position_ids, segment_ids)
        mlm_logits = self.lm_head(hidden[mlm_mask], self.embeddings.word_embeddings.weight)
        sop_logits = self.binary_head(hidden[cls_mask]) if self.binary_head is not None else None
        return mlm_logits, sop_logits

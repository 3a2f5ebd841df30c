"""Megatron BERT, top to bottom: embeddings, self-attention, MLP, layer, heads, model (the
config, BertConfig, is in args.py: it imports without torch).

No process groups here. Under sequence parallelism (SP) every tensor below holds one chunk of
the sequence, `[b, s/P, h]`; the attention core chosen by the registry (model/attention/) is the
only part that looks past the chunk. A sample may hold several segments (packed); what each
token may see (`segment_ids`), its position within its segment (`position_ids`) and where the
heads read (`mlm_mask`, `cls_mask`) come with the batch: the model passes them on and never
interprets them. Positions are data too: a learned table or rotary angles (rope) read
`position_ids`, which restart per segment and continue across SP chunks, never a rank's offset.

Layer options (args.py) are fields of the one config, applied per layer index: rope theta and the
attention core (local sliding window or the global variant) follow `config.is_local_layer(i)`.
"""

import torch
import torch.nn.functional as F
from torch import nn

from megatron.model import attention
from megatron.model.attention import plans
from megatron.model.args import BertConfig
from megatron.model.init import init_bert_weights
from megatron.model.layernorm import layer_norm


def norm(config: BertConfig) -> nn.Module:
    """The model's norm: LayerNorm or RMSNorm, without bias when the linear layers have none."""
    return layer_norm(config.hidden_size, config.layernorm_epsilon, bias=config.add_bias_linear,
                      normalization=config.normalization)


def linear(config: BertConfig, inputs: int, outputs: int) -> nn.Linear:
    return nn.Linear(inputs, outputs, bias=config.add_bias_linear)


class Embeddings(nn.Module):
    def __init__(self, config: BertConfig, word_embeddings: bool = True):
        super().__init__()
        # a pipeline keeps the word embedding in its own module, tied to the LM head (model/pipe.py)
        if word_embeddings:
            self.word_embeddings = nn.Embedding(config.padded_vocab_size, config.hidden_size)
        # rope: no table, the layers rotate q and k instead; type_vocab_size 0: no token types
        self.position_embeddings = (nn.Embedding(config.max_position_embeddings, config.hidden_size)
                                    if config.position_embedding_type == "learned" else None)
        self.token_type_embeddings = (nn.Embedding(config.type_vocab_size, config.hidden_size)
                                      if config.type_vocab_size else None)
        self.layernorm = norm(config) if config.embedding_layernorm else nn.Identity()
        self.dropout = nn.Dropout(config.hidden_dropout)

    def forward(self, input_ids, token_type_ids, position_ids):
        # input_ids, token_type_ids, position_ids: [b, s/P] -> [b, s/P, h]
        return self.add_positions_and_types(self.word_embeddings(input_ids), token_type_ids, position_ids)

    def add_positions_and_types(self, words, token_type_ids, position_ids):
        x = words
        if self.position_embeddings is not None:
            x = x + self.position_embeddings(position_ids)
        if self.token_type_embeddings is not None:
            x = x + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.layernorm(x))


def rotary_cos_sin(position_ids, head_dim: int, base: float):
    """[b, s/P] int64 positions -> (cos, sin) [b, s/P, 1, d] in fp32: angle position * inv_freq[i],
    inv_freq[i] = base^(-2i/d) for i < d/2, each angle repeated for the two halves of the head
    (GPT-NeoX's rotate-half layout, as Hugging Face ModernBERT and Llama), the first half of sin
    negated (rotate-half's sign, apply_rotary). The angles come from the token's position within
    its segment, so packing and SP chunks need nothing of their own."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, device=position_ids.device).float() / head_dim))
    angles = position_ids[..., None].float() * inv_freq  # [b, s/P, d/2]
    sin = angles.sin()
    return torch.cat((angles, angles), dim=-1)[:, :, None].cos(), torch.cat((-sin, sin), dim=-1)[:, :, None]


def micro_batch_cos_sin(position_ids, head_dim: int, base: float):
    """rotary_cos_sin once per micro-batch and theta, shared by every layer of that theta, by their
    recompute under activation checkpointing and by the next layers of a pipeline stage: cached by
    the position-id tensor while it lives, as attention plans are by the segment ids (attention/plans.py)."""
    return plans.while_alive(("rope", head_dim, base), position_ids,
                             lambda: rotary_cos_sin(position_ids, head_dim, base))


def apply_rotary(x, cos, sin):
    """x [b, s/P, heads, d] rotated in fp32 (or x's wider dtype): x * cos + rotate_half(x) * sin, with
    rotate_half([x1, x2]) = [-x2, x1] (pairs (i, i + d/2) turn by the same angle), in x's dtype: the
    halves swapped by a roll, the sign in sin's first half (rotary_cos_sin)."""
    wide = x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)
    return (wide * cos + wide.roll(x.shape[-1] // 2, -1) * sin).to(x.dtype)


class SelfAttention(nn.Module):
    """Projects q, k, v (rotating q and k with rope) and hands them to the attention core of this
    layer (local window or the global variant), which may span the whole sequence."""

    def __init__(self, config: BertConfig, layer_index: int):
        super().__init__()
        self.num_heads, self.head_dim = config.num_attention_heads, config.head_dim
        self.rotary_base = (config.layer_rotary_base(layer_index) if config.position_embedding_type == "rope"
                            else None)
        self.query_key_value = linear(config, config.hidden_size, 3 * config.hidden_size)
        self.core = attention.build(config, layer_index=layer_index)
        self.dense = linear(config, config.hidden_size, config.hidden_size)

    def forward(self, x, segment_ids, position_ids):
        b, s, h = x.shape  # [b, s/P, h]
        qkv = self.query_key_value(x).view(b, s, 3 * self.num_heads, self.head_dim)
        if self.rotary_base is None:
            q, k, v = qkv.chunk(3, dim=2)  # [b, s/P, heads, d] each
        else:  # q and k side by side: one rotation turns both
            qk, v = qkv.split((2 * self.num_heads, self.num_heads), dim=2)
            cos, sin = micro_batch_cos_sin(position_ids, self.head_dim, self.rotary_base)
            q, k = apply_rotary(qk, cos, sin).chunk(2, dim=2)
        context = self.core(q, k, v, segment_ids)  # [b, s/P, heads, d]
        return self.dense(context.reshape(b, s, h))


class MLP(nn.Module):
    """GELU: h -> ffn -> h. Gated (geglu, swiglu): one input projection h -> 2 ffn whose first half
    goes through the activation and multiplies the second half, then ffn -> h (Megatron's and
    ModernBERT's fused layout: `input, gate = Wi(x).chunk(2, -1); Wo(act(input) * gate)`)."""

    GATED = {"geglu": F.gelu, "swiglu": F.silu}

    def __init__(self, config: BertConfig):
        super().__init__()
        self.gate_activation = self.GATED.get(config.mlp_type)
        inner = config.ffn_hidden_size * (2 if self.gate_activation else 1)
        self.dense_h_to_4h = linear(config, config.hidden_size, inner)
        self.dense_4h_to_h = linear(config, config.ffn_hidden_size, config.hidden_size)

    def forward(self, x):
        if self.gate_activation is None:
            return self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(x)))
        inner, gate = self.dense_h_to_4h(x).chunk(2, dim=-1)  # [b, s/P, ffn] each
        return self.dense_4h_to_h(self.gate_activation(inner) * gate)


class TransformerLayer(nn.Module):
    def __init__(self, config: BertConfig, layer_index: int):
        super().__init__()
        self.pre_layernorm = config.layernorm_layout == "pre"
        # ModernBERT's layer 0 reads the (normalised) embeddings directly
        self.attention_layernorm = (norm(config) if layer_index or config.first_layer_attention_norm
                                    else nn.Identity())
        self.attention = SelfAttention(config, layer_index)
        self.mlp_layernorm = norm(config)
        self.mlp = MLP(config)
        self.dropout = nn.Dropout(config.hidden_dropout)

    def forward(self, x, segment_ids, position_ids):
        return self.mlp_sublayer(self.attention_sublayer(x, segment_ids, position_ids))

    def attention_sublayer(self, x, segment_ids, position_ids):
        if self.pre_layernorm:
            return x + self.dropout(self.attention(self.attention_layernorm(x), segment_ids, position_ids))
        return self.attention_layernorm(x + self.dropout(self.attention(x, segment_ids, position_ids)))

    def mlp_sublayer(self, x):
        """Local to the chunk (no communication), so it can be compiled whole (engine.compile_mlp_sublayers)."""
        if self.pre_layernorm:
            return x + self.dropout(self.mlp(self.mlp_layernorm(x)))
        return self.mlp_layernorm(x + self.dropout(self.mlp(x)))


class LMHead(nn.Module):
    """dense -> GELU -> norm -> logits with the (tied) word-embedding matrix plus a bias (ModernBERT's
    head too: its dense and norm lose their biases with add_bias_linear, the decoder keeps its own)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = linear(config, config.hidden_size, config.hidden_size)
        self.layernorm = norm(config)
        self.bias = nn.Parameter(torch.zeros(config.padded_vocab_size))

    def forward(self, hidden, word_embeddings_weight):
        # hidden: [n_masked, h] -> [n_masked, padded_vocab]
        return F.linear(self.layernorm(F.gelu(self.dense(hidden))), word_embeddings_weight, self.bias)


class BinaryHead(nn.Module):
    """Pooler (dense + tanh on [CLS]) and the two-way sentence-order classifier."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.pooler = linear(config, config.hidden_size, config.hidden_size)
        self.classifier = linear(config, config.hidden_size, 2)

    def forward(self, cls_hidden):  # [segments, h] -> [segments, 2]
        return self.classifier(torch.tanh(self.pooler(cls_hidden)))


def final_layernorm(config: BertConfig) -> nn.Module:
    """The pre-LN layout normalises the last layer's output; post-LN layers already did."""
    return norm(config) if config.layernorm_layout == "pre" else nn.Identity()


class BertModel(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(TransformerLayer(config, index) for index in range(config.num_layers))
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
            x = layer(x, segment_ids, position_ids)
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

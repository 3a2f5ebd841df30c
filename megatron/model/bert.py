"""Megatron BERT, top to bottom: embeddings, self-attention, MLP, layer, heads, model (the
config, BertConfig, is in args.py: it imports without torch).

No process groups here. Under sequence parallelism (SP) every tensor below holds one chunk of
the sequence, `[b, s/P, h]`; the attention core chosen by the registry (model/attention/) is the
only part that looks past the chunk. A sample may hold several segments (packed); what each
token may see (`segment_ids`), its position within its segment (`position_ids`) and where the
heads read (`mlm_mask`, `cls_mask`) come with the batch: the model passes them on and never
interprets them.
"""

import torch
import torch.nn.functional as F
from torch import nn

from megatron.model import attention
from megatron.model.args import BertConfig
from megatron.model.init import init_bert_weights
from megatron.model.layernorm import layer_norm


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

"""Model FLOPs of one training sample: 6 x parameters x tokens + attention terms, by variant.

A matmul with an [m, n] weight costs 2 x m x n FLOPs per token forward and twice that backward
(input and weight gradients), so a token costs 6 x (the weights it meets) for training;
activation recomputation is not counted (model FLOPs, not hardware FLOPs). Per sample of s tokens:

  6 x N_layers x s                  N_layers = L x (4h^2 + 2hf): qkv + output projections, MLP (f = ffn;
                                    a gated MLP, geglu / swiglu, has 3hf: h -> 2f and f -> h)
  + 6 x N_head x (masked x s)       N_head = h^2 + h x V: the LM head runs at the masked positions
                                    only (`masked_fraction`, 15%); 1.0 gives a model that runs it
                                    everywhere, as Hugging Face's does
  + 6 x L x s x 2 x keys x h        attention: QK^T and PV, 2 x keys x h each per query forward
    keys = s (dense, ring, ulysses, hybrid); k (linformer, which adds 6 x L x 2 x s x k x h for
    its E and F projections of K and V); block x (window + 2 global + random) for BigBird's
    sparse query blocks (its two global query blocks attend to all s keys).
    Local (sliding-window) layers, `config.is_local_layer(i)`, count keys = min(s, W + 1): a
    query sees at most W / 2 keys on each side and itself, so their attention is O(s x W), not
    O(s^2); the global layers between them count as their variant. (W + 1 is the interior
    query's count: the W / 2 queries at each end of a segment see fewer, which the model FLOPs
    do not subtract; the local core's banded tiles compute more, T x (T + W) per tile of T
    query rows, which they do not add either: model FLOPs count the math, not the kernels.)

Embeddings are lookups, LayerNorm, GELU, softmax and biases are elementwise: not counted. As in
Megatron, a sample's queries count all s keys, padding and other packed documents included: with
short documents in long samples this is far more than the work that matters (10x at 4096 tokens of
200-token documents). `real_training_flops` counts a batch as it is instead: its real tokens through
the layers, each query against the keys of its own segment (padding and other documents' pairs, which
the cores here skip, left out; Linformer's and BigBird's cores run every slot), the LM head at its masked
positions; the run log shows both (docs/benchmarks.md).
"""
import torch

from megatron.model.bert import BertConfig


def attention_keys(config: BertConfig, local: bool = False) -> float:
    """Average keys per query of this variant (`local`: of a local sliding-window layer)."""
    s = config.seq_length
    if local:
        return min(s, config.local_attention_window + 1)
    if config.attention == "linformer":
        return min(config.linformer_k, s)
    if config.attention == "bigbird":
        block, blocks = config.bigbird_block_size, s // config.bigbird_block_size
        sparse = block * (config.bigbird_num_window_blocks + 2 + config.bigbird_num_random_blocks)
        return min(s, (2 * s + (blocks - 2) * sparse) / blocks)
    return s


def training_flops_per_sample(config: BertConfig, masked_fraction: float = 0.15) -> float:
    s = config.seq_length
    local = s * attention_keys(config, local=True) if config.has_local_layers else 0
    return layer_flops(config, s, masked_fraction * s) + attention_flops(config, s, s * attention_keys(config), local)


def real_training_flops(config: BertConfig, segment_lengths: torch.Tensor, masked: int, slots: int) -> float:
    """Model FLOPs of a batch's real work: segments of `segment_lengths` tokens (every segment of every sample)
    through the layers, `masked` LM-head positions, each query against the keys of its own segment (the local
    layers', at most W + 1 of them). Linformer and BigBird run every one of the batch's `slots` (b x s) queries,
    padding included, against their keys: their attention is counted so, as in training_flops_per_sample."""
    lengths = segment_lengths.double()
    tokens = float(lengths.sum())
    if config.attention in ("linformer", "bigbird"):
        attention = attention_flops(config, slots, slots * attention_keys(config), 0.0)
    else:
        window = config.local_attention_window
        local = float((lengths * lengths.clamp(max=window + 1)).sum()) if config.has_local_layers else 0.0
        attention = attention_flops(config, tokens, float((lengths * lengths).sum()), local)
    return layer_flops(config, tokens, masked) + attention


def layer_flops(config: BertConfig, tokens: float, masked: float) -> float:
    """6 x the weights `tokens` meet in the layers' projections and MLPs, and `masked` in the LM head."""
    h = config.hidden_size
    layer_params = 4 * h * h + (2 if config.mlp_type == "gelu" else 3) * h * config.ffn_hidden_size
    return 6 * config.num_layers * layer_params * tokens + 6 * (h * h + h * config.padded_vocab_size) * masked


def attention_flops(config: BertConfig, queries: float, pairs: float, local_pairs: float) -> float:
    """The QK^T and PV products of `pairs` (query, key) pairs in each global layer and `local_pairs` in each
    local one, and Linformer's E and F projections of the keys and values of `queries` slots."""
    h, L = config.hidden_size, config.num_layers
    local_layers = sum(config.is_local_layer(i) for i in range(L))
    flops = 6 * (L - local_layers) * 2 * pairs * h + 6 * local_layers * 2 * local_pairs * h
    if config.attention == "linformer":  # (the config refuses local layers with linformer)
        flops += 6 * L * 2 * queries * attention_keys(config) * h
    return flops

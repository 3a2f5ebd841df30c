"""Training FLOPs of one sample, counting attention by variant (for TFLOP/s and MFU).

Matmul FLOPs, forward x 3 for forward + backward (recomputation not counted):
  dense layers: 2 x (4h^2 + 2h*f) per token per layer  (qkv + output projections, MLP with f = ffn)
  attention:    2 x 2 x keys x h per query token per layer  (QK^T and PV)
    keys = s (dense, ring, ulysses); k (linformer, plus 2 x 2 x s x k x h per sample-layer for E, F);
    block x (window + 2 global + random) for BigBird's sparse rows (its two global query blocks
    attend to all s keys)
  LM head: 2 x (h^2 + h*V) per masked token (15% of tokens); embeddings are lookups (0).
"""
from megatron.model.bert import BertConfig


def attention_keys(config: BertConfig) -> float:
    """Average keys per query of this variant."""
    s = config.seq_length
    if config.attention == "linformer":
        return min(config.linformer_k, s)
    if config.attention == "bigbird":
        block, blocks = config.bigbird_block_size, s // config.bigbird_block_size
        sparse = block * (config.bigbird_num_window_blocks + 2 + config.bigbird_num_random_blocks)
        return min(s, (2 * s + (blocks - 2) * sparse) / blocks)
    return s


def training_flops_per_sample(config: BertConfig, masked_fraction: float = 0.15) -> float:
    s, h, f = config.seq_length, config.hidden_size, config.ffn_hidden_size
    per_token_layer = 2 * (4 * h * h + 2 * h * f) + 4 * attention_keys(config) * h
    forward = config.num_layers * s * per_token_layer
    if config.attention == "linformer":
        forward += config.num_layers * 4 * s * attention_keys(config) * h
    forward += masked_fraction * s * 2 * (h * h + h * config.padded_vocab_size)
    return 3 * forward

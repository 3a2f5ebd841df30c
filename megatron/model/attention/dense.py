"""`dense`: softmax(q k^T / sqrt(d) + mask) v over the keys this rank holds, through torch SDPA.

The mask comes from segment ids (masks.py): the key-padding row when the batch holds one segment
per sample, the block-diagonal [b, 1, s, s] mask when samples are packed.
"""
import torch.nn.functional as F

from megatron.model.attention.masks import segment_mask
from megatron.model.attention.registry import AttentionCore, register


def sdpa(q, k, v, segment_ids, dropout_p: float = 0.0):
    """q, k, v: [b, s, heads, d]; segment_ids: [b, s] (0 at padding) -> [b, s, heads, d].

    A query that may see no key (padding) gets zeros (SDPA alone would give NaN): inside the
    kernel it attends to every key, and its output is then zeroed, so no NaN reaches backward.
    """
    mask = segment_mask(segment_ids, segment_ids)  # allowed None: no padding, one segment (flash on CUDA)
    keep = None if mask.allowed is None else mask.allowed | ~mask.allowed.any(-1, keepdim=True)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=keep, dropout_p=dropout_p)
    if mask.blind is not None:
        out = out.masked_fill(mask.blind[:, None, :, None], 0.0)
    return out.transpose(1, 2)


@register("dense")
class DenseAttention(AttentionCore):
    def __init__(self, config):
        super().__init__()
        self.dropout_p = config.attention_dropout

    def forward(self, q, k, v, segment_ids):
        return sdpa(q, k, v, segment_ids, self.dropout_p if self.training else 0.0)

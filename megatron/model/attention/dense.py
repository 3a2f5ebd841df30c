"""`dense`: softmax(q k^T / sqrt(d) + mask) v over the keys this rank holds, through torch SDPA."""
import torch.nn.functional as F

from megatron.errors import ConfigError
from megatron.model.attention.registry import AttentionCore, register


def sdpa(q, k, v, key_padding_mask, dropout_p: float = 0.0):
    """q, k, v: [b, s, heads, d]; key_padding_mask: [b, s_k] True at padding -> [b, s, heads, d].

    A sample whose keys are all padding gets zeros (SDPA alone would give NaN): it attends to
    every key inside the kernel and its output is then zeroed, so no NaN reaches backward.
    """
    no_keys = key_padding_mask.all(dim=-1)  # [b]
    keep = (~key_padding_mask | no_keys[:, None])[:, None, None, :]  # [b, 1, 1, s_k]
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=keep, dropout_p=dropout_p)
    return out.masked_fill(no_keys[:, None, None, None], 0.0).transpose(1, 2)


@register("dense")
class DenseAttention(AttentionCore):
    def __init__(self, config):
        super().__init__()
        self.dropout_p = config.attention_dropout

    @classmethod
    def check(cls, config, sequence_parallel_size):
        super().check(config, sequence_parallel_size)
        if sequence_parallel_size > 1:
            raise ConfigError(
                f"attention 'dense' sees only the local chunk but the sequence-parallel size is {sequence_parallel_size}",
                "use attention 'ring' or 'ulysses' with sequence parallelism")

    def forward(self, q, k, v, key_padding_mask):
        return sdpa(q, k, v, key_padding_mask, self.dropout_p if self.training else 0.0)

"""`linformer`: attention over k projected keys and values, softmax(Q (E K)^T / sqrt(d)) (F V).

E and F map the sequence axis from s to k rows: `[heads, k, s]`, or `[1, k, s]` shared by all
heads (`linformer_share_heads`); with `linformer_share_kv` one matrix serves as both. Keys and
values at padding are zeroed before the projection, so padding never enters E K or F V.

Under sequence parallelism the projection is a sum over chunks: E K = sum_r E[:, :, chunk r] K_r.
Seq rank r multiplies its own column slice of E and F into its local K, V chunk, giving
[b, heads, k, d] each, and ONE all-reduce over the seq group sums them (autograd-aware: its
backward is an all-reduce of the gradient, `_AllReduceSum`; both are comm.SeqComm.sum, in
fp32). What crosses ranks per layer is 2 * b * heads * k * d numbers, independent of s. Each
rank then attends its s/P queries to the k projected rows: O(s/P * k) scores per head, never
s x s.

Gradients of E and F: every rank holds the full s columns (identical after init: the same
seed draws them on every rank). On rank r, backward writes the exact full-loss gradient into
columns [r*s/P, (r+1)*s/P) and zeros elsewhere, because the all-reduce's backward has already
summed the upstream gradient over the group. The seq-group SUM that the trainer applies to
every replicated parameter (parallel/grads.py) therefore assembles the exact full gradient,
one column slice per rank.

E and F are built for `seq_length` columns; a different sequence length at run time or in a
checkpoint is refused with a ConfigError.
"""
import torch
import torch.nn.functional as F
from torch import nn

from megatron.errors import ConfigError
from megatron.model.attention.comm import SeqComm
from megatron.model.attention.masks import PAD_SEGMENT
from megatron.model.attention.registry import AttentionCore, register
from megatron.parallel import state


class _AllReduceSum(torch.autograd.Function):
    """Sum over the seq group (comm.SeqComm.sum, in fp32). The sum is replicated and each rank's
    loss share reaches it through its own queries only, so the whole loss' gradient with respect
    to it is the sum of the ranks' gradients: backward is the same all-reduce."""

    @staticmethod
    def forward(ctx, tensor, seq):
        ctx.seq = seq
        return seq.sum(tensor)

    @staticmethod
    def backward(ctx, grad):
        return ctx.seq.sum(grad), None


def _length_error(built: int, got: int) -> ConfigError:
    return ConfigError(f"linformer projections were built for seq_length {built} but the sequence has {got} tokens",
                       f"train and resume with --seq-length {built}, or build a new model for {got}")


@register("linformer")
class LinformerAttention(AttentionCore):

    def __init__(self, config):
        super().__init__()
        self.seq = SeqComm(state.get_sequence_parallel_group(), state.get_sequence_parallel_ranks())
        self.seq_length = config.seq_length
        self.dropout_p = config.attention_dropout
        shape = (1 if config.linformer_share_heads else config.num_attention_heads, config.linformer_k,
                 config.seq_length)
        self.key_projection = nn.Parameter(torch.empty(shape))
        self.value_projection = None if config.linformer_share_kv else nn.Parameter(torch.empty(shape))
        self.reset_parameters()

    def reset_parameters(self):
        # N(0, 1/s): each projected row sums s keys, so E K keeps the scale of K whatever s is.
        # Not an nn.Linear: model/init.py runs this reset under the parameter's own generator.
        for projection in (self.key_projection, self.value_projection):
            if projection is not None:
                nn.init.normal_(projection, mean=0.0, std=self.seq_length ** -0.5)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        for name in ("key_projection", "value_projection"):
            saved = state_dict.get(prefix + name)
            if saved is not None and saved.shape[-1] != self.seq_length:
                raise _length_error(saved.shape[-1], self.seq_length)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, q, k, v, segment_ids):
        # one segment per sample (packing is refused at start-up): only padding is masked
        b, chunk, heads, d = q.shape  # [b, s/P, heads, d]
        if chunk * self.seq.size != self.seq_length:
            raise _length_error(self.seq_length, chunk * self.seq.size)
        columns = slice(self.seq.rank * chunk, (self.seq.rank + 1) * chunk)
        pad = (segment_ids == PAD_SEGMENT)[:, None, :, None]  # [b, 1, s/P, 1]
        key_projection = self.key_projection[..., columns]  # [heads or 1, k, s/P]
        value_projection = key_projection if self.value_projection is None else self.value_projection[..., columns]
        projected = torch.stack([key_projection @ k.transpose(1, 2).masked_fill(pad, 0.0),
                                 value_projection @ v.transpose(1, 2).masked_fill(pad, 0.0)])  # [2, b, heads, k, d]
        if self.seq.size > 1:
            projected = _AllReduceSum.apply(projected, self.seq)
        projected_k, projected_v = projected.unbind(0)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), projected_k, projected_v,
                                             dropout_p=self.dropout_p if self.training else 0.0)
        return out.transpose(1, 2)  # [b, s/P, heads, d]

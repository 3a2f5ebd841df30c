"""One (query chunk, key block) attention step with its log-sum-exp, forward and backward.

The ring runs this per key block and merges blocks by log-sum-exp; backward recomputes each
block's probabilities from the merged lse, so no score matrix outlives one block. Both
directions call torch's SDPA kernels: the CPU flash kernel, or the memory-efficient kernel on
CUDA (the ones that return and accept the lse).

Shapes: q [b, heads, s_q, d]; k, v [b, heads, s_k, d]; mask: a masks.BlockMask (which keys each
query may see, and the queries that see none); lse [b, heads, s_q] float32.
"""
import torch

aten = torch.ops.aten
_ALIGN = 16  # the CUDA memory-efficient kernel wants the bias' last dim 16-aligned in memory


def _bias(mask, q, open_empty_rows: bool):
    """Additive mask [b, heads, s_q or 1 -> s_q, s_k]: -inf where a query may not see a key, 0
    elsewhere. Forward opens a row that may see nothing to every key (no NaN; its output is
    zeroed afterwards); backward must not, as that row's merged lse may be finite."""
    allowed = mask.allowed | ~mask.allowed.any(-1, keepdim=True) if open_empty_rows else mask.allowed
    b, _, rows, s_k = allowed.shape
    bias = torch.zeros(b, 1, rows, s_k + (-s_k) % _ALIGN, dtype=q.dtype, device=q.device)
    bias[..., :s_k].masked_fill_(~allowed, float("-inf"))
    return bias[..., :s_k].expand(b, q.shape[1], q.shape[2], s_k)


def forward(q, k, v, mask, scale):
    """-> (out [b, heads, s_q, d], lse [b, heads, s_q]); lse = -inf and out = 0 for the queries
    that see no key of this block (mask.blind)."""
    bias = _bias(mask, q, open_empty_rows=True)
    if q.is_cuda:
        out, lse = aten._scaled_dot_product_efficient_attention(q, k, v, bias, True, scale=scale)[:2]
        lse = lse[..., : q.shape[2]]
    else:
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=bias, scale=scale)
    blind = mask.blind[:, None, :]  # [b, 1, s_q]
    return out.masked_fill(blind[..., None], 0.0), lse.float().masked_fill(blind, float("-inf"))


def backward(grad_out, q, k, v, mask, out, lse, scale):
    """Gradients of this block given the MERGED out and lse over all blocks -> (dq, dk, dv).

    With the merged statistics, p = exp(s - lse) is the block's slice of the global softmax, so
    the per-block results sum (dq) or concatenate (dk, dv) to the exact full gradient. Rows
    that saw no key at all carry lse = +inf, which makes their p, and so their gradients, zero.
    """
    bias = _bias(mask, q, open_empty_rows=False)
    lse = lse.masked_fill(lse == float("-inf"), float("inf"))
    if q.is_cuda:
        padded = torch.zeros(*lse.shape[:2], lse.shape[2] + (-lse.shape[2]) % 32, device=lse.device)
        padded[..., : lse.shape[2]] = lse
        empty = torch.empty((), dtype=torch.int64, device=q.device)
        dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward(
            grad_out, q, k, v, bias, out, padded, empty, empty, 0.0, [True, True, True, False], scale=scale)
        return dq, dk, dv
    return aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad_out, q, k, v, out, lse, 0.0, False, attn_mask=bias, scale=scale)


def merge(out, lse, block_out, block_lse):
    """Log-sum-exp merge of two partial softmax results (out in float32).

    new_lse = log(e^lse + e^block_lse); each side is weighted by e^(its lse - new_lse). Where
    both sides have seen no key (lse = -inf), the weights are defined as 0, giving zeros.
    """
    if out is None:
        return block_out.float(), block_lse
    new_lse = torch.logaddexp(lse, block_lse)
    finite = new_lse.masked_fill(new_lse == float("-inf"), 0.0)
    # in place: no [b, heads, s_q, d] temporaries beyond the two operands
    out.mul_(torch.exp(lse - finite)[..., None]).addcmul_(block_out, torch.exp(block_lse - finite)[..., None])
    return out, new_lse

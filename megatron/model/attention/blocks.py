"""One (query chunk, key block) attention step with its log-sum-exp, forward and backward.

The ring runs this per key block and merges blocks by log-sum-exp; backward recomputes each
block's probabilities from the merged lse, so no score matrix outlives one block. Both
directions call torch's SDPA kernels that return (forward) and accept (backward) the lse.

Which kernel computes a block (`kernel()`):
  | device | block                                   | kernel                                        |
  |--------|-----------------------------------------|-----------------------------------------------|
  | CPU    | any                                     | flash (CPU), with a bias only if masked       |
  | CUDA   | unmasked (masks "full": one segment, no | flash (fp16/bf16, head dim % 8 == 0, <= 256), |
  |        | padding on either side), fp16/bf16      | or cuDNN where UNMASKED_CUDA_KERNEL = "cudnn" |
  | CUDA   | unmasked, fp32 (flash has no fp32)      | memory-efficient, no bias                     |
  | CUDA   | padding or several segments             | memory-efficient with an additive bias        |
Unpacked samples without padding are all "full" blocks: the fast path. Packed samples are
"mixed" blocks, cropped into tiles by masks.tile_plan; a varlen flash call (torch's
_flash_attention_forward with cumulative lengths) could replace the bias there, but it needs
each tile's segment lengths on the host (one more host synchronisation per block) and has no
backward that takes a merged lse across blocks, so masked blocks keep the bias.

Shapes: q [b, heads, s_q, d]; k, v [b, heads, s_k, d]; mask: a masks.BlockMask (which keys each
query may see, and the queries that see none; allowed None: every query sees every key); lse
[b, heads, s_q] float32.
"""
import torch

from megatron.model.attention import masks

aten = torch.ops.aten
_ALIGN = 16  # the CUDA memory-efficient kernel wants the bias' last dim 16-aligned in memory
UNMASKED_CUDA_KERNEL = "flash"  # or "cudnn": unmasked fp16/bf16 blocks on CUDA (gpu_check compares both)


def kernel(q, mask) -> str:
    """The SDPA kernel for a block of queries q and this mask (module docstring)."""
    if not q.is_cuda:
        return "cpu_flash"
    if mask.allowed is None and q.dtype in (torch.float16, torch.bfloat16):
        if UNMASKED_CUDA_KERNEL == "cudnn":
            return "cudnn"
        if q.shape[-1] % 8 == 0 and q.shape[-1] <= 256:
            return "flash"
    return "efficient"


def _bias(mask, q, open_empty_rows: bool):
    """Additive mask [b, heads, s_q or 1 -> s_q, s_k]: -inf where a query may not see a key, 0
    elsewhere (None for an unmasked block). Forward opens a row that may see nothing to every
    key (no NaN; its output is zeroed afterwards); backward must not, as that row's merged lse
    may be finite."""
    if mask.allowed is None:
        return None
    allowed = mask.allowed | ~mask.allowed.any(-1, keepdim=True) if open_empty_rows else mask.allowed
    b, _, rows, s_k = allowed.shape
    bias = torch.zeros(b, 1, rows, s_k + (-s_k) % _ALIGN, dtype=q.dtype, device=q.device)
    bias[..., :s_k].masked_fill_(~allowed, float("-inf"))
    return bias[..., :s_k].expand(b, q.shape[1], q.shape[2], s_k)


def forward(q, k, v, mask, scale):
    """-> (out [b, heads, s_q, d], lse [b, heads, s_q]); lse = -inf and out = 0 for the queries
    that see no key of this block (mask.blind)."""
    bias = _bias(mask, q, open_empty_rows=True)
    chosen = kernel(q, mask)
    if chosen == "flash":
        out, lse = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False, False, scale=scale)[:2]
    elif chosen == "cudnn":
        out, lse = aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, False, False, scale=scale)[:2]
        lse = lse.reshape(q.shape[:3])  # cuDNN's softmax stats may carry a trailing dim of 1
    elif chosen == "efficient":
        out, lse = aten._scaled_dot_product_efficient_attention(q, k, v, bias, True, scale=scale)[:2]
        lse = lse[..., : q.shape[2]]
    else:
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=bias, scale=scale)
    if mask.blind is None:
        return out, lse.float()
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
    chosen = kernel(q, mask)
    s_q, s_k = q.shape[2], k.shape[2]
    unused = torch.empty((), dtype=torch.int64, device=q.device)  # RNG seed/offset: no dropout here
    if chosen == "flash":
        return aten._scaled_dot_product_flash_attention_backward(
            grad_out, q, k, v, out, lse.contiguous(), None, None, s_q, s_k, 0.0, False, unused, unused, scale=scale)
    if chosen == "cudnn":
        return aten._scaled_dot_product_cudnn_attention_backward(
            grad_out, q, k, v, out, lse[..., None].contiguous(), unused, unused, None, None, None, s_q, s_k, 0.0,
            False, scale=scale)
    if chosen == "efficient":
        padded = torch.zeros(*lse.shape[:2], s_q + (-s_q) % 32, device=lse.device)
        padded[..., :s_q] = lse
        dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward(
            grad_out, q, k, v, bias, out, padded, unused, unused, 0.0, [True, True, True, False], scale=scale)
        return dq, dk, dv
    return aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad_out, q, k, v, out, lse, 0.0, False, attn_mask=bias, scale=scale)


def tiled_forward(q, k, v, q_segments, k_segments, tiles, scale):
    """forward() of a whole block cut into masks.tile_plan() tiles: rows outside every tile see
    no key of this block (out 0, lse -inf)."""
    out = q.new_zeros(q.shape)
    lse = q.new_full(q.shape[:3], float("-inf"), dtype=torch.float32)
    for tile in tiles:
        rows, columns = slice(tile.q_start, tile.q_stop), slice(tile.k_start, tile.k_stop)
        mask = masks.block_mask(q_segments[:, rows], k_segments[:, columns], tile.kind)
        out[:, :, rows], lse[:, :, rows] = forward(q[:, :, rows], k[:, :, columns], v[:, :, columns], mask, scale)
    return out, lse


def tiled_backward(grad_out, q, k, v, q_segments, k_segments, tiles, out, lse, scale):
    """backward() of a block computed by tiled_forward -> (dq, dk, dv) in float32."""
    dq = q.new_zeros(q.shape, dtype=torch.float32)
    dk, dv = (x.new_zeros(x.shape, dtype=torch.float32) for x in (k, v))
    for tile in tiles:
        rows, columns = slice(tile.q_start, tile.q_stop), slice(tile.k_start, tile.k_stop)
        mask = masks.block_mask(q_segments[:, rows], k_segments[:, columns], tile.kind)
        dq_tile, dk_tile, dv_tile = backward(grad_out[:, :, rows], q[:, :, rows], k[:, :, columns], v[:, :, columns],
                                             mask, out[:, :, rows], lse[:, :, rows], scale)
        dq[:, :, rows] += dq_tile
        dk[:, :, columns] += dk_tile
        dv[:, :, columns] += dv_tile
    return dq, dk, dv


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

"""One (query chunk, key block) attention step with its log-sum-exp, forward and backward.

The ring runs this per key block and merges blocks by log-sum-exp; backward recomputes each
block's probabilities from the merged lse, so no score matrix outlives one block. Both
directions call torch's SDPA kernels that return (forward) and accept (backward) the lse,
through kernels.py, which states what each CUDA kernel assumes (and can emulate them on CPU).

Which kernel computes a block (masks.BlockPlan; `kernel()` picks):
  | device | block                                         | kernel                                       |
  |--------|-----------------------------------------------|----------------------------------------------|
  | CPU    | any                                           | flash (CPU) per tile, a tile bias if masked  |
  | CUDA   | "full" (one segment, no padding), fp16/bf16   | flash (head dim % 8 == 0, <= 256), or cuDNN  |
  |        |                                               | where UNMASKED_CUDA_KERNEL = "cudnn"         |
  | CUDA   | "full", fp32 (flash has no fp32)              | memory-efficient, no bias                    |
  | CUDA   | padding or several segments, fp16/bf16        | varlen flash: one call for the whole block,  |
  |        |                                               | each (sample, segment) a sequence            |
  | CUDA   | padding or several segments, fp32 (no flash), | memory-efficient per tile, with the bias of  |
  |        | or a layout varlen cannot describe (BigBird's | that tile only (never s x s)                 |
  |        | gathered key slots)                           |                                              |
  | CUDA   | a local layer's chunk and halo, fp16/bf16     | varlen flash with a window (local.py): one   |
  |        |                                               | call per layer; fp32: memory-efficient tiles |
Backward takes the MERGED out and lse of all blocks (varlen flash too: its lse is [heads,
total rows], converted here), so each block's gradients are exact slices
of the full softmax's. Shapes: q [b, heads, s_q, d]; k, v [b, heads, s_k, d], all views of
[b, s, heads, d] memory, the layout the CUDA kernels write and (memory-efficient backward) assume;
lse [b, heads, s_q] float32.
"""
import torch

from megatron.errors import ConfigError
from megatron.model.attention import kernels, masks

UNMASKED_CUDA_KERNEL = "flash"  # or "cudnn": unmasked fp16/bf16 blocks on CUDA (gpu_check compares both)
_HALF = (torch.float16, torch.bfloat16)


def kernel(q, masked: bool, varlen: bool = False) -> str:
    """The kernel for a block of queries q (module docstring): masked = padding or segments;
    varlen = the block's plan has variable-length sequences."""
    if not kernels.on_cuda(q):
        return "cpu_flash"
    flash_shape = q.shape[-1] % 8 == 0 and q.shape[-1] <= 256 and q.dtype in _HALF
    if masked:
        return "varlen_flash" if varlen and flash_shape else "efficient"
    if flash_shape and UNMASKED_CUDA_KERNEL == "cudnn":
        return "cudnn"
    return "flash" if flash_shape else "efficient"


def check_cuda_head_dim(head_dim: int, precision: str, capability: tuple) -> None:
    """The memory-efficient kernel, which every masked block and every fp32 block runs, has only
    aligned builds on sm80+ GPUs (A100, H100, H200; older ones have unaligned builds too): a head dim
    that is not a multiple of 8 in fp16/bf16 (4 in fp32) fails there at the first step ("cutlassF:
    no kernel found to launch!")."""
    align = 4 if precision == "fp32" else 8
    if head_dim % align and tuple(capability) >= (8, 0):
        raise ConfigError(f"head dim {head_dim} (hidden size / attention heads) is not a multiple of {align}, which "
                          f"the CUDA attention kernels need in {precision} on this GPU "
                          f"(sm{capability[0]}{capability[1]})",
                          "choose --hidden-size and --num-attention-heads so that their ratio is a multiple of 8 "
                          "(BERT and ModernBERT use 64)")


def kernel_layout(shape, dtype, device, fill=0.0):
    """A [b, heads, s, d] tensor filled with `fill`, viewing [b, s, heads, d] memory."""
    b, heads, s, d = shape
    return torch.full((b, s, heads, d), fill, dtype=dtype, device=device).transpose(1, 2)


def empty_result(q):
    """(out, lse) of queries that see no key: zeros, -inf."""
    return kernel_layout(q.shape, q.dtype, q.device), q.new_full(q.shape[:3], float("-inf"), dtype=torch.float32)


def _bias(mask, q, open_empty_rows: bool):
    """Additive mask [b, heads, s_q or 1 -> s_q, s_k]: -inf where a query may not see a key, 0
    elsewhere (None for an unmasked block), its rows padded to kernels.BIAS_ALIGN. Forward opens
    a row that may see nothing to every key (no NaN; its output is zeroed afterwards); backward
    must not, as that row's merged lse may be finite."""
    if mask.allowed is None:
        return None
    allowed = mask.allowed | ~mask.allowed.any(-1, keepdim=True) if open_empty_rows else mask.allowed
    b, _, rows, s_k = allowed.shape
    bias = torch.zeros(b, 1, rows, s_k + (-s_k) % kernels.BIAS_ALIGN, dtype=q.dtype, device=q.device)
    bias[..., :s_k].masked_fill_(~allowed, float("-inf"))
    return bias[..., :s_k].expand(b, q.shape[1], q.shape[2], s_k)


def forward(q, k, v, mask, scale):
    """One call of the kernel for a block under a masks.BlockMask -> (out [b, heads, s_q, d],
    lse [b, heads, s_q]); lse = -inf and out = 0 for the queries that see no key (mask.blind)."""
    ops, s_q = kernels.ops(), q.shape[2]
    chosen = kernel(q, mask.allowed is not None)
    bias = _bias(mask, q, open_empty_rows=True)
    if chosen == "flash":
        out, lse = ops._scaled_dot_product_flash_attention(q, k, v, 0.0, False, False, scale=scale)[:2]
    elif chosen == "cudnn":
        out, lse = ops._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, False, False, scale=scale)[:2]
        lse = lse.reshape(q.shape[:3])  # cuDNN's softmax stats carry a trailing dim of 1
    elif chosen == "efficient":
        out, lse = ops._scaled_dot_product_efficient_attention(q, k, v, bias, True, scale=scale)[:2]
        lse = lse[..., :s_q]  # padded to kernels.LSE_ROWS_ALIGN rows
    else:
        out, lse = ops._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=bias, scale=scale)
    if mask.blind is None:
        return out, lse.float()
    blind = mask.blind[:, None, :]  # [b, 1, s_q]
    # in place: out keeps the layout the kernel wrote (out-of-place masked_fill would make it contiguous)
    return out.masked_fill_(blind[..., None], 0.0), lse.float().masked_fill(blind, float("-inf"))


def backward(grad_out, q, k, v, mask, out, lse, scale):
    """Gradients of this block given the MERGED out and lse over all blocks -> (dq, dk, dv).

    With the merged statistics, p = exp(s - lse) is the block's slice of the global softmax, so
    the per-block results sum (dq) or concatenate (dk, dv) to the exact full gradient. Rows
    that saw no key at all carry lse = +inf, which makes their p, and so their gradients, zero.
    """
    ops, s_q, s_k = kernels.ops(), q.shape[2], k.shape[2]
    chosen = kernel(q, mask.allowed is not None)
    bias = _bias(mask, q, open_empty_rows=False)
    # an unmasked block: every row sees its keys, so its (merged) lse is finite already
    lse = lse if mask.allowed is None else _blind_rows_infinite(lse)
    unused = torch.empty((), dtype=torch.int64, device=q.device)  # RNG seed/offset: no dropout here
    if chosen == "flash":
        return ops._scaled_dot_product_flash_attention_backward(
            grad_out, q, k, v, out, lse.contiguous(), None, None, s_q, s_k, 0.0, False, unused, unused, scale=scale)
    if chosen == "cudnn":
        return ops._scaled_dot_product_cudnn_attention_backward(
            grad_out, q, k, v, out, lse[..., None].contiguous(), unused, unused, None, None, None, s_q, s_k, 0.0,
            False, scale=scale)
    if chosen == "efficient":
        padded = lse.new_full((*lse.shape[:2], s_q + (-s_q) % kernels.LSE_ROWS_ALIGN), float("inf"))  # as written
        padded[..., :s_q] = lse
        dq, dk, dv, _ = ops._scaled_dot_product_efficient_attention_backward(
            grad_out, q, k, v, bias, out, padded, unused, unused, 0.0, [True, True, True, False], scale=scale)
        return dq, dk, dv
    return ops._scaled_dot_product_flash_attention_for_cpu_backward(
        grad_out, q, k, v, out, lse, 0.0, False, attn_mask=bias, scale=scale)


def _blind_rows_infinite(lse):
    """Backward's lse: rows that saw no key get +inf (p = exp(s - lse) = 0), not -inf."""
    return lse.masked_fill(lse == float("-inf"), float("inf"))


def _flat(x):
    """[b, heads, s, d] view of [b, s, heads, d] memory -> the varlen kernels' [b * s, heads, d] (a view)."""
    return x.transpose(1, 2).flatten(0, 1)


def varlen_forward(q, k, v, varlen, scale, window: int | None = None):
    """A whole masked block in one varlen flash call -> (out, lse) as forward() returns them.
    `window`: each query sees the keys at most this far on either side of the one its sequence
    aligns it with (flash's window_size_left = right; kernels.py), None: every key."""
    b, heads, s_q, d = q.shape
    out, lse = varlen_flash(q, k, v, varlen, scale, window)
    lse = lse.view(heads, b, s_q).transpose(0, 1)  # [heads, b * s_q] -> [b, heads, s_q]
    # rows of a sequence without keys (padding, segments this block lacks): out 0, lse +inf -> -inf
    return out, lse.masked_fill(lse.isinf(), float("-inf"))


def varlen_backward(grad_out, q, k, v, out, lse, varlen, scale, window: int | None = None):
    """backward() of varlen_forward (the same window) -> (dq, dk, dv) in q's dtype."""
    b, heads, s_q, d = q.shape
    lse = _blind_rows_infinite(lse).transpose(0, 1).reshape(heads, b * s_q)  # the kernel's [heads, total rows]
    return varlen_flash_backward(grad_out, q, k, v, out, lse, varlen, scale, window)


def varlen_flash(q, k, v, varlen, scale, window: int | None = None):
    """varlen_forward's kernel call -> (out, lse as the kernel writes it: [heads, b * s_q], +inf in the
    rows that see no key), for a caller that only hands the lse back to varlen_flash_backward (no
    merge: local.py), so it is never converted."""
    b, heads, s_q, d = q.shape
    out, lse = kernels.ops()._flash_attention_forward(
        _flat(q), _flat(k), _flat(v), varlen.cu_q, varlen.cu_k, varlen.max_q, varlen.max_k, 0.0, False, False,
        scale=scale, window_size_left=window, window_size_right=window)[:2]
    return out.view(b, s_q, heads, d).transpose(1, 2), lse


def varlen_flash_backward(grad_out, q, k, v, out, lse, varlen, scale, window: int | None = None):
    """backward() of varlen_flash (the same window, its lse) -> (dq, dk, dv) in q's dtype."""
    b, heads, s_q, d = q.shape
    unused = torch.empty((), dtype=torch.int64, device=q.device)
    grads = kernels.ops()._flash_attention_backward(*(_flat(x) for x in (grad_out, q, k, v, out)), lse, varlen.cu_q,
                                                    varlen.cu_k, varlen.max_q, varlen.max_k, 0.0, False, unused,
                                                    unused, scale=scale, window_size_left=window,
                                                    window_size_right=window)
    return tuple(x.view(b, -1, heads, d).transpose(1, 2) for x in grads)


def _whole(plan, q, k) -> bool:
    """The plan is one tile covering the whole block."""
    return len(plan.tiles) == 1 and plan.tiles[0][:4] == (0, q.shape[2], 0, k.shape[2])


def attend(q, k, v, q_segments, k_segments, plan, scale):
    """forward() of a whole block by its masks.BlockPlan: one call when "full" or varlen, else
    tile by tile (rows outside every tile see no key of this block: out 0, lse -inf)."""
    if kernel(q, plan.kind != "full", plan.varlen is not None) == "varlen_flash":
        return varlen_forward(q, k, v, plan.varlen, scale)
    if _whole(plan, q, k):  # one tile covering the block: no copies
        return forward(q, k, v, masks.block_mask(q_segments, k_segments, plan.kind), scale)
    return forward_tiles(q, k, v, _tile_masks(plan.tiles, q_segments, k_segments), scale)


def attend_backward(grad_out, q, k, v, q_segments, k_segments, plan, out, lse, scale):
    """backward() of a block computed by attend() -> (dq, dk, dv): in float32 where tiles were
    summed, else as the one kernel call gives them (q's dtype); a caller summing blocks widens them."""
    if kernel(q, plan.kind != "full", plan.varlen is not None) == "varlen_flash":
        return varlen_backward(grad_out, q, k, v, out, lse, plan.varlen, scale)
    if _whole(plan, q, k):
        return backward(grad_out, q, k, v, masks.block_mask(q_segments, k_segments, plan.kind), out, lse, scale)
    return backward_tiles(grad_out, q, k, v, _tile_masks(plan.tiles, q_segments, k_segments), out, lse, scale)


def _tile_masks(tiles, q_segments, k_segments):
    """masks.tile_plan tiles -> (query rows, key columns, their BlockMask) for forward_tiles / backward_tiles."""
    for tile in tiles:
        rows, columns = slice(tile.q_start, tile.q_stop), slice(tile.k_start, tile.k_stop)
        yield rows, columns, masks.block_mask(q_segments[:, rows], k_segments[:, columns], tile.kind)


def forward_tiles(q, k, v, tiles, scale):
    """forward() tile by tile; `tiles`: (query rows, key columns, BlockMask), each query row in at
    most one tile, which holds all the keys it sees in this block. Rows outside every tile see no
    key of it: out 0, lse -inf."""
    out, lse = empty_result(q)
    for rows, columns, mask in tiles:
        out[:, :, rows], lse[:, :, rows] = forward(q[:, :, rows], k[:, :, columns], v[:, :, columns], mask, scale)
    return out, lse


def backward_tiles(grad_out, q, k, v, tiles, out, lse, scale):
    """backward() of forward_tiles (the same tiles) -> (dq, dk, dv) in float32."""
    dq = kernel_layout(q.shape, torch.float32, q.device)
    dk, dv = (kernel_layout(x.shape, torch.float32, x.device) for x in (k, v))
    for rows, columns, mask in tiles:
        dq_tile, dk_tile, dv_tile = backward(grad_out[:, :, rows], q[:, :, rows], k[:, :, columns], v[:, :, columns],
                                             mask, out[:, :, rows], lse[:, :, rows], scale)
        dq[:, :, rows] += dq_tile
        dk[:, :, columns] += dk_tile
        dv[:, :, columns] += dv_tile
    return dq, dk, dv


def merge(out, lse, block_out, block_lse):
    """Log-sum-exp merge of two partial softmax results (out in float32 from the second block on, in
    block_out's layout).

    new_lse = log(e^lse + e^block_lse); each side is weighted by e^(its lse - new_lse). Where
    both sides have seen no key (lse = -inf), the weights are defined as 0, giving zeros.
    """
    if out is None:  # the first block as its kernel wrote it: a lone block needs no float32 copy
        return block_out, block_lse
    out = out.float()  # the first block's, once a second comes (then a no-op)
    new_lse = torch.logaddexp(lse, block_lse)
    finite = new_lse.masked_fill(new_lse == float("-inf"), 0.0)
    # in place: no [b, heads, s_q, d] temporaries beyond the two operands
    out.mul_(torch.exp(lse - finite)[..., None]).addcmul_(block_out, torch.exp(block_lse - finite)[..., None])
    return out, new_lse

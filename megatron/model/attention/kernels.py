"""The SDPA kernels the attention cores call (blocks.py), what each CUDA kernel assumes, and an
emulation of those CUDA kernels on CPU that enforces it.

torch's CPU kernels accept any layout; the CUDA kernels do not all read what they are given.
What each assumes (torch 2.11-2.13, aten/src/ATen/native/transformers/cuda/: attention.cu,
attention_backward.cu, flash_attn/flash_api.cpp, mem_eff_attention/kernel_backward.h):

  _scaled_dot_product_flash_attention (+ _backward)
    q, k, v:        [b, h, s, d], last stride 1
    out / grad_out: forward writes memory in q's stride order (empty_like of q transposed); backward
                    makes both contiguous
    lse:            [b, h, s_q] fp32, contiguous
    other:          fp16/bf16; d % 8 == 0, d <= 256

  _flash_attention_forward/_backward (varlen: cum_seq_q, cum_seq_k)
    q, k, v:        [total, h, d], last stride 1; sequence i = rows cum[i]:cum[i+1]
    out / grad_out: forward: empty_like(q); backward: any layout (made contiguous)
    lse:            [h, total_q] fp32, read as contiguous, unpadded; rows of a sequence without keys
                    get +inf, out 0
    other:          cum_seq_q/k int32 [n + 1], contiguous; rows past cum[-1] are never written;
                    max_q/max_k bound what is read; fp16/bf16; window_size_left/right: query i of a
                    sequence of s_q rows and s_k keys sees keys i + s_k - s_q - left .. + right
                    (bottom-right aligned; None or < 0: no bound)

  _scaled_dot_product_efficient_attention (+ _backward)
    q, k, v:        [b, h, s, d], last stride 1; sm80+ (A100, H100, H200) has only aligned builds: d
                    and every stride % 8 half, % 4 fp32 ("cutlassF: no kernel found")
    out / grad_out: forward writes [b, s, h, d] memory; fp16/bf16 BACKWARD READS out's ROWS AT STRIDE
                    h * d (o_strideM() = heads x head dim), batch and head strides its own; fp32
                    computes that term on the host by out's strides; out and grad_out read as q's
                    dtype, unchecked
    lse:            [b, h, ceil32(s_q)] fp32, padded rows +inf (kept in backward: lse strides % 8)
    other:          bias: q's dtype, last stride 1, other strides % (128 bits / the element: 8 half,
                    4 fp32); a row masked whole gives out 0, lse 0

  _scaled_dot_product_cudnn_attention (+ _backward)
    q, k, v:        [b, h, s, d], last stride 1
    out / grad_out: forward matches q's stride order; backward reads both by their strides
    lse:            [b, h, s_q, 1] fp32
    other:          fp16/bf16; d % 8 == 0, d <= 256

So a buffer handed to the memory-efficient backward as `out` must hold its rows h * d apart: a
[b, h, s, d] view of [b, s, h, d] memory (what that kernel's forward returns; blocks.kernel_layout
allocates it), never [b, h, s, d]-contiguous memory, which in fp16/bf16 reads the wrong rows
(silently wrong gradients, or an illegal address past the buffer). Nothing in torch checks it.

`emulated_cuda()` makes the cores take their CUDA branches on CPU tensors, with `ops()` giving
kernels that check the preconditions above (KernelContractError) and compute in float64 reading
memory as the CUDA kernel does: the fp16/bf16 memory-efficient backward reads `out` at row stride h * d,
varlen flash leaves rows outside every sequence unwritten (NaN here), computes a sequence's
first max_q rows only and aligns a window to each sequence's bottom-right corner (flash-attn 2's
mask; a row whose window holds no key gets out 0, lse +inf). torch builds flash without ALiBi and
softcap (its library holds their refusals) but with windows (it holds no "does not support local
attention"); the emulation refuses the arguments it does not implement. Each emulated call is
first bound to the real op's schema (CPU torch carries the CUDA ops' schemas): arity, keyword
names and argument types as the installed torch takes them. What the emulation cannot see: the
kernels' own rounding and speed, alignment of data pointers, whether this reading of the window's
alignment is flash's (the GPU check's local rows are), and anything of a kernel not listed here.
Read against torch 2.11's sources (2.13 agrees); before a torch upgrade, check again the cuDNN
backward's lse (2.11-2.13 take the forward's [b, h, s_q, 1]; a later torch unsqueezes it itself)
and the memory-efficient kernel's builds per GPU generation.
"""
import contextlib
import functools
import re
import threading

import torch

BIAS_ALIGN = 16  # elements: bias rows padded to this (the kernel needs 128-bit aligned strides: 8 half, 4 fp32)
LSE_ROWS_ALIGN = 32  # the memory-efficient kernel's lse has its rows padded to a multiple of 32
_HALF = (torch.float16, torch.bfloat16)
_lock = threading.Lock()
_emulating = 0  # > 0 inside emulated_cuda() (threads of simulate.py's virtual ranks share it)


class KernelContractError(AssertionError):
    """A call the real CUDA kernel would compute wrongly or refuse."""


def on_cuda(x) -> bool:
    """Whether the cores take their CUDA branch for tensor x (always, inside emulated_cuda())."""
    return x.is_cuda or _emulating > 0


ATEN = torch.ops.aten  # the real kernels (a test may stand a counter in)


def ops():
    """The kernels' namespace: ATEN, or the emulation inside emulated_cuda()."""
    return _EMULATED if _emulating > 0 else ATEN


@contextlib.contextmanager
def emulated_cuda():
    """The cores' CUDA branches on CPU tensors, through contract-checking emulated kernels."""
    global _emulating
    with _lock:
        _emulating += 1
    try:
        yield
    finally:
        with _lock:
            _emulating -= 1


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise KernelContractError(message)


def _check_qkv(q, k, v, dims: int, dtypes, name: str) -> None:
    for label, x in (("q", q), ("k", k), ("v", v)):
        _check(x.dim() == dims, f"{name}: {label} must be {dims}-D, got {tuple(x.shape)}")
        _check(x.stride(-1) == 1, f"{name}: {label}'s last dim must be contiguous, strides {x.stride()}")
        _check(x.dtype == q.dtype and x.dtype in dtypes, f"{name}: {label} dtype {x.dtype} (wants one of {dtypes})")


def _check_flash_head_dim(q, name: str) -> None:
    _check(q.shape[-1] % 8 == 0 and q.shape[-1] <= 256, f"{name}: head dim {q.shape[-1]} (wants % 8 == 0, <= 256)")


def _alignment(x) -> int:
    """The memory-efficient kernel's alignment in elements: 128 bits (8 fp16/bf16, 4 fp32)."""
    return 128 // (8 * x.element_size())


def _check_aligned(tensors: dict, name: str) -> None:
    """The memory-efficient kernel's sm80+ builds: head dim and every stride aligned (_alignment);
    no unaligned build exists there."""
    for label, x in tensors.items():
        align = _alignment(x)
        _check(x.shape[-1] % align == 0 and all(stride % align == 0 for stride in x.stride()[:-1]),
               f"{name}: {label}'s head dim {x.shape[-1]} or strides {x.stride()} are not multiples of {align} "
               "(no sm80+ build of the kernel takes them)")


def _check_like_q(tensors: dict, q, name: str) -> None:
    for label, x in tensors.items():
        _check(x.stride(-1) == 1 and x.dtype == q.dtype and x.shape == q.shape, f"{name}: {label} {tuple(x.shape)} "
               f"{x.dtype} strides {x.stride()} (the kernel reads it as q's shape and dtype, last dim contiguous)")


def _check_lse(lse, shape: tuple, name: str) -> None:
    _check(lse.dtype == torch.float32, f"{name}: logsumexp must be float32, got {lse.dtype}")
    _check(tuple(lse.shape) == shape, f"{name}: logsumexp shape {tuple(lse.shape)}, the kernel assumes {shape}")
    _check(lse.is_contiguous(), f"{name}: logsumexp must be contiguous")


def _scores(q, k, scale, bias=None, allowed=None):
    """float64 scores [..., s_q, s_k] with the additive bias and/or the allowed mask."""
    scores = torch.matmul(q.double(), k.double().transpose(-1, -2)) * scale
    if bias is not None:
        scores = scores + bias.double()
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    return scores


def _attend(q, k, v, scale, bias=None, allowed=None):
    """-> (out float64 [..., s_q, d], lse float64 [..., s_q]); rows that see nothing: 0, -inf."""
    scores = _scores(q, k, scale, bias, allowed)
    lse = torch.logsumexp(scores, -1)
    p = torch.exp(scores - lse[..., None]).nan_to_num(0.0)
    return torch.matmul(p, v.double()), lse


def _gradients(grad_out, q, k, v, out, lse, scale, bias=None, allowed=None):
    """The standard attention backward from the given out and lse (as the kernels compute it:
    D = rowsum(dO * O) from the `out` they read) -> float64 (dq, dk, dv)."""
    scores = _scores(q, k, scale, bias, allowed)
    p = torch.exp(scores - lse.double()[..., None])
    grad_out = grad_out.double()
    dv = torch.matmul(p.transpose(-1, -2), grad_out)
    dp = torch.matmul(grad_out, v.double().transpose(-1, -2))
    ds = p * (dp - (grad_out * out.double()).sum(-1, keepdim=True))
    return torch.matmul(ds, k.double()) * scale, torch.matmul(ds.transpose(-1, -2), q.double()) * scale, dv


def _written_as_forward(out64, dtype):
    """[b, h, s, d] result -> the memory the memory-efficient forward writes: [b, s, h, d], viewed transposed."""
    return out64.transpose(1, 2).to(dtype).contiguous().transpose(1, 2)


def _written_like(out64, q):
    """[b, h, s, d] result -> the memory flash and cuDNN write: q's stride order (empty_like)."""
    return torch.empty_like(q).copy_(out64)


def _rows_at_stride(out, row_stride: int):
    """`out` [b, h, s, d] read as the memory-efficient backward reads it: batch and head strides
    its own, rows `row_stride` apart (raises past the buffer, as the GPU would fault)."""
    b, h, s, d = out.shape
    try:
        return out.as_strided((b, h, s, d), (out.stride(0), out.stride(1), row_stride, 1))
    except RuntimeError as error:
        raise KernelContractError(f"memory-efficient backward: reading out's rows {row_stride} apart runs past "
                                  f"its buffer (an illegal memory access on the GPU): {error}") from error


def _window(rows: slice, columns: slice, left, right):
    """[s_q, s_k] keys a varlen sequence's queries see under flash's window_size_left/right, aligned
    to the sequence's bottom-right corner (query i faces key i + s_k - s_q); None or < 0: unbounded."""
    s_q, s_k = rows.stop - rows.start, columns.stop - columns.start
    offset = torch.arange(s_k)[None, :] - (torch.arange(s_q)[:, None] + s_k - s_q)
    allowed = torch.ones(s_q, s_k, dtype=torch.bool)
    if left is not None and left >= 0:
        allowed &= offset >= -left
    if right is not None and right >= 0:
        allowed &= offset <= right
    return allowed


def _check_not_emulated(others: dict, name: str) -> None:
    """Arguments of the real op the emulation does not implement must keep their defaults."""
    given = sorted(key for key, value in others.items() if value is not None)
    _check(not given, f"{name}: {', '.join(given)} not emulated")


_KINDS = {"Tensor": torch.Tensor, "int": int, "float": (int, float), "bool": bool}


def _fits(kind: str, value) -> bool:
    """Whether torch's argument parser takes `value` for a schema type such as 'Optional[int]'."""
    optional = re.fullmatch(r"Optional\[(.*)\]", kind)
    if optional:
        return value is None or _fits(optional.group(1), value)
    listed = re.fullmatch(r"List\[(.*)\]", kind)
    if listed:
        return isinstance(value, (list, tuple)) and all(_fits(listed.group(1), x) for x in value)
    _check(kind in _KINDS, f"the emulation does not know the schema type {kind}")
    if kind == "Tensor":
        return value is None or isinstance(value, torch.Tensor)  # None: an undefined tensor, which it takes
    return isinstance(value, int if kind == "bool" else _KINDS[kind])  # the parser takes bools and ints alike


def _as_the_real_op_binds(method):
    """Checks each call against the real op's schema (torch.ops.aten.<name>) before emulating it:
    a call the CUDA op would reject for its arity, keyword names or argument types fails on CPU."""
    schema = getattr(ATEN, method.__name__).default._schema
    positional = [a for a in schema.arguments if not a.kwarg_only]
    name, names = schema.name, {a.name for a in schema.arguments}

    @functools.wraps(method)
    def checked(self, *args, **kwargs):
        _check(len(args) <= len(positional), f"{name}: {len(args)} positional arguments, it takes {len(positional)}")
        given = {a.name: value for a, value in zip(positional, args)}
        for key, value in kwargs.items():
            _check(key in names and key not in given, f"{name}: no argument {key}= (or given twice)")
            given[key] = value
        for argument in schema.arguments:
            if argument.name not in given:
                _check(argument.has_default_value(), f"{name}: argument {argument.name} missing")
            else:
                value = given[argument.name]
                _check(_fits(str(argument.type), value), f"{name}: argument {argument.name} is "
                       f"{type(value).__name__}, the op takes {argument.type}")
        return method(self, *args, **kwargs)
    return checked


class _Emulated:
    """torch.ops.aten's CUDA attention kernels, emulated (same names and arguments, bound by the
    real ops' schemas)."""

    @_as_the_real_op_binds
    def _scaled_dot_product_flash_attention(self, q, k, v, dropout_p=0.0, is_causal=False, return_debug_mask=False,
                                            *, scale=None):
        name = "flash forward"
        _check_qkv(q, k, v, 4, _HALF, name)
        _check_flash_head_dim(q, name)
        _check(dropout_p == 0.0 and not is_causal, f"{name}: only dropout 0, not causal, is emulated")
        out, lse = _attend(q, k, v, scale)
        unused = torch.empty(0)
        return _written_like(out, q), lse.float(), unused, unused, q.shape[2], k.shape[2], unused, unused, unused

    @_as_the_real_op_binds
    def _scaled_dot_product_flash_attention_backward(self, grad_out, q, k, v, out, lse, cum_seq_q, cum_seq_k, max_q,
                                                     max_k, dropout_p, is_causal, philox_seed, philox_offset, *,
                                                     scale=None):
        name = "flash backward"
        _check_qkv(q, k, v, 4, _HALF, name)
        _check_like_q({"out": out, "grad_out": grad_out}, q, name)
        _check_lse(lse, tuple(q.shape[:3]), name)
        return tuple(g.to(q.dtype) for g in _gradients(grad_out, q, k, v, out, lse, scale))

    @_as_the_real_op_binds
    def _flash_attention_forward(self, q, k, v, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                                 return_debug_mask, *, scale=None, window_size_left=None, window_size_right=None,
                                 **others):
        name = "varlen flash forward"
        _check_qkv(q, k, v, 3, _HALF, name)
        _check_flash_head_dim(q, name)
        _check_not_emulated(others, name)
        _check(dropout_p == 0.0 and not is_causal, f"{name}: only dropout 0, not causal, is emulated")
        sequences = self._sequences(q, k, cum_seq_q, cum_seq_k, max_q, max_k, name)
        heads = q.shape[1]
        out = torch.full(q.shape, float("nan"), dtype=q.dtype)  # rows outside every sequence: never written
        lse = torch.full((heads, q.shape[0]), float("nan"), dtype=torch.float32)
        for rows, columns in sequences:
            window = _window(rows, columns, window_size_left, window_size_right)
            o, l = _attend(q[rows].transpose(0, 1), k[columns].transpose(0, 1), v[columns].transpose(0, 1), scale,
                           allowed=window)
            # a row that sees no key (none in its sequence or its window): flash writes 0 and +inf
            out[rows], lse[:, rows] = o.transpose(0, 1).to(q.dtype), l.float().masked_fill(l == float("-inf"),
                                                                                          float("inf"))
        unused = torch.empty(0)
        return out, lse, unused, unused, unused

    @_as_the_real_op_binds
    def _flash_attention_backward(self, grad_out, q, k, v, out, lse, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                                  is_causal, rng_state, unused, *, scale=None, window_size_left=None,
                                  window_size_right=None):
        name = "varlen flash backward"
        _check_qkv(q, k, v, 3, _HALF, name)
        _check(dropout_p == 0.0 and not is_causal, f"{name}: only dropout 0, not causal, is emulated")
        for label, x in (("out", out), ("grad_out", grad_out)):
            _check(x.stride(-1) == 1 and x.shape == q.shape, f"{name}: {label} {x.shape} strides {x.stride()}")
        _check_lse(lse, (q.shape[1], q.shape[0]), name)
        sequences = self._sequences(q, k, cum_seq_q, cum_seq_k, max_q, max_k, name)
        grads = [torch.zeros(x.shape, dtype=torch.float64) for x in (q, k, v)]
        for rows, columns in sequences:
            if columns.start == columns.stop or rows.start == rows.stop:
                continue
            parts = _gradients(*(x[rows].transpose(0, 1) for x in (grad_out, q)), k[columns].transpose(0, 1),
                               v[columns].transpose(0, 1), out[rows].transpose(0, 1), lse[:, rows], scale,
                               allowed=_window(rows, columns, window_size_left, window_size_right))
            for grad, part, where in zip(grads, parts, (rows, columns, columns)):
                grad[where] += part.transpose(0, 1)
        return tuple(g.to(q.dtype) for g in grads)

    @staticmethod
    def _sequences(q, k, cum_seq_q, cum_seq_k, max_q, max_k, name) -> list:
        """[(row slice, key slice)] of the varlen sequences, each cut to the max_q / max_k the
        kernel is told (it never looks further)."""
        for label, cu, total in (("cum_seq_q", cum_seq_q, q.shape[0]), ("cum_seq_k", cum_seq_k, k.shape[0])):
            _check(cu is not None and cu.dtype == torch.int32 and cu.dim() == 1 and cu.is_contiguous(),
                   f"{name}: {label} must be a contiguous int32 vector")
            _check(int(cu[0]) == 0 and bool((cu[1:] >= cu[:-1]).all()) and int(cu[-1]) <= total,
                   f"{name}: {label} {cu.tolist()} is not cumulative within {total} rows")
        _check(len(cum_seq_q) == len(cum_seq_k), f"{name}: cum_seq_q and cum_seq_k hold different batch sizes")
        bounds = list(zip(cum_seq_q.tolist(), cum_seq_q[1:].tolist(), cum_seq_k.tolist(), cum_seq_k[1:].tolist()))
        return [(slice(q0, min(q1, q0 + max_q)), slice(k0, min(k1, k0 + max_k))) for q0, q1, k0, k1 in bounds]

    @_as_the_real_op_binds
    def _scaled_dot_product_efficient_attention(self, q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0,
                                                is_causal=False, *, scale=None):
        name = "memory-efficient forward"
        _check_qkv(q, k, v, 4, (*_HALF, torch.float32), name)
        _check_aligned({"q": q, "k": k, "v": v}, name)
        self._check_bias(attn_bias, q, name)
        out, lse = _attend(q, k, v, scale, bias=attn_bias)
        lse = lse.masked_fill(lse == float("-inf"), 0.0)  # a row masked whole: out 0, lse 0
        padded = torch.full((*q.shape[:2], q.shape[2] + (-q.shape[2]) % LSE_ROWS_ALIGN), float("inf"))
        padded[..., :q.shape[2]] = lse
        unused = torch.empty(0)
        return _written_as_forward(out, q.dtype), padded, unused, unused

    @_as_the_real_op_binds
    def _scaled_dot_product_efficient_attention_backward(self, grad_out, q, k, v, attn_bias, out, lse, philox_seed,
                                                         philox_offset, dropout_p, grad_input_mask, is_causal=False,
                                                         *, scale=None):
        name = "memory-efficient backward"
        _check_qkv(q, k, v, 4, (*_HALF, torch.float32), name)
        self._check_bias(attn_bias, q, name)
        _check_aligned({"q": q, "k": k, "v": v}, name)
        b, heads, s_q, d = q.shape
        _check_lse(lse, (b, heads, s_q + (-s_q) % LSE_ROWS_ALIGN), name)
        _check(bool(lse[..., s_q:].eq(float("inf")).all()), f"{name}: logsumexp's padding rows must be +inf, as the "
               "forward writes them (the backward reads them)")
        _check_like_q({"out": out, "grad_out": grad_out}, q, name)
        read = _rows_at_stride(out, heads * d) if q.dtype in _HALF else out  # fp32: the host's sum, by strides
        grads = _gradients(grad_out, q, k, v, read, lse[..., :s_q], scale, bias=attn_bias)
        return (*(g.to(q.dtype) for g in grads), None)

    @staticmethod
    def _check_bias(bias, q, name) -> None:
        if bias is None:
            return
        _check(bias.dtype == q.dtype, f"{name}: bias dtype {bias.dtype} differs from q's {q.dtype}")
        _check(bias.stride(-1) == 1, f"{name}: bias' last dim must be contiguous")
        align = _alignment(bias)
        for dim in range(bias.dim() - 1):
            _check(bias.stride(dim) % align == 0, f"{name}: bias strides {bias.stride()} are not {align}-element "
                   "aligned (pad its rows)")

    @_as_the_real_op_binds
    def _scaled_dot_product_cudnn_attention(self, q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0,
                                            is_causal=False, return_debug_mask=False, *, scale=None):
        name = "cuDNN forward"
        _check_qkv(q, k, v, 4, _HALF, name)
        _check_flash_head_dim(q, name)
        _check(attn_bias is None, f"{name}: no bias is emulated")
        out, lse = _attend(q, k, v, scale)
        unused = torch.empty(0)
        return (_written_like(out, q), lse.float()[..., None], unused, unused, q.shape[2], k.shape[2],
                unused, unused, unused)

    @_as_the_real_op_binds
    def _scaled_dot_product_cudnn_attention_backward(self, grad_out, q, k, v, out, lse, philox_seed, philox_offset,
                                                     attn_bias, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                                                     is_causal, *, scale=None):
        name = "cuDNN backward"
        _check_qkv(q, k, v, 4, _HALF, name)
        _check_flash_head_dim(q, name)
        _check_like_q({"out": out, "grad_out": grad_out}, q, name)
        _check_lse(lse, (*q.shape[:3], 1), name)
        return tuple(g.to(q.dtype) for g in _gradients(grad_out, q, k, v, out, lse[..., 0], scale))


_EMULATED = _Emulated()

"""Every attention core's CUDA branch, run on CPU through emulated kernels that hold it to the
CUDA kernels' contracts (megatron/model/attention/kernels.py), at fp32 and bf16, packed and
padded, SP 1, 2, 4 and hybrid 2 x 2, against float64.

What these tests see: which kernel each block takes on CUDA; every argument it is handed
checked against what that kernel assumes (layouts and strides, lse shape and padding,
cumulative sequence lengths, bias alignment, head dim and dtype); the result computed by
reading memory the way the CUDA kernel does (the fp16/bf16 memory-efficient backward reads
`out`'s rows h * d apart whatever its strides; varlen flash leaves rows outside its sequences
unwritten); and the P > 1 schedules around them. What they cannot see: the kernels' own
rounding, speed and memory, pointer alignment, NCCL, and any assumption the contracts table
does not state. benchmarks/gpu_check.sh runs the real kernels.
"""
import contextlib
import sys
from pathlib import Path

import pytest
import torch

from bert_fixtures import segment_allowed, small_config
from megatron.model import attention
from megatron.model.attention import blocks, kernels, masks
from megatron.parallel import state
from megatron.parallel.spawn import run_on_ranks

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import gpu_kernels  # noqa: E402

SHAPE = dict(b=2, s=128, heads=4, d=16, block=8)
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}  # max |error| / max |float64|


def emulated_accuracy(variant, size, layout, dtype, force_masked=None) -> dict:
    with kernels.emulated_cuda():
        return gpu_kernels.accuracy(variant, size, layout, dtype, torch.device("cpu"), force_masked=force_masked,
                                    **SHAPE)


def assert_accurate(result, dtype):
    worst = max(result["errors"].values())
    assert worst <= TOLERANCE[dtype], gpu_kernels.table([result])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("layout", ["padded", "packed"])
@pytest.mark.parametrize("size", [1, 2, 4])
@pytest.mark.parametrize("variant", ["ring", "bigbird", "local"])
def test_ring_bigbird_and_local_cuda_branches(variant, size, layout, dtype):
    """P virtual ranks (attention/simulate.py) on the emulated kernels. bf16 masked ring blocks
    take varlen flash, fp32 ones the memory-efficient kernel per tile; BigBird's gathered slots
    the memory-efficient kernel with a block's bias; a local layer's chunk one windowed varlen
    flash call in bf16 (its queries aligned to their keys by the halo's dummy rows), tiles on the
    memory-efficient kernel in fp32."""
    result = emulated_accuracy(variant, size, layout, dtype)
    assert_accurate(result, dtype)
    used = set(result["kernels"])
    if variant in ("ring", "local"):
        assert used <= {"flash unmasked", "efficient unmasked", "varlen_flash masked", "efficient masked"}, used
        assert ("varlen_flash masked" if dtype == torch.bfloat16 else "efficient masked") in used, used
    else:
        assert "efficient masked" in used, used


@pytest.mark.parametrize("size", [1, 4])
def test_local_tiles_on_the_memory_efficient_kernel_in_bf16(size):
    """Local layers where windowed flash cannot take the chunk (a head dim flash lacks, a layout
    varlen cannot describe) run their tiles on the memory-efficient kernel in bf16 too."""
    result = emulated_accuracy("local", size, "packed", torch.bfloat16, force_masked="efficient")
    assert set(result["kernels"]) == {"efficient masked"}, result["kernels"]
    assert_accurate(result, torch.bfloat16)


@pytest.mark.parametrize("size", [1, 2])
def test_ring_on_the_memory_efficient_kernel_in_bf16(size):
    """Masked ring blocks forced onto the memory-efficient kernel in bf16 (what BigBird and any
    layout varlen cannot describe run): exact only if the merged output the ring hands its
    backward holds its rows h * d apart. A [b, heads, s, d]-contiguous output fails here."""
    result = emulated_accuracy("ring", size, "packed", torch.bfloat16, force_masked="efficient")
    assert "efficient masked" in result["kernels"], result["kernels"]
    assert_accurate(result, torch.bfloat16)


def test_emulated_memory_efficient_backward_reads_out_at_its_assumed_row_stride():
    """The emulation can see the layout bug: the same out values, [b, s, h, d] memory (right)
    vs [b, h, s, d] memory (what the ring and BigBird handed it before), in bf16."""
    g = torch.Generator().manual_seed(0)
    q, k, v, grad_out = (torch.randn(1, 64, 2, 16, generator=g).to(torch.bfloat16).transpose(1, 2) for _ in range(4))
    ids = torch.ones(1, 64, dtype=torch.long)
    ids[:, 40:] = 0
    mask = masks.block_mask(ids, ids, "single")
    scale = 16 ** -0.5
    with kernels.emulated_cuda():
        assert blocks.kernel(q, masked=True) == "efficient"
        out, lse = blocks.forward(q, k, v, mask, scale)
        assert out.transpose(1, 2).is_contiguous()  # the layout the kernel writes
        right = blocks.backward(grad_out, q, k, v, mask, out, lse, scale)
        with pytest.raises(kernels.KernelContractError, match="past its buffer"):
            blocks.backward(grad_out, q, k, v, mask, out.contiguous(), lse, scale)
        in_bigger_buffer = torch.zeros(1, 2, 128, 16, dtype=torch.bfloat16)[:, :, :64]  # rows d apart, inside memory
        in_bigger_buffer.copy_(out)
        wrong = blocks.backward(grad_out, q, k, v, mask, in_bigger_buffer, lse, scale)
    assert not torch.allclose(right[0].float(), wrong[0].float(), atol=1e-2)
    want = gpu_kernels.reference(*(x.transpose(1, 2).float() for x in (q, k, v, grad_out)),
                                 segment_allowed(ids))
    error = (right[0].transpose(1, 2).double() - want[1]).abs().max() / want[1].abs().max()
    assert error <= TOLERANCE[torch.bfloat16]


def test_emulated_kernels_refuse_what_the_cuda_kernels_cannot_take():
    q = torch.randn(1, 2, 32, 16)
    with kernels.emulated_cuda():
        ops = kernels.ops()
        with pytest.raises(kernels.KernelContractError, match="dtype"):
            ops._scaled_dot_product_flash_attention(q, q, q, scale=0.25)  # flash has no fp32
        with pytest.raises(kernels.KernelContractError, match="head dim"):
            half = torch.randn(1, 2, 32, 12).bfloat16()
            ops._scaled_dot_product_flash_attention(half, half, half, scale=0.25)
        with pytest.raises(kernels.KernelContractError, match="aligned"):
            bias = torch.zeros(1, 1, 32, 33)[..., :32].expand(1, 2, 32, 32)  # rows 33 apart
            ops._scaled_dot_product_efficient_attention(q, q, q, bias, True, scale=0.25)
        # torch 2.11's sm80+ tables hold aligned builds only: "cutlassF: no kernel found to launch!"
        for odd in (torch.randn(1, 2, 32, 12).bfloat16(), torch.randn(1, 2, 32, 6)):
            with pytest.raises(kernels.KernelContractError, match="not multiples of"):
                ops._scaled_dot_product_efficient_attention(odd, odd, odd, None, True, scale=0.25)
        with pytest.raises(kernels.KernelContractError, match="head dim"):
            ops._scaled_dot_product_cudnn_attention(half, half, half, None, True, scale=0.25)
        half = torch.randn(1, 2, 20, 16).bfloat16()  # lse rows padded to 32
        out, lse = ops._scaled_dot_product_efficient_attention(half, half, half, None, True, scale=0.25)[:2]
        args = (None, None, 0.0, [True, True, True, False])
        with pytest.raises(kernels.KernelContractError, match="padding rows must be"):
            ops._scaled_dot_product_efficient_attention_backward(half, half, half, half, None, out,
                                                                 torch.zeros_like(lse), *args, scale=0.25)
        with pytest.raises(kernels.KernelContractError, match="torch.float32 strides"):  # read as bf16 regardless
            ops._scaled_dot_product_efficient_attention_backward(half.float(), half, half, half, None, out, lse, *args,
                                                                 scale=0.25)
        flat = torch.randn(32, 2, 16).bfloat16()
        with pytest.raises(kernels.KernelContractError, match="int32"):
            cu = torch.tensor([0, 32])
            ops._flash_attention_forward(flat, flat, flat, cu, cu, 32, 32, 0.0, False, False, scale=0.25)
        cu = torch.tensor([0, 16], dtype=torch.int32)  # rows 16..31 lie in no sequence: never written
        out = ops._flash_attention_forward(flat, flat, flat, cu, cu, 16, 16, 0.0, False, False, scale=0.25)[0]
        assert torch.isnan(out[16:].float()).all() and torch.isfinite(out[:16].float()).all()
        with pytest.raises(kernels.KernelContractError, match="alibi_slopes not emulated"):
            ops._flash_attention_forward(flat, flat, flat, cu, cu, 16, 16, 0.0, False, False, scale=0.25,
                                         alibi_slopes=torch.ones(2))


def test_emulated_flash_window_is_aligned_to_each_sequences_bottom_right():
    """flash-attn 2's window for a sequence of 3 queries and 6 keys: query i faces key i + 3 and
    sees keys i + 3 - 1 .. i + 3 + 1 (a key past the end is none); a query whose window is empty
    writes 0 and lse +inf. This is the reading the local core's alignment rests on; only the real
    kernel (tests/test_cuda_path.py on a GPU) can confirm it."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(n, 1, 8, generator=g).bfloat16() for n in (3, 6, 6))
    cu_q, cu_k = torch.tensor([0, 3], dtype=torch.int32), torch.tensor([0, 6], dtype=torch.int32)
    with kernels.emulated_cuda():
        out, lse = kernels.ops()._flash_attention_forward(q, k, v, cu_q, cu_k, 3, 6, 0.0, False, False, scale=1.0,
                                                          window_size_left=1, window_size_right=1)[:2]
    for i, keys in enumerate(([2, 3, 4], [3, 4, 5], [4, 5])):
        scores = (q[i, 0].double() @ k[keys, 0].double().T)
        assert lse[0, i].item() == pytest.approx(torch.logsumexp(scores, 0).item(), rel=1e-6)
        want = torch.softmax(scores, 0) @ v[keys, 0].double()
        assert torch.allclose(out[i, 0].double(), want, atol=1e-2), i
    with kernels.emulated_cuda():  # window 0 to the left, 0 to the right, but keys shifted past the queries
        two = torch.tensor([0, 2], dtype=torch.int32)
        out, lse = kernels.ops()._flash_attention_forward(q, k[:2], v[:2], cu_q, two, 3, 2, 0.0, False, False,
                                                          scale=1.0, window_size_left=0, window_size_right=0)[:2]
    assert lse[0, 0].item() == float("inf") and (out[0] == 0).all()  # query 0 faces key -1: none


def test_emulated_kernels_bind_calls_as_the_real_ops_schemas_do():
    """Calls are held to the installed torch's schemas of the CUDA ops (names, arity, argument
    types), which CPU torch carries although it cannot run them. It cannot see another torch
    version's schemas (the GPU image has 2.11)."""
    flat = torch.randn(32, 2, 16).bfloat16()
    cu = torch.tensor([0, 32], dtype=torch.int32)
    with kernels.emulated_cuda():
        ops = kernels.ops()
        for args, kwargs, problem in (
                ((cu, cu, torch.tensor(32), 32, 0.0, False, False), {}, "max_q is Tensor"),
                ((cu, cu, 32, 32, 0.0, False), {}, "return_debug_mask missing"),
                ((cu, cu, 32, 32, 0.0, False, False, 0.25), {}, "11 positional arguments, it takes 10"),
                ((cu, cu, 32, 32, 0.0, False, False), {"softmax_scale": 0.25}, "no argument softmax_scale=")):
            with pytest.raises(kernels.KernelContractError, match=problem):
                ops._flash_attention_forward(flat, flat, flat, *args, **kwargs)
        q = torch.randn(1, 2, 32, 16).bfloat16()
        with pytest.raises(kernels.KernelContractError, match="grad_input_mask is bool"):
            ops._scaled_dot_product_efficient_attention_backward(q, q, q, q, None, q, torch.zeros(1, 2, 32), None,
                                                                 None, 0.0, True, scale=0.25)


def test_varlen_sequences_cover_both_sides_in_memory_order():
    q_ids = torch.tensor([[1, 1, 2, 2, 2, 0], [3, 3, 3, 3, 3, 3]]).numpy()
    k_ids = torch.tensor([[2, 2, 3, 0, 0, 0], [1, 1, 3, 3, 4, 4]]).numpy()
    q_lengths, k_lengths = masks.varlen_lengths(q_ids, k_ids)
    # sample 0: segment 1 (2 rows, no keys), 2 (3, 2), 3 (0, 1), query padding (1, 0), key padding (0, 3);
    # sample 1: segment 1 (0, 2), 3 (6, 2), 4 (0, 2)
    assert q_lengths.tolist() == [2, 3, 0, 1, 0, 0, 6, 0]
    assert k_lengths.tolist() == [0, 2, 1, 0, 3, 2, 2, 2]
    assert masks.varlen_lengths(q_ids[:, ::-1], k_ids) is None  # descending ids: not describable
    plan = masks.block_plan(q_ids, k_ids, "cpu", cuda=True)
    assert plan.kind == "mixed" and plan.varlen.cu_q.tolist() == [0, 2, 5, 5, 6, 6, 6, 12, 12]
    assert plan.varlen.max_q == 6 and plan.varlen.max_k == 3 and plan.varlen.cu_k.dtype == torch.int32


def test_dense_ulysses_and_linformer_cuda_branches_at_one_rank():
    """Dense and Ulysses (segment-tiled, the ring's kernels at one rank) and Linformer at SP = 1."""
    for variant in ("dense", "ulysses", "linformer"):
        for dtype in (torch.float32, torch.bfloat16):
            for layout in ("padded",) if variant == "linformer" else ("padded", "packed"):
                errors = core_errors(dtype, layout, variant)
                assert max(errors) <= TOLERANCE[dtype], f"{variant} {layout} {dtype}: {errors}"


def core_run(variant, dtype, layout, size=1, emulated=True):
    """This rank's core output and q/k/v gradients (on the emulated kernels) -> (got, the inputs'
    full-sequence tensors q, k, v, grad_out, segment ids)."""
    b, s, heads, d = SHAPE["b"], SHAPE["s"], SHAPE["heads"], SHAPE["d"]
    g = torch.Generator().manual_seed(3)
    inputs = [torch.randn(b, s, heads, d, generator=g, dtype=torch.float64) for _ in range(4)]
    ids = gpu_kernels.segment_ids(layout, b, s)
    options = dict(ulysses_size=2) if variant == "hybrid" else dict(linformer_k=16) if variant == "linformer" else {}
    torch.manual_seed(0)  # Linformer's projections
    core = attention.build(small_config(variant, seq_length=s, max_position_embeddings=s, hidden_size=heads * d,
                                        num_attention_heads=heads, **options)).to(dtype)
    rank, step = state.get_sequence_parallel_rank(), s // size
    local = slice(rank * step, (rank + 1) * step)
    leaves = [x[:, local].to(dtype).requires_grad_(True) for x in inputs[:3]]
    with kernels.emulated_cuda() if emulated else contextlib.nullcontext():
        out = core(*leaves, ids[:, local])
        out.backward(inputs[3][:, local].to(dtype))
    return (out.detach(), *(x.grad for x in leaves)), (*inputs, ids)


def core_errors(dtype, layout, variant="dense", size=1) -> list:
    """Max |error| / max |float64| (over the whole sequence) of this rank's core output and
    gradients on the emulated kernels."""
    got, (q, k, v, grad_out, ids) = core_run(variant, dtype, layout, size)
    rank, step = state.get_sequence_parallel_rank(), q.shape[1] // size
    local = slice(rank * step, (rank + 1) * step)
    if variant == "linformer":  # the same core in one process, float64 (its SP = 1 math: test_linformer_bigbird)
        want, _ = core_run(variant, torch.float64, layout, emulated=False)
    else:
        want = gpu_kernels.reference(q, k, v, grad_out, segment_allowed(ids))
    return [((a.double() - w[:, local]).abs().max() / w.abs().max()).item() for a, w in zip(got, want)]


def spawned_cores(size: int, ulysses: int) -> dict:
    """One rank of an SP = size run: every core's emulated CUDA branch on this rank's chunk."""
    state.initialize(sequence=size, ulysses=ulysses)
    results = {"linformer": {str(dtype): core_run("linformer", dtype, "padded", size)[0]
                             for dtype in (torch.float32, torch.bfloat16)}}  # compared by the caller
    for variant in ["ulysses", "ring"] + (["hybrid"] if ulysses > 1 else []):
        for dtype in (torch.float32, torch.bfloat16):
            for layout in ("padded", "packed"):
                results[variant, str(dtype), layout] = core_errors(dtype, layout, variant, size)
    return results


@pytest.mark.parametrize("size,ulysses", [(2, 1), (4, 2)], ids=["sp2", "sp4-hybrid2x2"])
def test_ulysses_hybrid_ring_and_linformer_cuda_branches_across_ranks(size, ulysses):
    """Real ranks over gloo: Ulysses at SP = 2 and 4, hybrid 2 x 2, the ring and Linformer, on the
    emulated kernels (Linformer calls torch's public SDPA, which prepares its own kernel's inputs:
    here its reduction and math are what is checked)."""
    ranks = run_on_ranks(spawned_cores, size, size, ulysses, timeout=300)
    want, _ = core_run("linformer", torch.float64, "padded", emulated=False)  # the same core at SP = 1
    linformer = [r.pop("linformer") for r in ranks]
    for dtype in (torch.float32, torch.bfloat16):
        for name, w, *chunks in zip(("out", "dq", "dk", "dv"), want, *(r[str(dtype)] for r in linformer)):
            error = ((torch.cat(chunks, 1).double() - w).abs().max() / w.abs().max()).item()
            assert error <= TOLERANCE[dtype], f"linformer sp={size} {dtype} {name}: {error:.1e}"
    for rank, errors in enumerate(ranks):
        for (variant, dtype, layout), values in errors.items():
            tolerance = TOLERANCE[torch.bfloat16 if "bfloat16" in dtype else torch.float32]
            assert max(values) <= tolerance, f"rank {rank} {variant} {dtype} {layout}: {values}"

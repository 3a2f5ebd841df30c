"""Three small CUDA-path fixes (issue 21, item 6), each seen on CPU as far as a CPU can see it:
contiguous pinned staging in `device.to_device`, one flattened all-reduce for the pipeline's
seq-group gradient sum, and fp32 sums in the attention cores' all-reduce (comm.SeqComm.sum:
Linformer's projected K and V, BigBird's global rows).
"""
from types import SimpleNamespace

import torch
import torch.distributed as dist

from bert_fixtures import padded_batch, small_config
from megatron.model.attention import simulate
from megatron.parallel import device, state
from megatron.parallel.spawn import run_on_ranks


def test_to_device_pins_a_contiguous_copy_of_the_rank_slice(monkeypatch):
    """A seq rank's slice of the batch is strided; what `to_device` pins (and hands to the
    non-blocking `.to`) must be contiguous and hold the slice, else the copy to the GPU goes
    through a pageable temporary. Sees: the CUDA branch taken on CPU with `pin_memory` and `.to`
    replaced by recorders, so which tensor is pinned and copied. Cannot see: real page-locked
    memory or the copy running asynchronously (test_cuda_path's CUDA test moves a real slice)."""
    chunk = padded_batch().sequence_chunk(1, 2)
    assert not chunk.tokens.is_contiguous()
    pinned, copied = [], []

    def pin_memory(tensor):
        pinned.append(tensor)
        return tensor

    def to(tensor, target, non_blocking=False):
        copied.append((tensor, torch.device(target), non_blocking))
        return tensor

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    monkeypatch.setattr(torch.Tensor, "to", to)
    moved = device.to_device(chunk, "cuda")
    fields = chunk.tensors()
    assert len(pinned) == len(fields)
    for tensor, (name, original) in zip(pinned, fields.items()):
        assert tensor.is_contiguous(), f"{name}: a strided tensor was pinned"
        assert torch.equal(tensor, original), name
    assert [(id(t), d, nb) for t, d, nb in copied] == [(id(t), torch.device("cuda"), True) for t in pinned]
    assert list(moved.tensors()) == list(fields) and moved.chunk_of == chunk.chunk_of == 2


def _seq_group_all_reduces_per_step(num_layers: int, bf16_optimizer: bool) -> dict:
    """One ReduceTiedGrads step of DeepSpeed's pipeline engine on a SeqParallelPipe at SP = 2
    (pipeline 1, so no tied-stage pairs): all_reduce calls over the seq group, and whether the
    gradient the engine steps with now holds the sum over the ranks (1 + 2)."""
    from deepspeed.runtime.pipe.engine import PipelineEngine

    from megatron.parallel.pipeline import SeqParallelPipe

    state.destroy()
    state.initialize(sequence=2)
    model = SeqParallelPipe(small_config(num_layers=num_layers)).to(torch.bfloat16 if bf16_optimizer else torch.float32)
    rank = dist.get_rank()
    for p in model.parameters():
        if bf16_optimizer:  # BF16_Optimizer's fp32 copy, which the engine reduces and steps with
            p._hp_grad = torch.full(p.shape, rank + 1.0)
            p.grad = torch.full_like(p, 7.0)
        else:
            p.grad = torch.full_like(p, rank + 1.0)
    seq_group, calls = state.get_sequence_parallel_group(), []
    all_reduce = dist.all_reduce

    def counting_all_reduce(tensor, *args, group=None, **kwargs):
        calls.append(group is seq_group)
        return all_reduce(tensor, *args, group=group, **kwargs)

    dist.all_reduce = counting_all_reduce
    try:  # the engine's own ReduceTiedGrads step, on the engine attributes it reads
        PipelineEngine._exec_reduce_tied_grads(SimpleNamespace(
            module=model, using_bf16_optimizer=bf16_optimizer, zero_optimization_partition_gradients=lambda: False))
    finally:
        dist.all_reduce = all_reduce
    params = list(model.parameters())
    summed = all(torch.equal(p._hp_grad if bf16_optimizer else p.grad, torch.full(p.shape, 3.0)) for p in params)
    lp_untouched = not bf16_optimizer or all(torch.equal(p.grad, torch.full_like(p.grad, 7.0)) for p in params)
    return {"seq_group_calls": sum(calls), "parameters": len(params), "summed": summed, "lp_untouched": lp_untouched}


def _pipeline_cases() -> list:
    return [_seq_group_all_reduces_per_step(layers, bf16) for layers in (1, 3) for bf16 in (False, True)]


def test_pipeline_seq_group_sum_is_one_all_reduce():
    """SeqParallelPipe's seq-group gradient sum, run through DeepSpeed 0.19's ReduceTiedGrads step
    (PipelineEngine._exec_reduce_tied_grads, which all-reduces each pair get_tied_weights_and_groups
    returns) on 2 real gloo ranks: ONE all-reduce over the seq group per step at 1 and 3 layers
    (it was one per parameter), every gradient summed, and under the bf16 optimizer its fp32
    copies summed, not the bf16 `.grad`. Cannot see: the tied embedding's reduction over its two
    stages (pipeline 2; test_deepspeed_engine's pipeline x SP tests train it against a single
    process) or NCCL's cost per call."""
    for case in run_on_ranks(_pipeline_cases, 2, timeout=120):
        for result in case:
            assert result["summed"] and result["lp_untouched"], result
            assert result["seq_group_calls"] == 1, result


def _seq_sums(size: int) -> dict:
    """Rank r's bf16 contribution summed over the seq group by comm.SeqComm.sum as the cores call
    it: through Linformer's _AllReduceSum, forward and backward, and directly on a strided view,
    as BigBird sums its global rows' dq. Also the dtypes that reached dist.all_reduce."""
    from megatron.model.attention.comm import SeqComm
    from megatron.model.attention.linformer import _AllReduceSum

    dtypes = []
    all_reduce = dist.all_reduce

    def recording_all_reduce(tensor, *args, **kwargs):
        dtypes.append(tensor.dtype)
        return all_reduce(tensor, *args, **kwargs)

    rank = dist.get_rank()
    seq = SeqComm(None, range(size))
    contribution, grad = _contributions(size)[rank]
    contribution.requires_grad_(True)
    dist.all_reduce = recording_all_reduce
    try:
        total = _AllReduceSum.apply(contribution, seq)
        total.backward(grad)
        dq_global = seq.sum(contribution.detach().view(2, 8, 16).transpose(1, 2))
        wide = seq.sum(torch.full((3,), 1 + rank * 2.0**-40, dtype=torch.float64))  # below fp32's resolution
    finally:
        dist.all_reduce = all_reduce
    return {"dtypes": dtypes, "total": total.detach(), "grad": contribution.grad, "dq_global": dq_global, "wide": wide}


def _contributions(size: int) -> list:
    """(value, upstream gradient) per rank, bf16: values of mixed magnitude, so that partial sums
    rounded to bf16 (8 significant bits) drift from the exact sum."""
    g = torch.Generator().manual_seed(3)
    scales = torch.tensor([1.0, 1e-2, 3e-3, 1e-3])[:size, None]
    return [(value.bfloat16(), grad.bfloat16())
            for value, grad in zip(torch.randn(size, 256, generator=g) * scales, torch.randn(size, 256, generator=g) * scales)]


def test_seq_group_sum_is_fp32():
    """comm.SeqComm.sum on 4 real gloo ranks with bf16 inputs, driven as Linformer (its projected
    K and V, and their gradient) and BigBird (its global rows' dq) drive it: what reaches
    dist.all_reduce is float32 (float64 stays float64), and the result is the exact (fp32) sum rounded to bf16 once. A
    bf16 sum of the same terms, partial sums rounded as a reduction in bf16 would, differs
    (checked here, so the data can tell the two apart; gloo's own bf16 all-reduce fails this
    test). simulate.SimulatedComm must give the same sums. Cannot see: NCCL's own bf16 reduction order on a GPU (the fp32 payload removes the
    dependence on it)."""
    size = 4
    terms = _contributions(size)
    expected = [sum(term[i].float() for term in terms).bfloat16() for i in (0, 1)]
    rounded_each_step = terms[0][0].clone()
    for value, _ in terms[1:]:
        rounded_each_step += value
    assert not torch.equal(rounded_each_step, expected[0])
    for result in run_on_ranks(_seq_sums, size, size, timeout=120):
        assert result["dtypes"] == [torch.float32] * 3 + [torch.float64]  # fp64 is not narrowed
        assert torch.equal(result["wide"], torch.full((3,), size + 6 * 2.0**-40, dtype=torch.float64))
        assert result["total"].dtype == result["grad"].dtype == result["dq_global"].dtype == torch.bfloat16
        assert torch.equal(result["total"], expected[0])
        assert torch.equal(result["grad"], expected[1])
        assert torch.equal(result["dq_global"], expected[0].view(2, 8, 16).transpose(1, 2))
    # simulate.SimulatedComm, which runs the same cores on one GPU (benchmarks/gpu_check.sh), sums the same way
    simulated, _ = simulate.run_virtual_ranks(size, lambda comm: comm.sum(terms[comm.rank][0]))
    assert all(torch.equal(total, expected[0]) for total in simulated)

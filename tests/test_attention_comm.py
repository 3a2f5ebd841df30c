"""NCCL-safe point-to-point and the one-process simulation of the ring and BigBird.

- On gloo at P = 2, 3, 4, the ring and BigBird cores issue their point-to-point operations only
  as dist.batch_isend_irecv batches, in an order that pairs every send with a receive of the
  same size and dtype by issue order alone (what NCCL, which ignores tags, needs), and the ring's
  per-rank sequence, read as (next / previous, direction, size), is the same on every rank.
- The simulated P virtual ranks in one process (attention/simulate.py) give the outputs and
  gradients of the real multi-process run, and record the same exchanges.
"""
import importlib
import inspect
import pkgutil

import pytest
import torch
import torch.distributed as dist

from bert_fixtures import naive_masked_attention, packed_batch, segment_allowed, small_config
from megatron.model import attention
from megatron.model.attention import simulate
from megatron.model.attention.bigbird import BigBirdAttention
from megatron.parallel import state
from megatron.parallel.spawn import run_on_ranks

S, HEADS, D, BLOCK = 48, 2, 8, 4
ITERATION, LAYER, SEED = 2, 3, 1234
BIGBIRD = dict(bigbird_block_size=BLOCK, bigbird_num_window_blocks=3, bigbird_num_random_blocks=2, bigbird_seed=SEED)


def inputs():
    """Packed samples with padding (segments cross chunk boundaries), float32."""
    segment_ids = packed_batch()[0].segment_ids
    g = torch.Generator().manual_seed(11)
    q, k, v, grad_out = (torch.randn(segment_ids.shape[0], S, HEADS, D, generator=g) for _ in range(4))
    return q, k, v, grad_out, segment_ids


def _recorded(log: list):
    batch_isend_irecv = dist.batch_isend_irecv

    def record(ops):
        log.append([(op.peer, "send" if op.op is dist.isend else "recv", op.tensor.numel(), op.tensor.dtype)
                    for op in ops])
        return batch_isend_irecv(ops)
    return record


def real_rank(size: int):
    """This rank's ring and BigBird (out, dq, dk, dv) chunks and the point-to-point batches each issued."""
    state.initialize(sequence=size)
    rank, step = state.get_sequence_parallel_rank(), S // size
    results = {}
    for variant, options in (("ring", {}), ("bigbird", BIGBIRD)):
        core = attention.build(small_config(variant, seq_length=S, hidden_size=HEADS * D, num_attention_heads=HEADS,
                                            **options))
        if isinstance(core, BigBirdAttention):
            core.iteration, core.layer = ITERATION, LAYER
        q, k, v, grad_out, segment_ids = (t[:, rank * step:(rank + 1) * step] for t in inputs())
        q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
        log, original = [], dist.batch_isend_irecv
        dist.batch_isend_irecv = _recorded(log)
        try:
            out = core(q, k, v, segment_ids)
            out.backward(grad_out)
        finally:
            dist.batch_isend_irecv = original
        results[variant] = ((out.detach(), q.grad, k.grad, v.grad), log)
    return results


def simulated(variant: str, size: int):
    q, k, v, grad_out, segment_ids = inputs()
    if variant == "ring":
        return simulate.ring_attention(q, k, v, segment_ids, grad_out, size)
    return simulate.bigbird_attention(q, k, v, segment_ids, grad_out, size, BLOCK, window=3, num_random=2,
                                      seed=SEED, iteration=ITERATION, layer=LAYER)


def relative(got, want):
    return ((got - want).abs().max() / want.abs().max().clamp(min=1e-30)).item()


@pytest.mark.parametrize("size", [2, 3, 4])
def test_p2p_pairs_by_issue_order_and_simulation_equals_real_run(size):
    per_rank = run_on_ranks(real_rank, size, size)
    for variant in ("ring", "bigbird"):
        logs = [result[variant][1] for result in per_rank]
        assert all(logs), f"{variant}: no point-to-point batch recorded"
        simulate.check_pairing(logs)
        if variant == "ring":  # every rank: the same (direction, size) sequence, each batch a send to
            # the next rank then a receive from the previous one; forward: P - 1 K/V shifts,
            # backward: P - 1 K/V and P dK/dV shifts
            shapes = [[[op[1:] for op in batch] for batch in log] for log in logs]
            assert all(shape == shapes[0] for shape in shapes), shapes
            assert len(logs[0]) == 3 * (size - 1) + 1
            assert all([op[:2] for op in batch] == [((r + 1) % size, "send"), ((r - 1) % size, "recv")]
                       for r, log in enumerate(logs) for batch in log)
        real = [torch.cat(parts, 1) for parts in zip(*(result[variant][0] for result in per_rank))]
        sim, comms = simulated(variant, size)
        assert [c.log for c in comms] == logs, f"{variant}: the simulation exchanged differently"
        for index, (name, got, want) in enumerate(zip(("out", "dq", "dk", "dv"), sim, real)):
            assert relative(got, want) <= 1e-6, mismatch(variant, size, index, got, want)


def mismatch(variant, size, index, sim, real) -> str:
    """The failure message of a simulation that differs from the real run: which side moved
    (the simulation run again, and for the ring both sides against float64) and where."""
    name = ("out", "dq", "dk", "dv")[index]
    where = tuple(int(i) for i in torch.unravel_index((sim - real).abs().argmax(), sim.shape))
    message = (f"{variant} P={size} {name}: simulation vs real run {relative(sim, real):.1e} at {where}; "
               f"simulation run again vs first {relative(simulated(variant, size)[0][index], sim):.1e}")
    if variant == "ring":
        exact = naive(*inputs())[index]
        message += (f"; vs float64: simulation {relative(sim.double(), exact):.1e}, "
                    f"real run {relative(real.double(), exact):.1e}")
    return message


def naive(q, k, v, grad_out, segment_ids, allowed=None):
    q, k, v = (t.double().requires_grad_(True) for t in (q, k, v))
    allowed = segment_allowed(segment_ids) if allowed is None else allowed
    out = naive_masked_attention(q, k, v, allowed)
    out.backward(grad_out.double())
    return out.detach(), q.grad, k.grad, v.grad


def test_simulated_ring_and_bigbird_equal_reference_in_one_process():
    """The simulation alone at P = 4 (no process spawned): ring vs float64 softmax attention,
    BigBird at P = 4 vs the same BigBird at P = 1."""
    q, k, v, grad_out, segment_ids = inputs()
    want = naive(q, k, v, grad_out, segment_ids)
    got, _ = simulated("ring", 4)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        assert relative(a.double(), b) <= 1e-5, name
    single, _ = simulated("bigbird", 1)
    got, _ = simulated("bigbird", 4)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, single):
        assert relative(a, b) <= 1e-5, name


def test_simulation_reports_unpaired_exchanges():
    def unpaired(comm):
        if comm.rank == 0:
            comm.exchange({1: torch.zeros(3)}, {})
        else:
            comm.exchange({}, {0: torch.zeros(4)})
    with pytest.raises(RuntimeError, match="virtual rank"):
        simulate.run_virtual_ranks(2, unpaired)
    with pytest.raises(AssertionError, match="sends"):
        simulate.check_pairing([[[(1, "send", 3, torch.float32)]], [[(0, "recv", 4, torch.float32)]]])


def test_cores_use_no_bare_point_to_point():
    """Only comm.SeqComm talks to torch.distributed: no isend/irecv with tags, no all-reduce in
    the dtype of the tensor (SeqComm.sum's is fp32), no all-gather of its own in any core or
    helper (DeepSpeed's all-to-alls in Ulysses and hybrid aside)."""
    for module in attention_modules():
        if module.__name__ != "megatron.model.attention.comm":
            assert "torch.distributed" not in inspect.getsource(module), module.__name__


def attention_modules() -> list:
    """Every module of the megatron.model.attention package."""
    names = (info.name for info in pkgutil.iter_modules(attention.__path__))
    return [importlib.import_module(f"{attention.__name__}.{name}") for name in names]

"""Ring, local (halo) and BigBird cores on random packed layouts, against the definition (a masked softmax over
the keys a query may see), at P = 1..4 virtual seq ranks (attention/simulate.py: the multi-rank
schedules unchanged, their hand-offs between threads; other tests hold it equal to real processes).

The fixed layouts of the other tests show the cases their authors thought of; these are drawn: segment
ends on chunk and 64-row tile boundaries, 1-token segments, padding tails, all-padding samples, odd and
even windows, windows wider than the sequence, BigBird's block patterns of every window and random count the
start-up checks allow. Each core runs its CPU branch (fp32: the CPU flash backward takes no float64) and
its CUDA branch on the emulated kernels (attention/kernels.py: every call checked against the CUDA
kernel's contract, memory read as that kernel reads it) in fp32 and bf16. What they see: the drawn
layouts' math and the CUDA branches' calls as the contracts state them; not the real CUDA kernels'
rounding or any assumption the contracts table does not state (benchmarks/gpu_check.sh runs those)."""
import contextlib
import random

import pytest
import torch

from bert_fixtures import bigbird_allowed, naive_masked_attention, segment_allowed
from megatron.model.attention import kernels, simulate
from megatron.model.attention.bigbird import block_pattern

TRIALS = 60
TOLERANCE = 2e-5  # fp32; the worst seen over 580 trials was 2.3e-6
# branch: (dtype, head dim: the CUDA kernels take multiples of 8, trials, tolerance: max |error| / max |float64|)
BRANCHES = {"cpu": (torch.float32, 4, TRIALS, TOLERANCE), "emulated cuda fp32": (torch.float32, 8, 20, TOLERANCE),
            "emulated cuda bf16": (torch.bfloat16, 8, 20, 2e-2)}


def random_layout(length: int, ranks: int, rng: random.Random) -> list:
    """Segment ids 1..k then padding 0; a tenth of the samples all padding; ends drawn onto chunk and
    tile boundaries often."""
    if rng.random() < 0.1:
        return [0] * length
    chunk, ids, position = length // ranks, [], 0
    padding_from = length if rng.random() < 0.5 else rng.randrange(length + 1)
    while position < padding_from:
        if rng.random() < 0.4:
            boundary = (position // chunk + 1) * chunk if rng.random() < 0.7 else (position // 64 + 1) * 64
            size = max(1, boundary - position)
        else:
            size = rng.choice([1, 1, 2, 3, rng.randrange(1, length + 1)])
        size = min(size, padding_from - position)
        ids += [len(set(ids)) + 1] * size
        position += size
    return ids + [0] * (length - len(ids))


def windowed(allowed, window: int):
    positions = torch.arange(allowed.shape[-1])
    return allowed & ((positions[:, None] - positions[None, :]).abs() <= window // 2)


def bigbird_case(rng: random.Random, ranks: int) -> tuple:
    """(length, block, window, random blocks, seed) that the start-up checks (attention/rules.py BigBird) accept:
    at least window + 2 + random blocks, every rank holding window // 2 blocks or more."""
    block, window, num_random = rng.choice([1, 2, 4, 8]), rng.choice([1, 3, 5]), rng.choice([0, 1, 2])
    per_rank = max(rng.choice([1, 2, 3, 5]), window // 2, -(-(window + 2 + num_random) // ranks))
    return ranks * per_rank * block, block, window, num_random, rng.randrange(1000)


@pytest.mark.parametrize("branch", BRANCHES)
@pytest.mark.parametrize("core", ["ring", "local", "bigbird"])
def test_cores_on_random_packed_layouts_equal_the_definition(core, branch, monkeypatch):
    dtype, head_dim, trials, tolerance = BRANCHES[branch]
    emulated, ops = [], kernels.ops  # whether each kernel call took the emulation's namespace
    monkeypatch.setattr(kernels, "ops", lambda: emulated.append(kernels._emulating > 0) or ops())
    rng = random.Random(f"fuzz-{core}")
    for trial in range(trials):
        ranks = rng.choice([1, 2, 3, 4])
        length = ranks * rng.choice([3, 5, 16, 33, 48, 70])
        if core == "bigbird":
            length, block, window, num_random, seed = bigbird_case(rng, ranks)
        elif core == "local":
            window = rng.choice([1, 2, 3, 5, 8, 17, 2 * length + 3])
        segment_ids = torch.tensor([random_layout(length, ranks, rng) for _ in range(2)])
        generator = torch.Generator().manual_seed(trial)
        q, k, v, grad_out = (torch.randn(2, length, 2, head_dim, generator=generator).to(dtype) for _ in range(4))
        allowed = segment_allowed(segment_ids)
        with kernels.emulated_cuda() if branch != "cpu" else contextlib.nullcontext():
            if core == "ring":
                got, comms = simulate.ring_attention(q, k, v, segment_ids, grad_out, ranks)
            elif core == "bigbird":
                got, comms = simulate.bigbird_attention(q, k, v, segment_ids, grad_out, ranks, block, window,
                                                        num_random, seed, iteration=trial)
            else:
                got, comms = simulate.local_attention(q, k, v, segment_ids, grad_out, ranks, window)
        if core == "bigbird":
            allowed = allowed & bigbird_allowed(*block_pattern(length // block, window, num_random, seed, trial, 0),
                                                block)
        elif core == "local":
            allowed = windowed(allowed, window)
        simulate.check_pairing([comm.log for comm in comms])
        leaves = [t.double().requires_grad_(True) for t in (q, k, v)]  # the inputs as rounded to dtype
        want = naive_masked_attention(*leaves, allowed)
        want.backward(grad_out.double())
        for name, a, b in zip(("out", "dq", "dk", "dv"), got, (want, *(t.grad for t in leaves))):
            error = float((a.double() - b).detach().abs().max()) / max(1.0, float(b.detach().abs().max()))
            assert error <= tolerance, (branch, trial, name, ranks, length, segment_ids.tolist(), error)
    assert set(emulated) == {branch != "cpu"}, "the CUDA branch took a real kernel, or the CPU branch the emulation"

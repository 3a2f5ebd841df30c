"""Exactness: a small BERT at SP = P gives the loss, gradients and AdamW trajectory of SP = 1.

The SP runs are real processes over gloo; the reference is the same variant in this process
with no distributed setup. Tolerance: max |diff| <= 1e-5 x the tensor's own max magnitude (for parameters, at least 1).
"""
import pytest
import torch
import torch.distributed as dist

from bert_fixtures import padded_batch, small_config, small_model
from megatron.engine import optimizer_groups
from megatron.model.loss import bert_batch_loss
from megatron.parallel import state
from megatron.parallel.grads import allreduce_sequence_parallel_grads
from megatron.parallel.reduce import sum_over_sequence
from megatron.parallel.spawn import run_on_ranks

STEPS = 3
REL_TOL = 1e-5
# Adam divides by sqrt(v) + eps: a gradient that is analytically zero and holds only rounding
# noise (~1e-10, e.g. the key bias, to which softmax is blind) would be scaled up to +-lr and
# make the comparison about noise. eps = 1e-6 keeps it about the math (true gradients here are
# 1e-5 and larger, where it changes the update by < 10%).
ADAM = dict(lr=1e-3, weight_decay=0.01, eps=1e-6)


def train_steps(attention: str, sequence_parallel_size: int, before_step=None, **overrides) -> dict:
    """Three AdamW steps on this rank's chunk; returns losses, first-step grads, final params.
    `before_step(model, step)` runs before each step; `overrides` go to small_config."""
    if sequence_parallel_size > 1:
        state.initialize(sequence=sequence_parallel_size)
    model = small_model(small_config(attention, **overrides))
    chunk = padded_batch().sequence_chunk(state.get_sequence_parallel_rank(), sequence_parallel_size)
    optimizer = torch.optim.AdamW(optimizer_groups(model), **ADAM)  # the trainer's: no decay on norms and biases
    losses, first_grads = [], None
    for step in range(STEPS):
        if before_step is not None:
            before_step(model, step)
        optimizer.zero_grad()
        mlm_logits, sop_logits = model(*chunk.model_inputs())
        loss = bert_batch_loss(mlm_logits, sop_logits, chunk, sum_over_sequence)
        loss.total.backward()
        allreduce_sequence_parallel_grads(model.parameters())
        whole = loss.total.detach().clone()
        if sequence_parallel_size > 1:
            dist.all_reduce(whole, group=state.get_sequence_parallel_group())
        losses.append(whole.item())
        if step == 0:
            first_grads = {name: p.grad.clone() for name, p in model.named_parameters()}
        optimizer.step()
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    return {"losses": losses, "grads": first_grads, "params": params}


def max_relative_diff(actual: dict, expected: dict, floor: float = 1e-12) -> float:
    """max over tensors of max|actual - expected| / max(floor, max|expected|)."""
    worst = 0.0
    for name, ref in expected.items():
        scale = ref.abs().max().clamp(min=floor)
        worst = max(worst, ((actual[name] - ref).abs().max() / scale).item())
    return worst


@pytest.fixture(scope="module")
def references():
    return {attention: train_steps(attention, 1) for attention in ("ring", "ulysses")}


@pytest.mark.parametrize("attention,size", [("ring", 2), ("ring", 3), ("ring", 4), ("ulysses", 2), ("ulysses", 4)])
def test_sequence_parallel_matches_single_rank(references, attention, size):
    assert_runs_match(run_on_ranks(train_steps, size, attention, size), references[attention], f"{attention} sp={size}")


def assert_runs_match(results: list, expected: dict, label: str) -> None:
    """Every rank's train_steps result has the losses, gradients and parameters of `expected`."""
    for rank, result in enumerate(results):
        assert result["losses"] == pytest.approx(expected["losses"], rel=REL_TOL), f"rank {rank} losses"
        grad_diff = max_relative_diff(result["grads"], expected["grads"])
        # Parameters that start at zero (biases) hold only ~lr-sized values after 3 steps, so
        # they are measured against a floor of 1: effectively an absolute 1e-5.
        param_diff = max_relative_diff(result["params"], expected["params"], floor=1.0)
        print(f"{label} rank {rank}: max grad diff {grad_diff:.2e}, max param diff {param_diff:.2e}")
        assert grad_diff <= REL_TOL
        assert param_diff <= REL_TOL


def test_reference_variants_agree_with_dense(references):
    """ring and ulysses at SP=1 are both plain attention: they match the dense SDPA variant."""
    dense = train_steps("dense", 1)
    for attention, result in references.items():
        assert result["losses"] == pytest.approx(dense["losses"], rel=REL_TOL), attention
        assert max_relative_diff(result["grads"], dense["grads"]) <= REL_TOL, attention

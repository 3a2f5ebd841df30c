"""Modern encoder layers under sequence parallelism: a small ModernBERT-shaped model (rope with a
global and a local theta, local sliding-window layers with a global layer every third, GeGLU, no
biases, pre-LN without a first attention norm) at SP 2 and 4, with ring, Ulysses or hybrid 2 x 2
global layers and halo-exchanging local layers, gives the SP = 1 hidden states, loss and every
gradient on padded and packed batches (segments crossing chunk boundaries, chunks of padding,
chunks of 12 tokens shorter than the window's 16 each side at SP = 4); and the same through
DeepSpeed with a pipeline and with ZeRO 2 and 3. Real ranks over gloo, CPU kernels only (the CUDA
branches of the cores are held to their contracts in test_cuda_emulated and test_local_attention).
"""
from unittest import mock

import pytest
import torch

import test_deepspeed_engine as engine_tests
from bert_fixtures import packed_batch, padded_batch, small_config, small_model
from megatron.model.attention import local
from megatron.model.loss import bert_batch_loss
from megatron.parallel import state
from megatron.parallel.reduce import sum_over_sequence
from megatron.parallel.spawn import run_on_ranks
from test_sequence_parallel_bert import REL_TOL, max_relative_diff

MODERN = dict(position_embedding_type="rope", rotary_base=1000.0, local_rotary_base=100.0, local_attention_window=32,
              global_attention_every=3, mlp_type="geglu", ffn_hidden_size=48, add_bias_linear=False,
              layernorm_layout="pre", first_layer_attention_norm=False, num_layers=3, type_vocab_size=0)
BATCHES = {"padded": padded_batch, "packed": lambda: packed_batch()[0]}


def model_chunk(attention: str, batch: str, size: int, **options):
    """This rank's final hidden states, loss share and gradients (local layers in tiles of 8 rows:
    several per chunk, as at real lengths)."""
    model = small_model(small_config(attention, **MODERN, **options))
    hidden = []
    model.final_layernorm.register_forward_hook(lambda module, inputs, output: hidden.append(output.detach()))
    chunk = BATCHES[batch]().sequence_chunk(state.get_sequence_parallel_rank(), size)
    with mock.patch.object(local, "_TILE_ROWS", 8):
        loss = bert_batch_loss(*model(*chunk.model_inputs()), chunk, sum_over_sequence).total
        loss.backward()
    return hidden[0], loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def rank_chunks(size: int, ulysses: int) -> dict:
    state.initialize(sequence=size, ulysses=ulysses)
    variants = {"ring": {}, "ulysses": {}} | ({"hybrid": dict(ulysses_size=ulysses)} if ulysses > 1 else {})
    return {(variant, batch): model_chunk(variant, batch, size, **options)
            for variant, options in variants.items() for batch in BATCHES}


@pytest.mark.parametrize("size,ulysses", [(2, 1), (4, 2)], ids=["sp2", "sp4-hybrid2x2"])
def test_modern_model_under_sequence_parallelism_equals_one_rank(size, ulysses):
    ranks = run_on_ranks(rank_chunks, size, size, ulysses, timeout=300)
    for (variant, batch) in ranks[0]:
        hidden, loss, grads = model_chunk("dense", batch, 1)
        label = f"{variant} sp={size} {batch}"
        got = torch.cat([r[variant, batch][0] for r in ranks], dim=1)
        real = BATCHES[batch]().segment_ids != 0
        error = ((got - hidden)[real].abs().max() / hidden[real].abs().max()).item()
        assert error <= REL_TOL, f"{label} hidden: {error:.1e}"
        assert sum(r[variant, batch][1] for r in ranks).item() == pytest.approx(loss.item(), rel=REL_TOL), label
        summed = {name: sum(r[variant, batch][2][name] for r in ranks) for name in grads}
        assert max_relative_diff(summed, grads) <= REL_TOL, f"{label} gradients"


def modern_engine_runs(runs: list) -> list:
    engine_tests.ATTENTION_OPTIONS["ring"] = MODERN
    return engine_tests.deepspeed_runs(runs)


def test_modern_model_through_deepspeed_pipeline_and_zero():
    """pp 2 x sp 2 (ZeRO 1) and sp 2 x dp 2 (ZeRO 2 and 3), 3 AdamW steps on padded and packed
    micro-batches: the single process's losses, gradient norms and parameters."""
    runs = [(2, 2, 2, 1, 2), (1, 2, 1, 2, 2), (1, 2, 1, 3, 2)]  # (pipeline, micro, accumulation, ZeRO, sequence)
    per_rank = run_on_ranks(modern_engine_runs, 4, runs, timeout=420)
    engine_tests.ATTENTION_OPTIONS["ring"] = MODERN
    try:
        expected = engine_tests.reference_run(2)
        for index, (pipeline, _, _, zero, sequence) in enumerate(runs):
            engine_tests.check_against_reference([r[index] for r in per_rank], micro=2, expected=expected,
                                                 label=f"modern pp{pipeline} sp{sequence} zero{zero}")
    finally:
        engine_tests.ATTENTION_OPTIONS["ring"] = {}

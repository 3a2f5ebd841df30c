"""Layout-independent initialisation (model/init.py): the same seed gives bit-identical starting
weights whatever the pipeline, sequence, data degree or ZeRO stage, so a layout change moves
only the rounding. (Each pipeline stage used to draw its own layers from the global generator:
a PP=2 run's first loss was 1.3e-2 away from the PP=1 run's.)
"""
import math
import warnings

import pytest
import torch

from bert_fixtures import small_config
from megatron.config import resolve
from megatron.engine import build_engine, train_step
from megatron.model.bert import BertModel
from megatron.model.loss import bert_batch_loss
from megatron.parallel import state
from megatron.parallel.spawn import run_on_ranks
from test_deepspeed_engine import ds_config, micro_batches, model_flags
from test_sequence_parallel_bert import REL_TOL

SEED = 4321
LAYERS = 4  # four pipeline stages of one transformer layer each


def config(**overrides):
    return small_config(**{"num_layers": LAYERS, **overrides})


def fresh_model(**overrides) -> BertModel:
    torch.manual_seed(SEED)
    return BertModel(config(**overrides))


def test_megatron_rules_and_keyed_draws():
    """N(0, std), std / sqrt(2 L) on the residual-stream outputs, zero biases; a parameter's
    values depend on the seed and its name only, not on what was drawn before it."""
    model = fresh_model()
    params = dict(model.named_parameters())
    std = model.config.init_method_std
    assert params["layers.0.attention.query_key_value.weight"].std().item() == pytest.approx(std, rel=0.05)
    assert params["layers.0.attention.dense.weight"].std().item() == pytest.approx(std / math.sqrt(2 * LAYERS), rel=0.1)
    assert params["layers.3.mlp.dense_4h_to_h.weight"].std().item() == pytest.approx(std / math.sqrt(2 * LAYERS), rel=0.1)
    assert not params["layers.0.mlp.dense_h_to_4h.bias"].any() and not params["lm_head.bias"].any()
    assert torch.equal(params["final_layernorm.weight"], torch.ones(model.config.hidden_size))

    torch.manual_seed(SEED)
    torch.rand(1000)  # the global generator moved on: the keyed draws do not see it
    two_layers = BertModel(config(num_layers=2))
    for name, param in two_layers.named_parameters():
        if "attention.dense.weight" not in name and "dense_4h_to_h.weight" not in name:  # std depends on depth
            assert torch.equal(param, params[name]), name
    torch.manual_seed(SEED + 1)
    assert not torch.equal(BertModel(config()).embeddings.word_embeddings.weight,
                           params["embeddings.word_embeddings.weight"])
    linformer = [fresh_model(attention="linformer", linformer_k=8) for _ in range(2)]
    assert torch.equal(*(m.layers[1].attention.core.key_projection for m in linformer))


def initial_weights_per_layout() -> dict:
    """On 4 ranks, this rank's starting weights (BertModel names) in several layouts, plus a
    PP=2 x DP=2 run's first loss. Every layout builds from torch.manual_seed(SEED) alone."""
    import deepspeed
    from megatron.model.pipe import pipe_to_bert_name
    from megatron.parallel.pipeline import SeqParallelPipe

    def bert_named(module, pipeline: bool) -> dict:
        return {pipe_to_bert_name(name, LAYERS) if pipeline else name: p.detach().clone()
                for name, p in module.named_parameters()}

    def build(pipeline: int, sequence: int, zero_stage: int = 1):
        state.destroy()
        torch.manual_seed(SEED)
        flags = {**model_flags(), "num_layers": LAYERS, "pipeline_parallel_size": pipeline}
        return resolve(flags, ds_config(2, 2 // (4 // pipeline // sequence), zero_stage, sequence), 4)

    out = {}
    for pipeline, sequence in ((4, 1), (2, 2)):  # the stage modules alone
        resolved = build(pipeline, sequence)
        state.initialize(pipeline=pipeline, sequence=sequence)
        model = SeqParallelPipe(resolved.model)
        out[f"pp{pipeline} sp{sequence}"] = bert_named(model, pipeline=True)
        with warnings.catch_warnings(record=True) as caught:  # an op of the construction left in autograd
            warnings.simplefilter("always")
            sum(p.sum() for p in model.parameters()).backward()
        out[f"pp{pipeline} sp{sequence} backward warnings"] = [str(w.message)[:60] for w in caught]
    engine = build_engine(build(2, 1))
    out["pp2 dp2 zero1"] = bert_named(engine.module, pipeline=True)
    mine = micro_batches(2)[state.get_data_parallel_rank():][:1]
    step = train_step(engine, mine)
    out["pp2 dp2 first loss"] = (step.loss, step.mlm, step.mlm_accuracy)
    engine = build_engine(build(1, 2, zero_stage=3))
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
        out["sp2 dp2 zero3"] = bert_named(engine.module, pipeline=False)
    return out


def test_every_layout_starts_from_the_single_process_weights():
    """PP 4, PP 2 x SP 2, PP 2 x DP 2 and ZeRO 3 x SP 2 x DP 2: bit-identical to BertModel with
    the same seed; the PP=2 run's first loss, MLM loss and accuracy are the single process's."""
    per_rank = run_on_ranks(initial_weights_per_layout, 4, timeout=300)
    expected = fresh_model()
    reference = dict(expected.named_parameters())
    for layout in ("pp4 sp1", "pp2 sp2", "pp2 dp2 zero1", "sp2 dp2 zero3"):
        # DeepSpeed broadcasts the tied embedding at construction: recorded by autograd, it warns
        # "c10d::broadcast_: an autograd kernel was not registered" in every backward
        assert not any(r.get(f"{layout} backward warnings") for r in per_rank), [r.get(f"{layout} backward warnings") for r in per_rank]
        seen = set()
        for rank, result in enumerate(per_rank):
            for name, param in result[layout].items():
                assert torch.equal(param, reference[name]), f"{layout} rank {rank}: {name}"
            seen |= set(result[layout])
        assert seen == set(reference), f"{layout}: parameters missing from every rank"
    batches = micro_batches(2)
    with torch.no_grad():  # total, mlm and its accuracy, which the last stage computes and every stage logs
        losses = [bert_batch_loss(*expected(*b.model_inputs()), b) for b in batches]
    want = [sum(getattr(loss, part) for loss in losses).item() / len(losses) for part in ("total", "mlm", "mlm_accuracy")]
    for rank, result in enumerate(per_rank):
        print(f"rank {rank}: pp2 dp2 first loss {result['pp2 dp2 first loss']!r}, single process {want!r}")
        assert result["pp2 dp2 first loss"] == pytest.approx(want, rel=REL_TOL)

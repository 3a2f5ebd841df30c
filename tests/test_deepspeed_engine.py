"""Training through DeepSpeed equals single-process training on the same global batch.

Both engine paths (plain model with ZeRO 0-3, PipelineModule with ZeRO 0/1) at several
(pipeline, data, sequence) layouts, 3 AdamW steps with gradient clipping, on a global batch of
padded and packed samples. The reference runs
the same micro-batches in this process: gradient = mean over micro-batches, clipped to norm 1.
Clipping both sides to the same norm hides a constant factor in the gradients, so every run also
compares its logged gradient norms (taken before clipping) with the reference's, and the ZeRO x SP
test compares the first step's gradients before the optimizer step, with clipping off.
"""
import functools

import pytest
import torch

from bert_fixtures import concat_batches, packed_batch, padded_batch, small_config, small_model, with_fp16_kernels_allowed
from megatron.config import resolve
from megatron.engine import (build_engine, check_precision_supported, clip_grads, eval_step, optimizer_groups,
                             real_flops_per_sample, skip_nonfinite_updates, train_step)
from megatron import optimizer_state
from megatron.errors import ConfigError
from megatron.model.attention.bigbird import set_iteration
from megatron.model.bert import SelfAttention
from megatron.model.loss import bert_batch_loss
from megatron.model.pipe import bert_to_pipe_name
from megatron.parallel import state
from megatron.parallel.spawn import run_on_ranks
from megatron.training import set_attention_iteration
from test_sequence_parallel_bert import ADAM, REL_TOL, STEPS, max_relative_diff

GLOBAL_BATCH = 4
CLIP = 1.0
NO_CLIP = 1e6  # DeepSpeed computes (and logs) the gradient norm only when clipping is on; this never clips
ATTENTION_OPTIONS = {"ring": {}, "linformer": {"linformer_k": 8}, "bigbird": {"bigbird_block_size": 4}}


def ds_config(micro: int, gas: int, zero_stage: int, sequence: int, attention: str = "ring", clip: float = CLIP) -> dict:
    return {
        "train_batch_size": GLOBAL_BATCH, "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": gas, "gradient_clipping": clip, "steps_per_print": 10 ** 9,
        "optimizer": {"type": "AdamW", "params": {**ADAM, "torch_adam": True}},
        "zero_optimization": {"stage": zero_stage},
        "sequence_parallel": {"size": sequence, "attention": attention},
    }


def micro_batches(micro: int, attention: str = "ring") -> list:
    """Two padded samples, then two packed ones (PACKED_LAYOUTS: segments across the seq chunks),
    except for linformer, which refuses packing."""
    batch = padded_batch()
    if attention != "linformer":
        batch = concat_batches(batch.samples(0, 2), packed_batch()[0].samples(0, 2))
    return [batch.samples(i, i + micro) for i in range(0, GLOBAL_BATCH, micro)]


def model_flags(attention: str = "ring") -> dict:
    config = small_config(attention, **ATTENTION_OPTIONS[attention])
    names = ("vocab_size", "hidden_size", "num_layers", "num_attention_heads", "seq_length",
             "max_position_embeddings", "hidden_dropout", "attention_dropout", "make_vocab_size_divisible_by",
             *ATTENTION_OPTIONS[attention])
    return {name: getattr(config, name) for name in names}


def deepspeed_run(pipeline: int, micro: int, gas: int, zero_stage: int, sequence: int, attention: str = "ring",
                  checkpoint_interval: int = 0, precision: str | None = None, compile_mlp: bool = False,
                  clip: float = CLIP) -> dict:
    """`clip` = NO_CLIP (plain model only): also returns the first step's full gradients, read
    just before DeepSpeed's optimizer step, and the logged gradient norms."""
    ds = ds_config(micro, gas, zero_stage, sequence, attention, clip)
    if precision:
        ds[precision] = {"enabled": True, **({"dtype": "float16"} if precision == "torch_autocast" else {})}
    config = resolve({**model_flags(attention), "pipeline_parallel_size": pipeline,
                      "activation_checkpoint_interval": checkpoint_interval, "compile_mlp": compile_mlp}, ds,
                     torch.distributed.get_world_size())
    graphs_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]  # an earlier run's, in deepspeed_runs
    engine = build_engine(config, bert_state=small_model(config.model).state_dict())
    attention_modules = [m for m in engine.module.modules() if isinstance(m, SelfAttention)]
    calls = []
    for module in attention_modules:
        module.register_forward_hook(lambda *_: calls.append(1))
    first_grads = {}
    if clip == NO_CLIP:
        _capture_first_grads(engine, first_grads)
    mine = micro_batches(micro, attention)[state.get_data_parallel_rank() * gas:][:gas]
    steps = []
    for iteration in range(STEPS):
        set_attention_iteration(engine, iteration)  # BigBird: new random blocks each step
        steps.append(train_step(engine, mine))
    losses = [step.loss for step in steps]
    # forward passes per attention module and micro-batch: 2 when recomputed in backward
    passes = len(calls) / (len(attention_modules) * gas * STEPS) if attention_modules else None  # a stage of no layer
    eval_loss, training_after_eval = evaluated(engine, mine)
    if pipeline > 1:  # DeepSpeed's eval_batch leaves its module in eval mode; its train_batch sets training mode
        training_after_eval = None
    module = engine.module
    if zero_stage == 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(module.parameters())):
            params = {name: p.detach().clone() for name, p in module.named_parameters()}
    else:
        params = {name: p.detach().clone() for name, p in module.named_parameters()}
    if pipeline > 1:  # back to BertModel names for this stage's parameters
        to_bert = {bert_to_pipe_name(name, config.model.num_layers): name
                   for name in small_model(config.model).state_dict()}
        params = {to_bert[name]: p for name, p in params.items()}
    compiled_graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs_before
    # plain model: layers that start a checkpointed chunk (the others run inside one)
    chunks = sum(isinstance(layer.forward, functools.partial) for layer in getattr(module, "layers", []))
    return {"losses": losses, "params": params, "passes": passes, "dtype": next(module.parameters()).dtype,
            "compiled_graphs": compiled_graphs, "chunks": chunks, "grads": first_grads,
            "grad_norms": [step.grad_norm for step in steps], "parts": [(step.mlm, step.sop) for step in steps],
            "batch_statistics": [(step.real_token_share, step.segments_per_sample, step.real_flops_per_sample)
                                 for step in steps],
            "eval_loss": eval_loss, "training_after_eval": training_after_eval}


def evaluated(engine, micro_batches: list) -> tuple:
    """(eval_step's loss, whether the model is in training mode after it), with hidden dropout 0.5
    switched on for it: eval mode must turn it off again (the reference evaluates without dropout)."""
    dropouts = [m for m in engine.module.modules() if isinstance(m, torch.nn.Dropout)]
    for module in dropouts:
        module.p = 0.5
    loss = eval_step(engine, micro_batches)
    for module in dropouts:
        module.p = 0.0
    return loss, engine.module.training


def _capture_first_grads(engine, grads: dict) -> None:
    """Fills `grads` with the full (reduced, unclipped) gradients at the first optimizer step."""
    from deepspeed.utils import safe_get_full_grad

    step = engine.step

    def capture_then_step(*args, **kwargs):
        if not grads and engine.is_gradient_accumulation_boundary():
            grads.update({name: safe_get_full_grad(p).clone() for name, p in engine.module.named_parameters()})
        return step(*args, **kwargs)

    engine.step = capture_then_step


def deepspeed_runs(runs: list) -> list:
    """Several deepspeed_run calls (argument tuples) in one set of ranks, each with fresh groups and
    compiling afresh, as in a process of its own (torch.compile caches by code, not by model)."""
    results = []
    for args in runs:
        state.destroy()
        torch._dynamo.reset()
        results.append(deepspeed_run(*args))
    return results


def reference_run(micro: int, attention: str = "ring", clip: float = CLIP) -> dict:
    config = small_config(attention, **ATTENTION_OPTIONS[attention])
    model = small_model(config)
    optimizer = torch.optim.AdamW(optimizer_groups(model), **ADAM)  # the engine's groups: no decay on norms, biases
    batches = micro_batches(micro, attention)
    losses, grad_norms, first_grads, parts = [], [], None, []
    for iteration in range(STEPS):
        set_iteration(model, iteration)
        optimizer.zero_grad()
        total, mlm, sop = 0.0, 0.0, 0.0
        for batch in batches:
            terms = bert_batch_loss(*model(*batch.model_inputs()), batch)
            loss = terms.total / len(batches)
            loss.backward()
            total += loss.item()
            mlm, sop = mlm + terms.mlm.item() / len(batches), sop + terms.sop.item() / len(batches)
        parts.append((mlm, sop))
        if first_grads is None:
            first_grads = {name: p.grad.clone() for name, p in model.named_parameters()}
        grad_norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), clip).item())
        optimizer.step()
        losses.append(total)
    model.eval()
    with torch.no_grad():
        eval_loss = sum(bert_batch_loss(*model(*batch.model_inputs()), batch).total.item() for batch in batches)
    whole = concat_batches(*batches)  # the global batch's statistics, which every layout logs
    statistics = (whole.real_token_share(), whole.segments_per_sample(), real_flops_per_sample(config, batches))
    return {"losses": losses, "params": {name: p.detach().clone() for name, p in model.named_parameters()},
            "grads": first_grads, "grad_norms": grad_norms, "parts": parts, "eval_loss": eval_loss / len(batches),
            "batch_statistics": statistics}


def check_against_reference(results: list, micro: int, label: str, attention: str = "ring", clip: float = CLIP,
                            expected: dict | None = None) -> None:
    expected = expected or reference_run(micro, attention, clip)
    seen = set()
    for rank, result in enumerate(results):
        assert result["losses"] == pytest.approx(expected["losses"], rel=REL_TOL), f"{label} rank {rank} losses"
        # the logged MLM and SOP terms, which the pipeline's loss function collects on its last stage
        assert all(got == pytest.approx(want, rel=REL_TOL) for got, want in zip(result["parts"], expected["parts"])), \
            f"{label} rank {rank} mlm/sop: {result['parts']} vs {expected['parts']}"
        # eval_step: the mean over micro-batches in eval mode; the plain model goes back to training mode
        assert result["eval_loss"] == pytest.approx(expected["eval_loss"], rel=REL_TOL), f"{label} rank {rank} eval"
        assert result["training_after_eval"] is not False, f"{label} rank {rank}: left in eval mode"
        # the logged real-token share, segments and real flops per sample: the global batch's, not this data rank's
        assert all(logged == pytest.approx(expected["batch_statistics"], rel=1e-6)
                   for logged in result["batch_statistics"]), f"{label} rank {rank}: {result['batch_statistics']}"
        diff = max_relative_diff(result["params"], {n: expected["params"][n] for n in result["params"]}, floor=1.0)
        print(f"{label} rank {rank}: losses {result['losses']}, max param diff {diff:.2e}")
        assert diff <= REL_TOL, f"{label} rank {rank}"
        # the logged norm is taken before clipping: a constant factor in the gradients shows here
        # (None where no norm is computed: no clipping at ZeRO 0 in fp32, or a pipeline there)
        if result["grad_norms"][0] is not None:
            assert result["grad_norms"] == pytest.approx(expected["grad_norms"], rel=REL_TOL), f"{label} norms"
        seen |= set(result["params"])
    assert seen == set(expected["params"]), f"{label}: parameters missing from every stage"


def test_zero_with_sequence_parallel_gradients_before_clipping():
    """pp=1 at world 4, ZeRO 0/1/2/3 x (sp=4, dp=1 with 2 micro-batches accumulated | sp=2, dp=2),
    clipping off: ZeRO shards over data x seq, and the gradients DeepSpeed hands its optimizer
    are SUMMED over seq and AVERAGED over data, as are the logged gradient norms. (ZeRO 3's
    reduce-scatter averaged over data x seq: every gradient was 1/sp of the reference.)"""
    layouts = [(4, 2), (2, 1)]  # (sequence, gradient accumulation steps); data = 4 / sequence
    runs = [(1, 2, gas, zero_stage, sequence, "ring", 0, None, False, NO_CLIP)
            for zero_stage in (0, 1, 2, 3) for sequence, gas in layouts]
    per_rank = run_on_ranks(deepspeed_runs, 4, runs, timeout=420)
    expected = reference_run(2, clip=NO_CLIP)
    for index, (_, _, gas, zero_stage, sequence, *_) in enumerate(runs):
        label = f"zero{zero_stage} sp{sequence} dp{4 // sequence}"
        results = [rank_results[index] for rank_results in per_rank]
        for rank, result in enumerate(results):
            grads = result["grads"]
            ratio = sum((grads[n] * g).sum() for n, g in expected["grads"].items()) / sum(
                (g * g).sum() for g in expected["grads"].values())
            diff = max_relative_diff(grads, expected["grads"])
            print(f"{label} rank {rank}: gradient ratio {ratio:.7f}, max grad diff {diff:.2e}, "
                  f"norms {result['grad_norms']} vs {expected['grad_norms']}")
            assert diff <= REL_TOL, f"{label} rank {rank}: gradients before clipping"
            assert result["passes"] == 1
            assert result["grad_norms"][0] is not None, f"{label}: no logged norm"  # ZeRO 0: keep_clipped_grad_norm
        check_against_reference(results, micro=2, label=label, expected=expected)


# a ModernBERT at test size: the preset's layer rule (no biases, geglu, rope, local layers, embedding norm)
MODERN_PRESET = dict(model_preset="modernbert-base", num_layers=3, num_attention_heads=4, vocab_size=97,
                     local_attention_window=16, max_position_embeddings=64)
DECAY = dict(lr=0.5, weight_decay=0.2)  # AdamW's decoupled decay multiplies a weight by 1 - lr * wd = 0.9


def zero_gradient_step(pipeline: int, preset: bool, decay_norms_and_biases: bool = False) -> dict:
    """The engine of a run (ZeRO 0 in fp32: DeepSpeed's torch AdamW holds the parameters in its groups) after one
    optimizer step with zero gradients, so that only weight decay moves a parameter: {"groups": [(BertModel names,
    weight_decay)], "before", "after": {name: tensor}} of this rank's stage."""
    flags = {**model_flags(), **(MODERN_PRESET if preset else {}), "pipeline_parallel_size": pipeline,
             "decay_norms_and_biases": decay_norms_and_biases}
    ds = ds_config(2, 2, 0, 1, clip=0)
    ds["optimizer"]["params"].update(DECAY)
    config = resolve(flags, ds, torch.distributed.get_world_size())
    engine = build_engine(config, bert_state=small_model(config.model).state_dict())
    names = optimizer_state.bert_names(engine, config.model)
    groups = [(sorted(names[param] for param in group["params"]), group["weight_decay"])
              for group in engine.optimizer.param_groups]
    before = {name: param.detach().clone() for param, name in names.items()}
    for param in names:
        param.grad = torch.zeros_like(param)
    engine.optimizer.step()
    return {"groups": groups, "before": before,
            "after": {name: param.detach().clone() for param, name in names.items()}}


def norm_or_bias(name: str) -> bool:
    """The parameters Megatron, Hugging Face and ModernBERT exempt from weight decay, by their names here."""
    return name.endswith(".bias") or "layernorm" in name or name.endswith("norm.weight")


@pytest.mark.parametrize("preset", [False, True], ids=["classic", "modernbert"])
@pytest.mark.parametrize("pipeline", [1, 2])
def test_weight_decay_spares_norms_and_biases(pipeline, preset):
    """Two groups, as Megatron's get_param_groups makes them: the weights at the JSON's weight_decay, biases and
    norm weights at 0 (one group decayed them all: a LayerNorm's gain shrank towards 0 by lr * wd per step); the
    tied word embedding in the decayed group, once per stage that holds it. One step with zero gradients leaves
    the exempt parameters as they were and multiplies the others by 1 - lr * wd."""
    per_rank = run_on_ranks(zero_gradient_step, pipeline, pipeline, preset, timeout=300)
    model = small_model(resolve({**model_flags(), **(MODERN_PRESET if preset else {})}, {}, 1,
                                deepspeed_check=False).model)
    every = {name for name, _ in model.named_parameters()}
    exempt = {name for name in every if norm_or_bias(name)}
    assert exempt and every - exempt and (preset or any(name.endswith(".bias") for name in exempt))
    seen = set()
    for result in per_rank:
        (decayed, decay), (spared, no_decay) = result["groups"]
        assert (decay, no_decay) == (DECAY["weight_decay"], 0.0)
        assert set(spared) == exempt & set(result["before"]) and set(decayed) == set(result["before"]) - exempt
        assert len(decayed) == len(set(decayed)) and "embeddings.word_embeddings.weight" in decayed
        factor = 1 - DECAY["lr"] * DECAY["weight_decay"]
        for name, before in result["before"].items():
            want = before if name in exempt else before * factor
            assert torch.allclose(result["after"][name], want, rtol=1e-6, atol=0), name
        seen |= set(result["before"])
    assert seen == every


def test_a_resumed_run_of_the_old_grouping_decays_every_parameter():
    """decay_norms_and_biases (a checkpoint written before the exemption): the one group of every parameter, as
    that run trained, so that its state resumes group for group."""
    (result,) = run_on_ranks(zero_gradient_step, 1, 1, False, True, timeout=300)
    ((names, decay),) = result["groups"]
    assert decay == DECAY["weight_decay"] and names == sorted(result["before"])
    factor = 1 - DECAY["lr"] * DECAY["weight_decay"]
    assert all(torch.allclose(result["after"][name], before * factor, rtol=1e-6, atol=0)
               for name, before in result["before"].items())


def test_zero0_clipping_takes_the_norm_to_fp32_rounding():
    """The ZeRO 0 norm (logged, and the clip factor) against float64: torch's CPU norm kernels, which
    DeepSpeed's clip_grad_norm_ used, were 1e-4 off on a 2M-element fp32 gradient (1e-3 at BERT-base's
    embedding), where ZeRO 1-3 gave the exact norm; the engine tests' models are too small to see it."""
    torch.manual_seed(0)
    parameters = [torch.nn.Parameter(torch.empty(shape)) for shape in ((4096, 512), (512,), (3, 7))]
    for parameter in parameters:
        parameter.grad = torch.randn(parameter.shape) * 1e-3
    exact = torch.stack([p.grad.double().square().sum() for p in parameters]).sum().sqrt().item()
    assert clip_grads(parameters, 1e-2).item() == pytest.approx(exact, rel=1e-6)
    clipped = torch.stack([p.grad.double().square().sum() for p in parameters]).sum().sqrt().item()
    assert clipped == pytest.approx(1e-2, rel=1e-6)
    assert clip_grads(parameters, 1.0).item() == pytest.approx(clipped, rel=1e-6)  # below max_norm: unchanged
    assert torch.stack([p.grad.double().square().sum() for p in parameters]).sum().sqrt().item() == clipped


@pytest.mark.parametrize("attention", ["ring", "linformer", "bigbird"])
def test_pipeline_with_sequence_parallel(attention):
    """pp=2, sp=2 (world 4): stages exchange sequence chunks; the seq sum is ours. BigBird: the
    second stage's layer draws the random blocks of the model's layer 1, not layer 0's, and every
    step draws new ones."""
    results = run_on_ranks(deepspeed_run, 4, 2, 2, 2, 1, 2, attention, timeout=300)
    check_against_reference(results, micro=2, label=f"pp2 sp2 zero1 {attention}", attention=attention)


def test_pipeline_with_data_parallel():
    """pp=2, dp=2 (world 4), one micro-batch of 2 per data rank."""
    results = run_on_ranks(deepspeed_run, 4, 2, 2, 1, 1, 1, timeout=300)
    check_against_reference(results, micro=2, label="pp2 dp2 zero1")


@pytest.mark.parametrize("pipeline,world,interval", [(1, 2, 1), (1, 2, 2), (2, 4, 1)])
def test_activation_checkpointing_changes_nothing(pipeline, world, interval):
    """Recomputing layers (ring communication replayed in backward) gives the same training."""
    results = run_on_ranks(deepspeed_run, world, pipeline, 2, 2, 1, 2, "ring", interval, timeout=300)
    check_against_reference(results, micro=2, label=f"pp{pipeline} sp2 checkpointed")
    assert all(result["passes"] == 2 for result in results), "layers were not recomputed"
    if pipeline == 1:  # the small model's 2 layers in chunks of `interval`
        assert all(result["chunks"] == 2 // interval for result in results)


def checkpointing_section_run(section: dict) -> dict:
    """One rank, every layer checkpointed with the JSON's "activation_checkpointing" `section`: the
    settings DeepSpeed's checkpoint then runs with, and the losses."""
    from deepspeed.runtime.activation_checkpointing import checkpointing

    config = resolve({**model_flags(), "activation_checkpoint_interval": 1},
                     {**ds_config(2, 2, 1, 1), "activation_checkpointing": section}, 1)
    engine = build_engine(config, bert_state=small_model(config.model).state_dict())
    losses = [train_step(engine, micro_batches(2)).loss for _ in range(STEPS)]
    return {"losses": losses, "settings": {"cpu_checkpointing": checkpointing.CPU_CHECKPOINT,
                                           "synchronize_checkpoint_boundary": checkpointing.SYNCHRONIZE,
                                           "profile": checkpointing.PROFILE_TIME}}


def test_the_jsons_activation_checkpointing_settings_are_applied():
    """The section's settings reach DeepSpeed's checkpoint (nothing called its configure, so they were
    all dropped), and training is the same (activations partitioned over one rank and checkpointed
    to the CPU they are on: the same numbers)."""
    section = {"partition_activations": True, "cpu_checkpointing": True, "synchronize_checkpoint_boundary": True,
               "profile": True}
    (result,) = run_on_ranks(checkpointing_section_run, 1, section, timeout=300)
    assert result["settings"] == {key: value for key, value in section.items() if key != "partition_activations"}
    assert result["losses"] == pytest.approx(reference_run(2)["losses"], rel=1e-5)


@pytest.mark.parametrize("precision,pipeline,world,dtype", [("bf16", 1, 2, torch.bfloat16),
                                                           ("bf16", 2, 4, torch.bfloat16),
                                                           ("fp16", 1, 2, torch.float16)])
def test_mixed_precision_tracks_fp32(precision, pipeline, world, dtype):
    """bf16 / fp16 (dynamic loss scaling) from the JSON: half-precision weights, fp32 master
    copies in the optimizer, and a loss trajectory within half-precision rounding of fp32."""
    results = run_on_ranks(with_fp16_kernels_allowed, world, deepspeed_run, pipeline, 2, 2, 1, 2, "ring", 0, precision,
                           timeout=300)
    expected = reference_run(2)["losses"]
    for result in results:
        assert result["dtype"] == dtype
        assert result["losses"] == pytest.approx(expected, rel=2e-3)
        assert result["losses"][-1] < result["losses"][0]


def test_fp16_autocast_logs_the_norm_of_the_gradients_not_of_the_loss_scaled_ones():
    """fp16 torch_autocast at ZeRO 1 and 3 (clipping off: refused with it): DeepSpeed's ZeRO optimizers reported
    the norm of the loss-scaled gradients (grad norm 313593 where it was 4.79); the log has the gradients' own,
    the fp32 reference's within fp16 rounding."""
    runs = [(1, 2, 2, zero_stage, 1, "ring", 0, "torch_autocast", False, 0.0) for zero_stage in (1, 3)]
    (results,) = run_on_ranks(deepspeed_runs, 1, runs, timeout=300)
    expected = reference_run(2, clip=NO_CLIP)["grad_norms"]
    for zero_stage, result in zip((1, 3), results):
        assert result["grad_norms"] == pytest.approx(expected, rel=2e-2), f"ZeRO {zero_stage}"


# (pipeline, micro, gas, ZeRO, sequence, attention, checkpoint interval, precision, compile_mlp) on 2 ranks
COMPILED_RUNS = [(1, 2, 2, 1, 2, "ring", 1, None, True), (2, 2, 2, 1, 1, "ring", 0, None, True)]


def test_compiled_mlp_sublayers_train_the_same():
    """--compile-mlp (inductor-fused MLP sublayers), with the seq ring (sp=2, layers recomputed), then
    a pipeline (pp=2), on the same 2 ranks (one warm-up of inductor): each compiles graphs of its own
    and trains the same within fp32 rounding of the eager reference."""
    per_rank = run_on_ranks(deepspeed_runs, 2, COMPILED_RUNS, timeout=420)
    for index, (pipeline, *_) in enumerate(COMPILED_RUNS):
        results = [rank_results[index] for rank_results in per_rank]
        check_against_reference(results, micro=2, label=f"pp{pipeline} compiled mlp")
        assert all(result["compiled_graphs"] > 0 for result in results), f"pp{pipeline}: nothing was compiled"


def test_fp16_without_device_kernels_is_a_one_line_error(monkeypatch):
    from deepspeed.accelerator import get_accelerator

    monkeypatch.setattr(get_accelerator(), "is_fp16_supported", lambda: None)  # what DeepSpeed's CPU one returns
    with pytest.raises(ConfigError, match=r"fp16.enabled is true but DeepSpeed does not support fp16 .*bf16"):
        check_precision_supported({"fp16": {"enabled": True}})
    check_precision_supported({"bf16": {"enabled": True}, "fp16": {"enabled": False}})


def test_nonfinite_guard_leaves_the_lr_scheduler_unwarned(monkeypatch):
    """The guard goes on after DeepSpeed built the LR scheduler: torch must still see its own step
    wrapper (it warned on every --skip-nan-batches run at fp32 ZeRO 0), and finite steps go through."""
    import warnings
    from types import SimpleNamespace

    monkeypatch.setattr(torch.distributed, "all_reduce", lambda tensor, op=None: None)  # one rank
    weight = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([weight], lr=0.5)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    skip_nonfinite_updates(SimpleNamespace(optimizer=optimizer))
    weight.grad = torch.ones(2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        optimizer.step()
        scheduler.step()
    assert weight.tolist() == [0.5, 0.5] and not optimizer.overflow


@pytest.mark.slow
def test_pipeline_data_and_sequence_parallel_world_8():
    """pp=2, dp=2, sp=2 (world 8): every axis at once."""
    results = run_on_ranks(deepspeed_run, 8, 2, 2, 1, 1, 2, timeout=600)
    check_against_reference(results, micro=2, label="pp2 dp2 sp2 zero1")


def test_gradient_accumulation_equals_data_parallel():
    """2 micro-batches accumulated on one rank == the same 2 micro-batches on 2 data ranks."""
    accumulated = run_on_ranks(deepspeed_run, 1, 1, 2, 2, 0, 1, timeout=300)
    parallel = run_on_ranks(deepspeed_run, 2, 1, 2, 1, 0, 1, timeout=300)
    # ZeRO 0 in fp32 logs the norm its clipping computed (DeepSpeed dropped it), checked against torch's
    assert all(result["grad_norms"][0] is not None for result in accumulated + parallel)
    check_against_reference(accumulated + parallel, micro=2, label="gas2 vs dp2")

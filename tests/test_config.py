"""The resolved configuration: precedence, DeepSpeed's acceptance of our JSON, one-line errors."""
import argparse
import json
import re

import pytest
from deepspeed.runtime.config import DeepSpeedConfig

from megatron.arguments import add_model_and_parallel_args, config_flags
from megatron.config import adjustable_start_fields, read_ds_config, refuse_contradictions, resolve
from megatron.ds_schema import deepspeed_accepts, json_notes
from megatron.errors import ConfigError

BASE = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
        "sequence_parallel": {"size": 2, "attention": "ring"}}
SMALL = dict(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=64, max_position_embeddings=64,
             attention_dropout=0.0)


def flags(*argv) -> dict:
    parser = add_model_and_parallel_args(argparse.ArgumentParser())
    return config_flags(parser.parse_args(list(argv)))


def given_flags(argv: list, ds: dict | None = None) -> dict:
    """starting_weights.model_flags of the command line `argv`, starting where its flags name (no requeue)."""
    from megatron.arguments import build_parser
    from megatron.start_plan import StartPlan
    from megatron.starting_weights import model_flags

    args = build_parser().parse_args([str(arg) for arg in argv])
    return model_flags(args, ds or {}, StartPlan.given(args))


def test_json_section_selects_attention_and_size():
    config = resolve(SMALL, BASE, world_size=4)
    assert (config.sequence_parallel_size, config.data_parallel_size, config.model.attention) == (2, 2, "ring")
    assert config.global_batch_size == 8


def test_flags_override_json_which_overrides_defaults():
    argv = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "64",
            "--max-position-embeddings", "64", "--sequence-parallel-size", "4", "--attention", "ulysses"]
    config = resolve(flags(*argv), BASE, world_size=8)
    assert (config.sequence_parallel_size, config.model.attention) == (4, "ulysses")  # flags win
    assert config.micro_batch_size == 2 and config.gradient_accumulation_steps == 2  # from the JSON
    assert config.model.hidden_dropout == 0.1  # default
    bigbird = resolve({**flags("--bigbird", "--block-size", "8"), **SMALL}, {**BASE, "train_batch_size": 4}, world_size=2)
    assert (bigbird.model.attention, bigbird.model.bigbird_block_size) == ("bigbird", 8)


def test_attention_options_from_json():
    ds = {**BASE, "sequence_parallel": {"size": 1, "attention": "linformer",
                                        "linformer": {"k": 16, "share_heads": True}}}
    model = resolve(SMALL, ds, world_size=2).model
    assert (model.linformer_k, model.linformer_share_heads, model.linformer_share_kv) == (16, True, False)


def test_flags_and_unset_flags():
    given = flags("--micro-batch-size", "3", "--bert-no-binary-head", "--no-embedding-layernorm")
    assert given["micro_batch_size"] == 3 and given["add_binary_head"] is False
    assert resolve({**flags("--no-embedding-layernorm"), **SMALL}, BASE, world_size=4).model.embedding_layernorm is False
    assert given["sequence_parallel_size"] is None and given["attention"] is None
    # unset: the layout's own, so that the defaults export to Hugging Face (pre: MegatronBert, none)
    assert flags()["embedding_layernorm"] is None and resolve(SMALL, BASE, world_size=4).model.embedding_layernorm is False
    post = resolve({**flags("--layernorm-layout", "post"), **SMALL}, BASE, world_size=4).model
    assert post.embedding_layernorm is True
    assert resolve({**flags("--embedding-layernorm"), **SMALL}, BASE, world_size=4).model.embedding_layernorm is True
    assert resolve({**flags("--compile-mlp"), **SMALL}, BASE, world_size=4).compile_mlp is True
    assert resolve({**flags(), **SMALL}, BASE, world_size=4).compile_mlp is False


def test_variant_flags_reach_the_model_config():
    linformer = resolve({**SMALL, **{k: v for k, v in flags(
        "--attention", "linformer", "--linformer-k", "16", "--linformer-share-heads", "--linformer-share-kv").items()
        if v is not None}}, BASE, world_size=4).model
    assert (linformer.attention, linformer.linformer_k, linformer.linformer_share_heads,
            linformer.linformer_share_kv) == ("linformer", 16, True, True)
    bigbird = resolve({**SMALL, **{k: v for k, v in flags(
        "--bigbird", "--block-size", "8", "--bigbird-num-random-blocks", "1", "--bigbird-num-window-blocks", "5").items()
        if v is not None}}, BASE, world_size=4).model
    assert (bigbird.attention, bigbird.bigbird_block_size, bigbird.bigbird_num_random_blocks,
            bigbird.bigbird_num_window_blocks) == ("bigbird", 8, 1, 5)


def test_activation_checkpointing_from_the_flag_or_the_json_section():
    assert resolve(SMALL, BASE, world_size=4).activation_checkpoint_interval == 0
    profiled = {**BASE, "activation_checkpointing": {"profile": True}, "zero_optimization": {"stage": 1},
                "train_batch_size": 2, "gradient_accumulation_steps": 1}  # one micro-batch a step: it profiles
    for pipeline in ({"stages": 2, "use_reentrant": False}, {"stages": 2}):
        assert resolve(SMALL, {**profiled, "pipeline": pipeline}, world_size=4).activation_checkpoint_interval == 1
    assert resolve(SMALL, {**profiled, "pipeline": {"stages": 2}, "train_batch_size": 4,
                           "gradient_accumulation_steps": 2}, world_size=4).gradient_accumulation_steps == 2
    section = {**BASE, "activation_checkpointing": {"partition_activations": False}}
    assert resolve(SMALL, section, world_size=4).activation_checkpoint_interval == 1
    chunks = flags("--checkpoint-activations", "--checkpoint-num-layers", "2")
    assert resolve({**chunks, **SMALL}, BASE, world_size=4).activation_checkpoint_interval == 2
    assert resolve({**chunks, **SMALL}, section, world_size=4).activation_checkpoint_interval == 2
    # the section turns recompute on, --checkpoint-num-layers sizes its chunks (it was refused without the flag)
    sized = flags("--checkpoint-num-layers", "2")
    assert resolve({**sized, **SMALL}, section, world_size=4).activation_checkpoint_interval == 2
    with pytest.raises(ConfigError, match="--checkpoint-num-layers is given without --checkpoint-activations or an "
                                          "activation_checkpointing section"):
        resolve({**sized, **SMALL}, BASE, world_size=4)


def test_deepspeed_accepts_the_file_unchanged(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({**BASE, "train_batch_size": 4, "zero_optimization": {"stage": 1}}))
    ds = DeepSpeedConfig(str(path))  # one process: data-parallel size 1
    assert ds.train_batch_size == 4 and ds.zero_optimization_stage == 1


def test_resolved_config_is_json_serialisable():
    config = resolve(SMALL, BASE, world_size=4)
    assert json.loads(json.dumps(config.to_dict()))["model"]["attention"] == "ring"


@pytest.mark.parametrize("ds_update,world,extra,message", [
    ({"sequence_parallel": {"size": 2, "attention": "flash"}}, 4, {},
     "unknown attention variant 'flash'"),
    ({"sequence_parallel": {"size": 3, "attention": "ring"}}, 4, {},  # every size that fits named (it said 1 alone)
     "sequence_parallel.size 3 x pipeline 1 does not divide the world size 4; launch 3 processes (or a multiple) with "
     "deepspeed --num_gpus 3 pretrain_bert.py ... (or torchrun --nproc_per_node 3), or pass --sequence-parallel-size "
     "1, 2 or 4 to run on 4 processes"),
    ({"train_batch_size": 6}, 4, {},
     "train_batch_size 6 != train_micro_batch_size_per_gpu 2 x gradient_accumulation_steps 2 x data-parallel size 2"),
    ({"train_batch_size": 6, "train_micro_batch_size_per_gpu": None}, 4, {},  # the micro batch derived: not named
     "train_batch_size 6 is not a multiple of gradient_accumulation_steps 2 x data-parallel size 2 (= world / (pp x "
     "sp)) = 4; make train_batch_size a multiple of 4, or gradient_accumulation_steps a divisor of 3"),
    ({"train_batch_size": 6, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": None,
      "zero_optimization": {"stage": 1}}, 4, {"pipeline_parallel_size": 2},  # no grad-acc fits: no "set all three"
     "train_batch_size 6 is not a multiple of train_micro_batch_size_per_gpu 4 x data-parallel size 1 (= world / (pp "
     "x sp)) = 4; make train_batch_size a multiple of 4, or train_micro_batch_size_per_gpu a divisor of 6"),
    ({"train_batch_size": None, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1}, 4,
     {"global_batch_size": 6},  # dropping the JSON's grad-acc would not fit 6 either: said at once
     "--global-batch-size 6 is not a multiple of train_micro_batch_size_per_gpu 4 x data-parallel size 2 (= world / "
     "(pp x sp)) = 8; make --global-batch-size 8 (micro x the JSON's gradient_accumulation_steps 1 x data-parallel "
     "size), or a multiple of 8 with gradient_accumulation_steps dropped from the JSON"),
    ({}, 4, {"global_batch_size": 6, "micro_batch_size": 1},  # flags are named as flags
     "--global-batch-size 6 != --micro-batch-size 1 x the JSON's gradient_accumulation_steps 2 x data-parallel size 2 "
     "(= world / (pp x sp)); make --global-batch-size = micro x grad-acc x data-parallel size, or drop "
     "gradient_accumulation_steps from the JSON (the batch sizes then give it)"),
    ({"sequence_parallel": {"size": 2, "attention": "linformer"}}, 4, {"seq_length": 63, "max_position_embeddings": 64},
     "seq_length 63 is not divisible by the sequence-parallel size 2"),
    ({"zero_optimization": {"stage": 2}, "train_batch_size": 4}, 4, {"pipeline_parallel_size": 2},
     "zero_optimization.stage 2 cannot be combined with pipeline parallelism"),
    ({"sequence_parallel": {"size": 4, "attention": "ulysses"}, "train_batch_size": 4}, 4, {"num_attention_heads": 2,
                                                                                             "hidden_size": 32},
     "ulysses needs num_attention_heads (2) divisible by the sequence-parallel size (4)"),
    ({"train_batch_size": 4}, 4, {"pipeline_parallel_size": 2},  # DeepSpeed's default clipping, named as such
     "gradient_clipping 1.0 (the default: the JSON sets none) with a pipeline at zero_optimization.stage 0 would clip "
     "by the first stage's gradient norm only; use zero_optimization.stage 1, or turn clipping off "
     '("gradient_clipping": 0 in the JSON, or --clip-grad 0)'),
    ({"train_batch_size": 4, "gradient_clipping": 0.5}, 4, {"pipeline_parallel_size": 2},
     "gradient_clipping 0.5 with a pipeline at zero_optimization.stage 0"),
    ({"train_batch_size": 4, "zero_optimization": {"stage": 1}}, 6, {"pipeline_parallel_size": 3},  # 2 layers
     "--pipeline-model-parallel-size 3 is more pipeline stages than the 2 transformer layers: a stage would hold no "
     "transformer layer; pass --pipeline-model-parallel-size 2 or fewer, or pass --num-layers 3 or more"),
    ({"train_batch_size": 4, "zero_optimization": {"stage": 1}, "pipeline": {"stages": 3}}, 6, {},
     "pipeline.stages 3 is more pipeline stages than the 2 transformer layers: a stage would hold no transformer "
     "layer; set pipeline.stages to 2 or fewer, or pass --num-layers 3 or more"),
    ({"sequence_parallel": {"size": "2"}}, 4, {}, 'sequence_parallel.size = "2" is not an integer'),
    ({"sequence_parallel": {"size": 2, "sparse": True}}, 4, {}, "unknown key sequence_parallel.sparse"),
    ({"sequence_parallel": {"linformer": {"k": 8, "rank": 2}}}, 4, {}, "unknown key sequence_parallel.linformer.rank"),
    ({"zero_optimization": {"stage": "one"}}, 4, {}, 'zero_optimization.stage = "one" is not an integer'),
    ({"sequence_parallel": {"size": 2, "attention": "linformer", "linformer": {"k": 128}}}, 4, {},  # the JSON's k
     "linformer_k 128 exceeds seq_length 64; choose sequence_parallel.linformer.k at most --seq-length"),
    ({"sequence_parallel": {"size": 2, "attention": "linformer"}}, 4, {"linformer_k": 128},
     "linformer_k 128 exceeds seq_length 64; choose --linformer-k at most --seq-length"),
    ({"activation_checkpointing": {"partition_activations": True}}, 4, {},
     "activation_checkpointing.partition_activations would split sequence-split activations"),
    ({"activation_checkpointing": {"cpu_checkpointing": True}}, 4, {},  # DeepSpeed mangles unpartitioned inputs
     "activation_checkpointing.cpu_checkpointing needs activation_checkpointing.partition_activations, which is "
     "not set; set partition_activations (true, at sequence-parallel size 1), or drop cpu_checkpointing"),
    ({"activation_checkpointing": {"contiguous_memory_optimization": True, "partition_activations": True,
                                   "number_checkpoints": 2}, "sequence_parallel": {"size": 1, "attention": "ring"}},
     2, {}, "activation_checkpointing.contiguous_memory_optimization fills DeepSpeed 0.19.8's fixed checkpoint "
            "buffers in evaluation"),
    # the pipeline section's keys: a typo ran without a pipeline, the others as something else, silently
    ({"pipeline": {"stage": 2}}, 4, {}, "unknown key pipeline.stage; did you mean 'stages'? use one of: "
                                        "activation_checkpoint_interval, grad_partitioned, pipe_partitioned, stages, "
                                        "use_reentrant"),
    ({"pipeline": {"stages": 2, "zero_optimization": {"stage": 1}}}, 4, {},
     "pipeline.zero_optimization is a top-level key of DeepSpeed's, not one of the pipeline section"),
    ({"pipeline": {"stages": 2, "partition": "uniform"}}, 4, {}, "pipeline.partition is not read (DeepSpeed takes it "
                                                                 "from the PipelineModule"),
    ({"pipeline": {"seed_layers": True}}, 4, {}, 'pipeline.seed_layers is not read'),
    ({"pipeline": {"pipe_partitioned": True}}, 4, {}, "pipeline.pipe_partitioned true is not used: the trainer sends"),
    ({"pipeline": {"grad_partitioned": "false"}}, 4, {}, 'pipeline.grad_partitioned = "false" is not a boolean'),
    ({"pipeline": {"use_reentrant": 0}}, 4, {}, "pipeline.use_reentrant = 0 is not a boolean"),
    ({"pipeline": {"stages": 2, "activation_checkpoint_interval": 1}}, 4, {},
     "pipeline.activation_checkpoint_interval 1 would switch on DeepSpeed's recompute behind the trainer"),
    ({"torch_autocast": {"enabled": True, "dtype": "bf16", "lower_precision_safe_module": ["torch.nn.Linear"]}}, 4,
     {}, "unknown key torch_autocast.lower_precision_safe_module; did you mean 'lower_precision_safe_modules'?"),
    ({"activation_checkpointing": {"partition_activation": False}}, 4, {},  # ignored by DeepSpeed, silently
     "unknown key activation_checkpointing.partition_activation; did you mean 'partition_activations'?"),
    ({"activation_checkpointing": {"profile": "false"}}, 4, {}, 'activation_checkpointing.profile = "false" is not a '
                                                               "boolean"),
    ({"activation_checkpointing": {"profile": True}, "pipeline": {"stages": 2, "use_reentrant": False},
      "zero_optimization": {"stage": 1}, "train_batch_size": 4}, 4, {},  # 2 micro-batches a step: DeepSpeed's timers
     "activation_checkpointing.profile with the pipeline's non-reentrant checkpoint (pipeline.use_reentrant false) "
     "and gradient accumulation (2 micro-batches a step) stops DeepSpeed 0.19.8 at the first step"),
    # fp16 autocast where DeepSpeed runs it wrong: ZeRO 3 clipped the loss-scaled gradients too (damped updates),
    # a pipeline stopped at the first step; named as the user set the clipping and the stages
    ({"torch_autocast": {"enabled": True, "dtype": "float16"}, "zero_optimization": {"stage": 3}}, 4, {},
     'torch_autocast.dtype "float16" at ZeRO stage 3 with gradient_clipping 1.0 (the default: the JSON sets none) '
     "would train on damped updates"),
    ({"torch_autocast": {"enabled": True, "dtype": "fp16"}, "zero_optimization": {"stage": 2},
      "gradient_clipping": 0}, 4, {"gradient_clipping": 0.5}, '"fp16" at ZeRO stage 2 with --clip-grad 0.5 would'),
    ({"torch_autocast": {"enabled": True, "dtype": "float16"}, "zero_optimization": {"stage": 1},
      "gradient_clipping": 0, "train_batch_size": 4, "pipeline": {"stages": 2}}, 4, {},
     'torch_autocast.dtype "float16" with a pipeline (pipeline.stages 2) stops DeepSpeed 0.19.8 at the first step'),
    ({"torch_autocast": {"enabled": True, "dtype": "float16"}, "gradient_clipping": 0, "train_batch_size": 4}, 4,
     {"pipeline_parallel_size": 2}, '(--pipeline-model-parallel-size 2) stops DeepSpeed 0.19.8 at the first step '
                                    '(its pipeline engine steps a GradScaler that never scaled the loss: "Attempted '
                                    'step but _scale is None"); use torch_autocast.dtype "bfloat16" with a pipeline'),
])
def test_invalid_combinations_name_the_key(ds_update, world, extra, message):
    with pytest.raises(ConfigError) as error:
        resolve({**SMALL, **extra}, {**BASE, **ds_update}, world_size=world)
    text = str(error.value)
    assert message in text, text
    assert "\n" not in text and "; " in text


SIZE_FLAGS = {"--pipeline-model-parallel-size": "pipeline_parallel_size",
              "--sequence-parallel-size": "sequence_parallel_size", "--ulysses-size": "ulysses_size"}


@pytest.mark.parametrize("section, extra, world", [
    ({"size": 2, "attention": "ring"}, {}, 1),  # one process, as `python pretrain_bert.py` runs
    ({"size": 2, "attention": "ring"}, {"pipeline_parallel_size": 2}, 3),
    ({"size": 4, "attention": "hybrid", "ulysses_size": 2}, {}, 1),  # at SP 1 hybrid is plain attention
    ({"size": 4, "attention": "hybrid", "ulysses_size": 2}, {}, 6),
    ({"size": 8, "attention": "hybrid", "ulysses_size": 4}, {"num_attention_heads": 8}, 2),  # the Ulysses degree cut
    ({"size": 3, "attention": "ring"}, {}, 4),  # every size that fits: 1, 2 or 4 (only 1 was named)
])
def test_a_layout_the_world_size_does_not_fit_names_the_launch_and_the_sizes_that_fit(section, extra, world):
    """'launch a multiple of sp*pp processes or change the sizes' named neither the launcher nor the flags: the
    fix names the launch of pp x sp processes and the sizes that run on this world, and both resolve."""
    ds = {**BASE, "sequence_parallel": section, "zero_optimization": {"stage": 1}}
    ds.pop("train_batch_size")
    with pytest.raises(ConfigError) as refused:
        resolve({**SMALL, **extra}, ds, world_size=world)
    processes = section["size"] * extra.get("pipeline_parallel_size", 1)
    assert f"does not divide the world size {world}" in refused.value.problem
    assert refused.value.fix.startswith(f"launch {processes} processes (or a multiple) with deepspeed --num_gpus "
                                        f"{processes} pretrain_bert.py ... "), refused.value.fix
    sizes = re.search(r", or pass (.*) to run on ", refused.value.fix).group(1)
    suggested = {SIZE_FLAGS[flag]: [int(value) for value in re.split(", | or ", values)]
                 for flag, values in re.findall(r"(--[\w-]+) (\d+(?:(?:, | or )\d+)*)", sizes)}
    for size in suggested.pop("sequence_parallel_size", [None]):  # each size named runs (SP 3 on 4: 1, 2 or 4)
        given = {**{name: values[0] for name, values in suggested.items()}, "sequence_parallel_size": size}
        assert resolve({**SMALL, **extra, **given}, ds, world_size=world).data_parallel_size >= 1
    assert resolve({**SMALL, **extra}, ds, world_size=processes).data_parallel_size == 1


def test_clip_grad_overrides_the_json_and_an_error_names_the_flag():
    """--clip-grad reaches DeepSpeed through resolve, over the JSON's gradient_clipping; the pipeline's
    clipping error names the flag that set it, not the JSON key (which may hold another value, or none)."""
    from megatron.arguments import build_parser

    given = config_flags(build_parser().parse_args(["--clip-grad", "0.25"]))
    assert given["gradient_clipping"] == 0.25 and flags()["gradient_clipping"] is None
    ds = {**BASE, "gradient_clipping": 0.5}
    assert resolve({**given, **SMALL}, ds, world_size=4).ds_config["gradient_clipping"] == 0.25
    assert resolve(SMALL, ds, world_size=4).ds_config["gradient_clipping"] == 0.5
    pipeline = {**SMALL, "pipeline_parallel_size": 2}
    with pytest.raises(ConfigError, match=re.escape(
            "--clip-grad 0.25 with a pipeline at zero_optimization.stage 0 would clip by the first stage's gradient "
            "norm only; use zero_optimization.stage 1, or turn clipping off (--clip-grad 0)")):
        resolve({**given, **pipeline}, {**ds, "train_batch_size": 4}, world_size=4)
    assert resolve({**pipeline, "gradient_clipping": 0.0}, {**ds, "train_batch_size": 4}, world_size=4).ds_config[
        "gradient_clipping"] == 0.0


def test_a_pipeline_without_a_json_names_the_json_to_pass():
    """Megatron's habit, --pipeline-model-parallel-size 2 and no --deepspeed_config, met DeepSpeed's default
    clipping at ZeRO 0, and the fix said to use zero_optimization.stage 1 in a JSON the user did not have:
    it names the file to pass; with it (or with --clip-grad 0) the run resolves."""
    pipeline = {**SMALL, "pipeline_parallel_size": 2}
    for clip, setting in ((None, "gradient clipping 1.0 (DeepSpeed's default: no --deepspeed_config is given)"),
                          (0.5, "--clip-grad 0.5")):
        with pytest.raises(ConfigError) as error:
            resolve({**pipeline, "gradient_clipping": clip}, {}, world_size=2, json_given=False)
        assert str(error.value) == (
            f"{setting} with a pipeline at zero_optimization.stage 0 would clip by the first stage's gradient norm "
            'only; pass --deepspeed --deepspeed_config FILE holding {"zero_optimization": {"stage": 1}}, or turn '
            "clipping off (--clip-grad 0)")
    json_file = re.search(r"FILE holding (\{.*\}),", str(error.value)).group(1)
    assert resolve(pipeline, json.loads(json_file), world_size=2).pipeline_parallel_size == 2
    assert resolve({**pipeline, "gradient_clipping": 0.0}, {}, world_size=2,
                   json_given=False).pipeline_parallel_size == 2


@pytest.mark.parametrize("ds_update,message", [
    ({"zero_optimization": {"stage": 4}}, "zero_optimization.stage 4 is not a ZeRO stage"),
    ({"zero_optimization": {"stage": -1}}, "zero_optimization.stage -1 is not a ZeRO stage"),
    ({"zero_optimization": {"stag": 2}}, "unknown key zero_optimization.stag (DeepSpeed refuses it); did you mean"),
    ({"fp16": {"enabled": True}, "bf16": {"enabled": True}}, "fp16.enabled and bf16.enabled are both true; pick one"),
    ({"fp16": {"enabled": True}, "bfloat16": {"enabled": True}}, "fp16.enabled and bfloat16.enabled are both true"),
    ({"fp16": {"loss_scale": -1}}, "fp16.loss_scale = -1 is not a number >= 0; set fp16.loss_scale to 0 (dynamic"),
    ({"fp16": {"enabled": True, "loss_scale": True}}, "fp16.loss_scale = true is not a number >= 0"),
    ({"fp16": {"enabled": True, "loss_scal": 0}}, "unknown key fp16.loss_scal"),
    ({"bf16": {"enable": True}}, "unknown key bf16.enable"),
    ({"fp16": True}, "fp16 = true is not a JSON object"),
    ({"fp16": {"enabled": True, "loss_scale_window": 0}}, "fp16.loss_scale_window = 0 must be >= 1 with dynamic"),
    ({"fp16": {"enabled": True, "hysteresis": 1.5}}, "fp16.hysteresis = 1.5 is not an integer"),
    ({"bf16": {"enabled": True, "bf16_master_weights_and_grads": True}}, "bf16.bf16_master_weights_and_grads needs "
                                                                           "ZeRO (zero_optimization.stage is 0)"),
    ({"bf16": {"enabled": True, "bf16_optimizer_states": True}, "zero_optimization": {"stage": 1}},
     "bf16.bf16_optimizer_states needs bf16.bf16_master_weights_and_grads"),
])
def test_precision_and_zero_checks_refuse_what_deepspeed_refuses_without_importing_it(ds_update, message):
    """resolve() without DeepSpeed's checks (tools/ds_config.py's default) refuses these as the trainer's
    start-up does (DeepSpeed refuses each too), in one line naming the key and the fix."""
    ds_config = {**BASE, **ds_update}
    with pytest.raises(ConfigError) as error:
        resolve(SMALL, ds_config, world_size=4, deepspeed_check=False)
    text = str(error.value)
    assert message in text and "\n" not in text and "; " in text, text
    with pytest.raises(ConfigError, match="DeepSpeed rejects"):
        deepspeed_accepts(ds_config)


@pytest.mark.parametrize("ds_update", [
    {"fp16": {"enabled": True, "hysteresis": 2.0}},  # a whole number written as a float
    {"bf16": {"enabled": True}, "bfloat16": {"enable": True}},  # the old name is not read beside the new
])
def test_precision_checks_accept_what_deepspeed_accepts(ds_update):
    ds_config = {**BASE, **ds_update}
    resolve(SMALL, ds_config, world_size=4, deepspeed_check=False)
    deepspeed_accepts(ds_config)


@pytest.mark.parametrize("ds_update, world", [
    ({"zero_optimization": {"stage": 1, "stage3_max_live_parameters": 1e9, "max_reuse_distance": 1000000000,
                            "stage3_gather_16bit_weights_on_model_save": False}}, 4),  # DeepSpeed's defaults
    ({"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "none"}}},
     4),
    ({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"},
                            "stage3_max_live_parameters": 1000}}, 4),
    ({"torch_autocast": {"enabled": False, "dtype": "float16"}}, 4),  # off: no damped updates
    ({"torch_autocast": {"enabled": False, "dtype": "float32"}}, 4),  # off: its dtype is not read
    ({"torch_autocast": {"enabled": True, "dtype": "float16"}, "zero_optimization": {"stage": 0}}, 4),  # unscaled
    ({"torch_autocast": {"enabled": True, "dtype": "float16"}, "gradient_clipping": 0}, 4),  # nothing clipped
    ({"torch_autocast": {"enabled": True, "dtype": "float16"}, "gradient_clipping": 0,
      "zero_optimization": {"stage": 3}}, 4),
    ({"torch_autocast": {"enabled": True, "dtype": "bfloat16"}, "pipeline": {"stages": 2}, "train_batch_size": 4,
      "zero_optimization": {"stage": 1}}, 4),
    ({"torch_autocast": {"enabled": True, "dtype": "bf16", "lower_precision_safe_modules": ["torch.nn.Linear"]}}, 4),
    ({"data_types": {"grad_accum_dtype": "fp32"}}, 4),
    ({"communication_data_type": "fp16", "seq_parallel_communication_data_type": "FP16"}, 4),
    ({"communication_data_type": "fp16", "pipeline": {"stages": 2}, "zero_optimization": {"stage": 1}},
     8),  # DeepSpeed's pipeline engine does not override it
    ({"pipeline": {"stages": 2, "use_reentrant": False, "pipe_partitioned": False, "grad_partitioned": False,
                   "activation_checkpoint_interval": 0}, "zero_optimization": {"stage": 1}}, 8),  # what the run reads
])
def test_dtype_and_offload_settings_deepspeed_reads_are_accepted(ds_update, world):
    ds_config = {**BASE, **ds_update}
    resolve(SMALL, ds_config, world_size=world)


def test_the_summary_names_torch_autocast_beside_the_weights_dtype():
    """A torch_autocast run keeps fp32 weights (precision(), which decides kernels and checkpoint rules)
    but computes in bf16: the config line says both, not fp32 alone."""
    from megatron.config import TrainConfig
    from megatron.ds_schema import precision
    from megatron.model.args import BertConfig

    autocast = {"torch_autocast": {"enabled": True, "dtype": "bfloat16"}}
    assert precision(autocast) == "fp32"
    assert ", fp32 weights, bf16 autocast, ZeRO 0," in TrainConfig(model=BertConfig(), ds_config=autocast).summary()
    assert ", fp32, ZeRO 0," in TrainConfig(model=BertConfig()).summary()


@pytest.mark.parametrize("zero,said", [
    ({"stage": 2, "offload_optimizer": {"device": "cpu"}}, "ZeRO 2 (optimizer offloaded to CPU),"),
    ({"stage": 3, "offload_optimizer": {"device": "nvme"}, "offload_param": {"device": "cpu"}},
     "ZeRO 3 (optimizer offloaded to NVMe, parameters offloaded to CPU),"),
    ({"stage": 1, "cpu_offload": True}, "ZeRO 1 (optimizer offloaded to CPU),"),
    ({"stage": 2, "offload_optimizer": {"device": "none"}}, "ZeRO 2,"),
])
def test_the_summary_names_what_zero_offloads(zero, said):
    """The config line said `ZeRO 2` of a run that offloads its optimizer (slower steps, host memory)."""
    from megatron.config import TrainConfig
    from megatron.model.args import BertConfig

    summary = TrainConfig(model=BertConfig(), zero_stage=zero["stage"], ds_config={"zero_optimization": zero}).summary()
    assert said in summary, summary


def test_json_syntax_error_names_line_and_column(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text('{\n  "train_batch_size": 8,\n  "sequence_parallel": {"size": 2,}\n}\n')
    with pytest.raises(ConfigError, match=r"ds\.json:3:\d+: invalid JSON"):
        read_ds_config(path)
    with pytest.raises(ConfigError, match="does not exist"):
        read_ds_config(tmp_path / "missing.json")


def test_attention_dropout_defaults_to_zero_where_the_variant_cannot_drop_out():
    """ring and bigbird recompute blocks exactly, so they default to no attention dropout;
    asking for it explicitly (flag or not) is an error, other variants keep Megatron's 0.1."""
    small = {key: value for key, value in SMALL.items() if key != "attention_dropout"}
    assert resolve(small, BASE, world_size=4).model.attention_dropout == 0.0  # BASE selects ring
    bigbird = {**BASE, "train_batch_size": 4, "sequence_parallel": {"size": 1, "attention": "bigbird",
                                                                    "bigbird": {"block_size": 8}}}
    assert resolve(small, bigbird, world_size=1).model.attention_dropout == 0.0
    ulysses = {**BASE, "sequence_parallel": {"size": 2, "attention": "ulysses"}}
    assert resolve(small, ulysses, world_size=4).model.attention_dropout == 0.1
    with pytest.raises(ConfigError, match="attention_dropout 0.1 is not supported by ring attention"):
        resolve({**small, "attention_dropout": 0.1}, BASE, world_size=4)



# the fields of a tiny ModernBERT folder a run starts from (starting_weights.initial_model_fields)
START = dict(vocab_size=1500, hidden_size=64, num_layers=3, position_embedding_type="rope", global_attention_every=3,
             rotary_base=1e4, local_attention_window=16, max_position_embeddings=64)


@pytest.mark.parametrize("argv,ds,message", [
    (["--model-preset", "modernbert-large"], {}, "--model-preset modernbert-large (hidden_size 1024) contradicts the "
     "--init-from-hf folder mb, whose model has hidden_size 64; drop --model-preset modernbert-large"),
    ([], {"sequence_parallel": {"model_preset": "modernbert-base"}}, "sequence_parallel.model_preset modernbert-base "
     "(hidden_size 768) contradicts"),
    (["--global-attention-every", "2"], {}, "--global-attention-every 2 contradicts the --init-from-hf folder mb, "
     "whose model has global_attention_every 3; drop --global-attention-every 2"),
    (["--position-embedding-type", "learned"], {}, "--position-embedding-type learned contradicts the --init-from-hf "
     "folder mb, whose model has position_embedding_type rope"),
])
def test_a_start_from_weights_refuses_a_flag_or_preset_that_contradicts_them(argv, ds, message):
    with pytest.raises(ConfigError) as error:
        refuse_contradictions(START, "the --init-from-hf folder mb", flags(*argv), ds, adjustable_start_fields(
            START, from_hf=True))
    assert message in str(error.value), error.value


def test_a_start_from_weights_takes_restated_sizes_and_a_new_context():
    refuse_contradictions(START, "the --init-from-hf folder mb", flags(
        "--hidden-size", "64", "--rotary-base", "160000", "--local-attention-window", "8",
        "--max-position-embeddings", "8192", "--vocab-size", "1500"), {}, adjustable_start_fields(START, from_hf=True))


@pytest.mark.parametrize("argv,field", [(["--make-vocab-size-divisible-by", "256"], "make_vocab_size_divisible_by"),
                                        (["--bert-no-binary-head"], "add_binary_head")])
def test_a_weights_only_start_refuses_what_would_reshape_its_weights(argv, field):
    """An HF folder is converted (vocab padded again, a head initialised); a weights-only checkpoint is
    loaded as it is: such a flag would meet it as a shape error saying 'resume with the model flags'. The
    vocab padding, whose rows no token reaches, is padded again for both (hf_convert.repadded_vocab): the
    two entry points of the same weights agree; a resume keeps it."""
    start = {**START, "make_vocab_size_divisible_by": 128, "add_binary_head": True}
    refuse_contradictions(start, "the --init-from-hf folder mb", flags(*argv), {},
                          adjustable_start_fields(start, from_hf=True))
    if field == "make_vocab_size_divisible_by":
        refuse_contradictions(start, "the weights-only checkpoint ck", flags(*argv), {},
                              adjustable_start_fields(start, from_hf=False))
    else:
        with pytest.raises(ConfigError, match=f"contradicts the weights-only checkpoint ck, whose model has {field}"):
            refuse_contradictions(start, "the weights-only checkpoint ck", flags(*argv), {},
                                  adjustable_start_fields(start, from_hf=False))
    with pytest.raises(ConfigError, match=f"contradicts the checkpoint ck, whose model has {field}"):
        refuse_contradictions(start, "the checkpoint ck", flags(*argv), {},
                              adjustable_start_fields(start, from_hf=False, resume=True))
    learned = {**START, "position_embedding_type": "learned"}  # a table of 64 rows; rope has none to resize
    refuse_contradictions(START, "ck", flags("--max-position-embeddings", "128"), {}, adjustable_start_fields(START, False))
    with pytest.raises(ConfigError, match="--max-position-embeddings 128 contradicts ck, whose model has max_pos"):
        refuse_contradictions(learned, "ck", flags("--max-position-embeddings", "128"), {},
                              adjustable_start_fields(learned, False))


def test_local_layers_are_refused_with_linformer_or_bigbird_first():
    local = dict(SMALL, position_embedding_type="rope", local_attention_window=16, global_attention_every=2)
    with pytest.raises(ConfigError, match="bigbird attention cannot be combined with local sliding-window layers"):
        resolve({**local, "attention": "bigbird"}, {}, world_size=1, deepspeed_check=False)  # 1 block of 64: too few


def test_linformer_over_local_layers_and_packing_is_one_line_whose_fix_clears_both():
    """Linformer with a preset's local layers and the JSON's packing: the packing line came first, naming
    --pack-samples (a flag never given), then the local-layer one: two round trips. One line names both,
    the packing by the JSON key that set it, and each fix it offers resolves."""
    ds = {"sequence_parallel": {"model_preset": "modernbert-base", "pack_samples": True}}
    with pytest.raises(ConfigError) as error:
        resolve(flags("--attention", "linformer", "--seq-length", "512"), ds, world_size=1, deepspeed_check=False)
    assert re.fullmatch(r"linformer attention cannot be combined with local sliding-window layers "
                        r".* nor with packed samples \(sequence_parallel.pack_samples: .*\); use attention dense, "
                        r"ring, ulysses or hybrid, or \(to keep linformer\) drop sequence_parallel.pack_samples and "
                        r"pass --global-attention-every 1 .*", str(error.value)), error.value
    resolve(flags("--attention", "ring", "--seq-length", "512"), ds, world_size=1, deepspeed_check=False)
    unpacked = {"sequence_parallel": {"model_preset": "modernbert-base"}}
    resolve(flags("--attention", "linformer", "--seq-length", "512", "--global-attention-every", "1"), unpacked,
            world_size=1, deepspeed_check=False)


def test_a_setting_is_named_as_given_a_flag_or_a_json_key():
    """The fixes of BertConfig's own checks named the field (`set ffn_hidden_size to ...`), and ulysses_size
    was the JSON's key when the flag set it: each names the flag, or the JSON key where the JSON set it."""
    with pytest.raises(ConfigError, match="^ffn_hidden_size = 0 must be positive; set --ffn-hidden-size to an integer"):
        resolve({**SMALL, "ffn_hidden_size": 0}, {}, world_size=1, deepspeed_check=False)
    with pytest.raises(ConfigError, match="hidden_dropout = 1.5 is outside \\[0, 1\\); set --hidden-dropout between"):
        resolve({**SMALL, "hidden_dropout": 1.5}, {}, world_size=1, deepspeed_check=False)
    with pytest.raises(ConfigError, match="; set sequence_parallel.linformer.k to an integer >= 1$"):
        resolve(SMALL, {"sequence_parallel": {"attention": "linformer", "linformer": {"k": 0}}}, world_size=1,
                deepspeed_check=False)
    with pytest.raises(ConfigError, match="^--ulysses-size 2 is set but attention is 'ring'; set "
                                          "sequence_parallel.attention hybrid or drop --ulysses-size$"):
        resolve({**SMALL, "ulysses_size": 2}, BASE, world_size=4, deepspeed_check=False)
    with pytest.raises(ConfigError, match="^sequence_parallel.ulysses_size 2 is set but attention is 'ring'; set "
                                          "sequence_parallel.attention hybrid or drop sequence_parallel.ulysses_size$"):
        resolve(SMALL, {**BASE, "sequence_parallel": {**BASE["sequence_parallel"], "ulysses_size": 2}}, world_size=4,
                deepspeed_check=False)


def test_a_key_of_the_other_level_names_where_it_belongs():
    """"model_preset" at the JSON's top level was 'unknown top-level key ... fix the spelling': the spelling
    is right, the section is not; a DeepSpeed key inside the section is named alike."""
    from megatron.ds_schema import check_deepspeed_types

    for key, value in (("model_preset", "modernbert-base"), ("pack_samples", True), ("linformer", {"k": 8})):
        with pytest.raises(ConfigError, match=f"^'{key}' at the top level of the DeepSpeed JSON is a key of its "
                                              f"sequence_parallel section .*; move it into \"sequence_parallel\""):
            check_deepspeed_types({key: value})
    with pytest.raises(ConfigError, match="^sequence_parallel.train_batch_size is a top-level key of DeepSpeed's, not "
                                          "one of the sequence_parallel section .*; move 'train_batch_size' out of"):
        resolve(SMALL, {"sequence_parallel": {"train_batch_size": 8}}, world_size=1, deepspeed_check=False)


@pytest.mark.parametrize("argv,ds,fix,undo", [
    (["--model-preset", "modernbert-base", "--attention", "linformer"], {}, "or pass --global-attention-every 1 to "
     "make every layer global (--model-preset modernbert-base sets --local-attention-window)",
     ["--global-attention-every", "1"]),
    (["--attention", "bigbird"], {"sequence_parallel": {"model_preset": "modernbert-base"}}, "or pass "
     "--global-attention-every 1 to make every layer global (sequence_parallel.model_preset modernbert-base sets "
     "--local-attention-window)", ["--global-attention-every", "1"]),
    (["--model-preset", "modernbert-base", "--layernorm-layout", "post"], {}, "use --layernorm-layout pre or pass "
     "--first-layer-attention-norm (--model-preset modernbert-base sets --no-first-layer-attention-norm)",
     ["--first-layer-attention-norm"]),
])
def test_a_fix_undoes_what_a_preset_set_rather_than_telling_to_drop_it(argv, ds, fix, undo):
    """A preset's setting is no flag the user can drop; the fix names the flag that undoes it, and
    passing that flag then resolves (a window with every layer global has no local layer to refuse)."""
    with pytest.raises(ConfigError) as error:
        resolve(flags(*argv), ds, world_size=1, deepspeed_check=False)
    assert str(error.value).endswith(fix), error.value
    resolve(flags(*argv, *undo), ds, world_size=1, deepspeed_check=False)


@pytest.mark.parametrize("ds", [{}, {"sequence_parallel": {"model_preset": "modernbert-base"}}])
def test_a_preset_leaves_the_vocab_size_to_the_vocab_file(ds):
    """A preset is an architecture: the run's vocab size is its vocab file's (None here: read with the
    file), as without one, else --vocab-size's or the weights'; ModernBERT's 50368 over a vocab of
    2000 would train rows no token reaches, and to-hf would refuse the checkpoint. Nor does it
    contradict the vocab of the weights a run starts from."""
    argv = [] if ds else ["--model-preset", "modernbert-base"]
    assert given_flags(argv, ds)["vocab_size"] is None
    assert given_flags([*argv, "--vocab-size", "3000"], ds)["vocab_size"] == 3000
    refuse_contradictions(START, "the --init-from-hf folder mb", flags(*argv, "--hidden-size", "64", "--num-layers",
                                                                       "3"), ds, adjustable_start_fields(START, True))


@pytest.mark.parametrize("argv,message", [
    (["--mlp-type", "gelu", "--swiglu"], "--swiglu and --mlp-type gelu contradict each other (--swiglu is --mlp-type "
     "swiglu); pass one of them"),
    (["--swiglu", "--mlp-type", "geglu"], "--swiglu and --mlp-type geglu contradict"),
    (["--bigbird", "--attention", "dense"], "--bigbird and --attention dense contradict"),
    (["--attention", "ring", "--bigbird", "--bigbird"], "--bigbird and --attention ring contradict"),  # repeated
])
def test_an_alias_flag_beside_its_flag_with_another_value_is_refused(argv, message):
    """Megatron's --swiglu is --mlp-type swiglu: given with --mlp-type gelu the last one would win silently."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        flags(*argv)
    assert flags("--swiglu", "--mlp-type", "swiglu")["mlp_type"] == flags("--swiglu")["mlp_type"] == "swiglu"


def test_a_preset_resized_by_hidden_size_keeps_its_ffn_ratio_against_weights_and_checkpoints():
    """modernbert-base at --hidden-size 64 has an FFN of 96 (1152 / 768), also when compared with the
    weights a run starts from; a checkpoint saved when it kept 1152 names the flag that resumes it."""
    from megatron.checkpoint_compat import check_same_model
    from megatron.model.args import BertConfig

    argv = ("--model-preset", "modernbert-base", "--hidden-size", "64", "--num-layers", "3")
    start = {**START, "ffn_hidden_size": 96}
    refuse_contradictions(start, "the --init-from-hf folder mb", flags(*argv), {}, adjustable_start_fields(start, True))
    with pytest.raises(ConfigError, match=r"modernbert-base \(ffn_hidden_size 96\) contradicts the --init-from-hf "
                                          "folder mb, whose model has ffn_hidden_size 128"):
        refuse_contradictions({**start, "ffn_hidden_size": 128}, "the --init-from-hf folder mb", flags(*argv), {},
                              adjustable_start_fields(start, True))
    model = resolve(flags(*argv, "--num-attention-heads", "4", "--vocab-size", "100"), {}, world_size=1,
                    deepspeed_check=False).model
    stored = {**{field: getattr(model, field) for field in BertConfig.__dataclass_fields__}, "ffn_hidden_size": 1152}
    with pytest.raises(ConfigError, match="trained with ffn_hidden_size 1152, this run's model has 96; pass "
                                          r"--ffn-hidden-size 1152, the checkpoint's \(a --model-preset resized"):
        check_same_model(stored, model, "ckpt/iter_0000002")
    # a width no preset had: no preset to blame
    with pytest.raises(ConfigError, match="pass --ffn-hidden-size 128, the checkpoint's, or resume with the model "
                                          "flags the checkpoint was trained with$"):
        check_same_model({**stored, "ffn_hidden_size": 128}, model, "ckpt/iter_0000002")


@pytest.mark.parametrize("attention,trained,message", [
    ("dense", {"embedding_layernorm": True}, "trained with embedding_layernorm True, this run's model has False"),
    ("dense", {"first_layer_attention_norm": False},
     "trained with first_layer_attention_norm False, this run's model has True"),
    ("linformer", {"linformer_share_kv": True}, "trained with linformer_share_kv True, this run's model has False"),
    ("linformer", {"linformer_k": 16}, "trained with linformer_k 16, this run's model has 8"),
    ("dense", {"add_bias_linear": False}, "trained with add_bias_linear False, this run's model has True"),
    ("dense", {"position_embedding_type": "rope", "rotary_base": 50000.0},  # the kind first, not its theta
     "trained with position_embedding_type rope, this run's model has learned"),
])
def test_a_resume_names_the_setting_that_adds_or_reshapes_a_tensor(attention, trained, message):
    """Was 'holds embeddings.layernorm.weight of shape nothing' or 'holds ...value_projection, which this
    model does not have' (a Linformer resume with another --linformer-share-kv): the setting, as for the
    sizes."""
    import dataclasses

    from bert_fixtures import small_config
    from megatron.checkpoint_compat import check_same_model

    model = small_config(attention, linformer_k=8)
    with pytest.raises(ConfigError, match=f"checkpoint ckpt/iter_0000002 was {message}; resume with the model flags"):
        check_same_model({**dataclasses.asdict(model), **trained}, model, "ckpt/iter_0000002")


# a value other than small_config's of each field a resume keeps (most shape no tensor: only the field tells)
OTHER_MODEL_VALUES = {"num_layers": 3, "hidden_size": 48, "ffn_hidden_size": 96, "position_embedding_type": "rope",
                      "vocab_size": 200, "num_attention_heads": 8, "layernorm_epsilon": 1e-3,
                      "layernorm_layout": "post", "normalization": "RMSNorm", "mlp_type": "geglu",
                      "rotary_base": 50000.0, "local_rotary_base": 20000.0, "local_attention_window": 16,
                      "global_attention_every": 3, "add_bias_linear": False, "add_binary_head": False,
                      "embedding_layernorm": True, "first_layer_attention_norm": False}


@pytest.mark.parametrize("field", OTHER_MODEL_VALUES)
def test_a_resume_names_a_setting_the_weights_compute_with(field):
    """A resume with another --layernorm-epsilon or rope theta loads every tensor and trains another
    function: each field a resume keeps is compared, named as the setting."""
    import dataclasses

    from bert_fixtures import small_config
    from megatron.checkpoint_compat import check_same_model
    from megatron.model.fields import info, resume_kept

    model, value = small_config("dense"), OTHER_MODEL_VALUES[field]
    with pytest.raises(ConfigError, match=re.escape(f"checkpoint ckpt/iter_0000002 was trained with {field} {value}, "
                                                    f"this run's model has {getattr(model, field)}")):
        check_same_model({**dataclasses.asdict(model), field: value}, model, "ckpt/iter_0000002")
    # a field a resume comes to keep gets its case here (Linformer's: the cases above)
    assert set(OTHER_MODEL_VALUES) == {name for name in resume_kept() if info(name).variant is None}


def test_a_resume_names_the_size_before_the_layout_that_differs_with_it():
    """Two settings differ: the line names the first in the order a resume compares them (sizes, then the
    layout and norm, then what they imply: biases, the embedding norm), not in BertConfig's order, where
    layernorm_layout comes before position_embedding_type and add_bias_linear before normalization."""
    import dataclasses

    from bert_fixtures import small_config
    from megatron.checkpoint_compat import check_same_model

    model = small_config("dense")
    stored = {**dataclasses.asdict(model), "position_embedding_type": "rope", "layernorm_layout": "post"}
    with pytest.raises(ConfigError, match="trained with position_embedding_type rope, this run's model has learned"):
        check_same_model(stored, model, "ckpt/iter_0000002")
    stored = {**dataclasses.asdict(model), "add_bias_linear": False, "layernorm_layout": "post"}
    with pytest.raises(ConfigError, match="trained with layernorm_layout post, this run's model has pre"):
        check_same_model(stored, model, "ckpt/iter_0000002")
    stored = {**dataclasses.asdict(model), "add_bias_linear": False, "normalization": "RMSNorm"}
    with pytest.raises(ConfigError, match="trained with normalization RMSNorm, this run's model has LayerNorm"):
        check_same_model(stored, model, "ckpt/iter_0000002")


def test_precision_reads_bf16_under_either_name():
    """DeepSpeed reads "bfloat16" where "bf16" is absent: a checkpoint of such a run is bf16 (its
    fp32 masters, not its rounded copies, are the weights to export)."""
    from megatron.ds_schema import precision

    assert precision({"bfloat16": {"enabled": True}}) == "bf16"
    assert precision({"bf16": {"enabled": False}, "bfloat16": {"enabled": True}}) == "fp32"  # the new name wins
    assert precision({"fp16": {"enabled": True}}) == "fp16" and precision({}) == "fp32"


def test_zero_plus_plus_keys_are_refused_below_stage_3_only_when_on():
    """hpZ's partition size 1 and a false quantization flag are DeepSpeed's defaults (off): accepted at
    any stage; on, below stage 3, they would do nothing."""
    from megatron.ds_schema import check_deepspeed_types

    check_deepspeed_types({"zero_optimization": {"stage": 1, "zero_hpz_partition_size": 1,
                                                 "zero_quantized_weights": False}})
    check_deepspeed_types({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 2}})
    with pytest.raises(ConfigError, match="zero_optimization.zero_hpz_partition_size works at ZeRO stage 3 only and "
                                          "does nothing at stage 2; remove zero_hpz_partition_size, or set"):
        check_deepspeed_types({"zero_optimization": {"stage": 2, "zero_hpz_partition_size": 2}})


def preset_checkpoint(folder, **fields) -> str:
    """A checkpoint folder (run state only) of a --model-preset modernbert-base run (dropout 0.0), or of a
    model of BertConfig's defaults and `fields`."""
    from megatron.config import TrainConfig
    from megatron.model.args import MODEL_PRESETS, BertConfig

    model = BertConfig(**({**fields} if fields else {**MODEL_PRESETS["modernbert-base"], "num_layers": 3,
                                                     "seq_length": 128, "vocab_size": 30592}))
    (folder / "iter_0000002").mkdir(parents=True)
    (folder / "latest").write_text("iter_0000002")
    (folder / "iter_0000002" / "run_state.json").write_text(json.dumps(
        {"config": TrainConfig(model=model).to_dict(), "iteration": 2, "consumed_samples": 16}))
    (folder / "iter_0000002" / "mp_rank_00_model_states.pt").write_bytes(b"")
    return str(folder)


def test_a_resume_keeps_its_checkpoints_weight_decay_groups_a_new_run_spares_norms_and_biases(tmp_path):
    """decay_norms_and_biases: a resume takes the checkpoint's, True for one written before the field (its one
    optimizer group decayed every parameter, and DeepSpeed's files restore group for group); the config records
    it (config.json, the next checkpoint) and its line says so. A new run from the same weights (--finetune) is
    a new run: biases and norm weights spared."""
    base = ["--data-path", "x", "--train-iters", "4"]
    ckpt = preset_checkpoint(tmp_path / "ckpt")
    assert resolve(given_flags(["--load", ckpt, *base]), {}, 1).decay_norms_and_biases is False
    state_file = tmp_path / "ckpt" / "iter_0000002" / "run_state.json"
    stored = json.loads(state_file.read_text())
    del stored["config"]["decay_norms_and_biases"]  # as written before the field
    state_file.write_text(json.dumps(stored))
    resumed = resolve(given_flags(["--load", ckpt, *base]), {}, 1)
    assert resumed.decay_norms_and_biases is True and resumed.to_dict()["decay_norms_and_biases"] is True
    assert "weight decay on norms and biases too (the checkpoint's)" in resumed.summary()
    fresh = resolve(given_flags(["--load", ckpt, "--finetune", *base]), {}, 1)
    assert fresh.decay_norms_and_biases is False and "norms and biases" not in fresh.summary()
    assert resolve(given_flags(base), {}, 1).decay_norms_and_biases is False


def test_a_resume_keeps_the_checkpoints_dropout_unless_a_flag_changes_it(tmp_path, capsys):
    """`--load ckpt` alone resumes a preset run (dropout 0.0) with its dropout, not BertConfig's 0.1; a
    flag or preset that changes it trains on with it, in one warning line. model_flags prints none: a check
    after it (the layout, the load) may still refuse the run; the resume prints kept_regime's, of the flags
    model_flags made, once its checkpoint has loaded."""
    from megatron.checkpoint import stored_config
    from megatron.config import resolve
    from megatron.resume import kept_regime

    def warning(folder, flags):
        return kept_regime(stored_config(folder, "iter_0000002")["model"], dict(flags), {}, f"the checkpoint {folder}")

    ckpt = preset_checkpoint(tmp_path / "ckpt")
    base = ["--load", ckpt, "--data-path", "x", "--train-iters", "4"]
    capsys.readouterr()
    flags = given_flags(base)
    model = resolve(dict(flags), {}, 1).model
    assert (model.hidden_dropout, model.attention_dropout, model.init_method_std) == (0.0, 0.0, 0.02)
    assert warning(ckpt, flags) is None
    flags = given_flags([*base, "--hidden-dropout", "0.2"])
    assert resolve(dict(flags), {}, 1).model.hidden_dropout == 0.2
    assert capsys.readouterr().err == ""
    assert warning(ckpt, flags) == (f"warning: --hidden-dropout 0.2 changes hidden_dropout from 0.0, which the "
                                    f"checkpoint {ckpt}'s run trained with")
    # a dense run (attention dropout 0.1) resumed with ring attention, which has none: said, not refused
    dense = preset_checkpoint(tmp_path / "dense", num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=1000,
                              seq_length=64, max_position_embeddings=64)
    flags = given_flags(["--load", dense, "--attention", "ring"])
    model = resolve(dict(flags), {}, 1).model
    assert (model.hidden_dropout, model.attention_dropout) == (0.1, 0.0)
    assert capsys.readouterr().err == ""
    assert warning(dense, flags) == ("warning: ring attention (no attention dropout) changes attention_dropout from "
                                     f"0.1, which the checkpoint {dense}'s run trained with")


@pytest.mark.parametrize("start", [[], ["--finetune", "--save", "other"]])
def test_a_longer_sequence_than_a_checkpoints_learned_positions_names_fixes_that_work(tmp_path, start):
    """A resume (or a new run from a checkpoint) at a --seq-length beyond its position table was told to raise
    --max-position-embeddings, which the next check refuses (the weights fix it). The fixes named work: the
    table's length, packing, or a new run from its export (--init-from-hf repeats the table)."""
    ckpt = preset_checkpoint(tmp_path / "ckpt", num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=1000,
                             seq_length=64, max_position_embeddings=64)
    base = ["--load", ckpt, "--data-path", "x", "--train-iters", "4", "--seq-length", "128", *start]
    for extra in ([], ["--max-position-embeddings", "128"]):
        with pytest.raises(ConfigError) as refused:
            given_flags([*base, *extra])
        assert refused.value.problem == f"--seq-length 128 exceeds the 64 learned positions of the checkpoint {ckpt}"
        assert refused.value.fix.startswith("keep --seq-length 64 or less, pack samples of up to 64 tokens into 128 "
                                            "with --pack-samples, or start a new run with a longer table: ")
        assert f"to-hf --load {ckpt} --output HF, then " in refused.value.fix
        assert refused.value.fix.endswith("--init-from-hf HF --max-position-embeddings 128 --seq-length 128 and "
                                          "another --save")
    flags = given_flags([*base, "--pack-samples"])
    assert resolve(flags, {}, 1).model.max_segment_length == 64


def test_another_rope_theta_on_a_resume_names_finetune_and_extend_context(tmp_path):
    """Rope thetas shape no weight: a resume refuses another one (it keeps the model), and its fix names
    the ways to train on with it, not 'the weights fix rotary_base'."""
    ckpt = preset_checkpoint(tmp_path / "ckpt")
    with pytest.raises(ConfigError) as refused:
        given_flags(["--load", ckpt, "--rotary-base", "320000"])
    assert str(refused.value) == (
        f"--rotary-base 320000.0 contradicts the checkpoint {ckpt}, whose model has rotary_base 160000.0; drop "
        "--rotary-base 320000.0: a resume keeps the checkpoint's model; to train on with another rotary_base, start "
        "a new run from its weights with --finetune and another --save, or tools/extend_context.py for a longer "
        "context")


@pytest.mark.parametrize("argv,ds,named", [
    (["--model-preset", "modernbert-large", "--hidden-size", "72"], {},
     "num_attention_heads 16 (from --model-preset modernbert-large)"),
    (["--hidden-size", "72"], {"sequence_parallel": {"model_preset": "modernbert-large"}},
     "num_attention_heads 16 (from sequence_parallel.model_preset modernbert-large)"),
    (["--model-preset", "modernbert-large", "--hidden-size", "72", "--num-attention-heads", "16"], {},
     "num_attention_heads 16; "),  # the user's own flag: nothing to name
])
def test_a_models_check_names_the_preset_that_set_a_value_the_user_never_typed(argv, ds, named):
    with pytest.raises(ConfigError) as error:
        resolve(flags(*argv, "--seq-length", "64"), ds, world_size=1, deepspeed_check=False)
    assert f"hidden_size 72 is not divisible by {named}" in str(error.value), error.value


@pytest.mark.parametrize("argv, expected", [
    ([], 64),  # the preset's 8192 would claim positions the run never trained (the HF export's field)
    (["--max-position-embeddings", "128"], 128),  # given: kept
    (["--model-preset", ""], 64)])  # no preset: BertConfig's 512 is no trained length either
def test_rope_positions_are_the_trained_length_unless_given(argv, expected):
    preset = [] if "--model-preset" in argv else ["--model-preset", "modernbert-base"]
    argv = [a for a in argv if a not in ("--model-preset", "")]
    given = flags(*preset, *argv, "--position-embedding-type", "rope", "--num-layers", "3", "--hidden-size", "32",
                  "--num-attention-heads", "4", "--seq-length", "64")
    assert resolve(given, BASE, world_size=4).model.max_position_embeddings == expected


def test_two_different_presets_are_refused():
    with pytest.raises(ConfigError, match="--model-preset modernbert-base contradicts sequence_parallel.model_preset "
                                          "modernbert-large of the DeepSpeed JSON; drop one of them"):
        resolve(flags("--model-preset", "modernbert-base"),
                {**BASE, "sequence_parallel": {"size": 2, "attention": "ring", "model_preset": "modernbert-large"}},
                world_size=4)
    same = {**BASE, "sequence_parallel": {"size": 2, "attention": "ring", "model_preset": "modernbert-base"}}
    assert resolve({**flags("--model-preset", "modernbert-base"), **SMALL}, same, world_size=4).model.mlp_type == "geglu"


def test_max_position_embeddings_with_rope_is_a_note_of_what_it_sets():
    """With rope there is no table: the flag only feeds the HF export's field, which the user is told."""
    from megatron.model.args import BertConfig
    from megatron.training import rope_positions_note

    rope = BertConfig(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=64, max_position_embeddings=128,
                      position_embedding_type="rope")
    assert rope_positions_note(argparse.Namespace(max_position_embeddings=128), rope).startswith(
        "note: --max-position-embeddings 128 sizes no table with rope positions: it is only the max_position_embeddings "
        "a Hugging Face export")
    assert rope_positions_note(argparse.Namespace(max_position_embeddings=None), rope) is None
    assert rope_positions_note(argparse.Namespace(max_position_embeddings=64), rope) is None  # extend_context's


@pytest.mark.parametrize("sizes, dropout, layout", [
    ((1, 2), (0.1, 0.0), "sequence-parallel 2"), ((2, 1), (0.0, 0.1), "pipeline 2"),
    ((2, 4), (0.1, 0.1), "pipeline 2 x sequence-parallel 4"), ((1, 1), (0.1, 0.1), None), ((2, 2), (0.0, 0.0), None)])
def test_dropout_with_sequence_or_pipeline_parallelism_is_a_note_that_the_run_is_not_exact(sizes, dropout, layout):
    """Each rank draws the dropout masks of its own tokens or layers: such a run matches the single process
    in distribution only, which the exactness the README promises (with dropout off) does not say by itself."""
    from megatron.config import TrainConfig
    from megatron.model.args import BertConfig
    from megatron.training import dropout_layout_note

    model = BertConfig(num_layers=2, hidden_size=32, num_attention_heads=4, hidden_dropout=dropout[0],
                       attention_dropout=dropout[1])
    note = dropout_layout_note(TrainConfig(model=model, pipeline_parallel_size=sizes[0],
                                           sequence_parallel_size=sizes[1]))
    if layout is None:
        assert note is None
    else:
        assert note == (f"note: dropout (hidden {dropout[0]:g}, attention {dropout[1]:g}) draws its masks per layout: "
                        f"this {layout} run matches the single-process run statistically, not bit for bit (with "
                        "--hidden-dropout 0 --attention-dropout 0: to fp32 rounding)")


@pytest.mark.parametrize("argv,ds,note", [
    # rope and local layers without the preset's other layer options: neither ModernBERT nor Bert
    (["--position-embedding-type", "rope", "--local-attention-window", "16", "--global-attention-every", "2"], BASE,
     "note: convert_checkpoint.py to-hf will refuse this model: a model with embedding_layernorm False, "
     "first_layer_attention_norm True, type_vocab_size 2, mlp_type gelu has no Hugging Face ModernBERT (nor Bert) "
     "equivalent (a conversion cannot change the layers a model was trained with); train with --embedding-layernorm "
     "--no-first-layer-attention-norm --type-vocab-size 0 --mlp-type geglu (--model-preset modernbert-base sets them "
     "all) to export a ModernBERT, or with --position-embedding-type learned and without --local-attention-window to "
     "export a classic BERT"),
    # rope alone over the classic layers: the classic form is a retrain with learned positions, not an export
    (["--position-embedding-type", "rope"], BASE,
     "note: convert_checkpoint.py to-hf will refuse this model: a model with embedding_layernorm False, "
     "first_layer_attention_norm True, type_vocab_size 2, mlp_type gelu has no Hugging Face ModernBERT (nor Bert) "
     "equivalent (a conversion cannot change the layers a model was trained with); train with --embedding-layernorm "
     "--no-first-layer-attention-norm --type-vocab-size 0 --mlp-type geglu (--model-preset modernbert-base sets them "
     "all) to export a ModernBERT, or with --position-embedding-type learned to export a classic BERT"),
    (["--model-preset", "modernbert-base", "--position-embedding-type", "learned", "--local-attention-window", "32"],
     BASE,
     "note: convert_checkpoint.py to-hf will refuse this model: a model with position_embedding_type learned has no "
     "Hugging Face ModernBERT"),
    (["--embedding-layernorm"], BASE,  # the pre layout with the post layout's embedding norm: no HF BERT either
     "note: convert_checkpoint.py to-hf will refuse this model: layernorm_layout 'pre' with embedding_layernorm True "
     "has no Hugging Face equivalent"),
    ([], {**BASE, "sequence_parallel": {"size": 2, "attention": "linformer", "linformer": {"k": 16}}},
     "note: convert_checkpoint.py to-hf will refuse this model: linformer attention's projections have no Hugging "
     "Face counterpart; train with another attention"),
    # a window that spans the sequence (SMALL: 64 tokens): the local layers are not local
    (["--model-preset", "modernbert-base", "--local-attention-window", "200"], BASE,
     "note: --local-attention-window 200 (100 tokens each side) is not below the 64-token sequence (--seq-length); "
     "the window counts both sides"),
    (["--model-preset", "modernbert-base", "--local-attention-window", "64"], BASE,
     "note: --local-attention-window 64 (32 tokens each side) is not below the 64-token sequence (--seq-length): the "
     "local layers see all but the tokens more than 32 apart; the window counts both sides"),
    (["--model-preset", "modernbert-base", "--local-attention-window", "32"],
     {**BASE, "sequence_parallel": {"size": 2, "attention": "ring", "pack_samples": True, "max_segment_length": 16}},
     "note: --local-attention-window 32 (16 tokens each side) is not below the 16-token segment "
     "(--max-segment-length); the window counts both sides")])
def test_a_model_to_hf_would_refuse_or_with_global_local_layers_is_a_note_at_start_up(argv, ds, note):
    """Learnt at start-up (the trainer, ds_config.py show/validate print model_notes), not after a long run
    from to-hf's refusal; the run trains (a choice), so a note, not an error."""
    from megatron.config import model_notes

    notes = model_notes(resolve(small_with(*argv), ds, world_size=4).model, "--local-attention-window" in argv)
    assert len(notes) == 1 and notes[0].startswith(note), notes


def test_the_export_note_of_a_run_from_existing_weights_names_them_and_keeps_the_fix_a_retrain():
    """A resume (or a start from weights) cannot take the flags that would give the model a Hugging Face
    form (its weights hold the layers), so the note says where the layers come from and that the fix is a
    new run, not "train with" flags this run would refuse."""
    from megatron.config import model_notes

    model = resolve(small_with("--model-preset", "modernbert-base", "--normalization", "RMSNorm"), BASE,
                    world_size=4).model
    fresh, = model_notes(model, window_given=False)
    resumed, = model_notes(model, window_given=False, weights_from="/runs/long")
    assert "refuse this model: " in fresh and "; train with --normalization LayerNorm" in fresh, fresh
    assert resumed.startswith("note: convert_checkpoint.py to-hf will refuse this model, whose layers come from "
                              "/runs/long: ") and "; retrain with --normalization LayerNorm" in resumed, resumed
    assert resumed.endswith("(a new run from scratch)") and " train with" not in resumed.replace("retrain", ""), resumed


@pytest.mark.parametrize("argv", [[], ["--layernorm-layout", "post"],
                                  ["--model-preset", "modernbert-base", "--local-attention-window", "62"],
                                  ["--model-preset", "modernbert-base", "--mlp-type", "swiglu", "--seq-length", "128",
                                   "--local-attention-window", "64"]])
def test_an_exportable_model_with_local_layers_that_are_local_has_no_note(argv):
    from megatron.config import model_notes

    assert model_notes(resolve(small_with(*argv), BASE, world_size=4).model, "--local-attention-window" in argv) == []


@pytest.mark.parametrize("seq_length", ["128", "64"])
def test_the_wide_window_note_is_for_a_window_a_flag_gives_and_what_the_layers_see_is_said_once(seq_length):
    """ModernBERT's own window (a preset's, or the starting weights': no --local-attention-window) at a
    fine-tune length of 128 or 64 tokens is the model's, not a window given as one side's tokens: no note
    (it read as a mistake). Given by the flag at 64, the note names the flag; that its local layers see
    every token the config line says, the note not again."""
    from megatron.config import model_notes

    preset = resolve(small_with("--model-preset", "modernbert-base", "--seq-length", seq_length), BASE, world_size=4)
    assert preset.model.local_attention_window == 128 and model_notes(preset.model, window_given=False) == []
    given = resolve(small_with("--model-preset", "modernbert-base", "--local-attention-window", "128"), BASE,
                    world_size=4)
    notes = model_notes(given.model, window_given=True)
    assert "it spans the whole sequence of 64 tokens: the local layers see every token)" in given.summary()
    assert len(notes) == 1 and "--local-attention-window 128" in notes[0] and "every token" not in notes[0], notes


def small_with(*argv) -> dict:
    """SMALL's fields with those the flags `argv` give."""
    return {**SMALL, **{name: value for name, value in flags(*argv).items() if value is not None}}


# SIZE / MATH fields a resume leaves to check_model_shapes (their tensors' shapes say it): the token-type
# table's rows, the vocab padding's, the position table's (a rope model has none: a resume may change it)
SHAPE_CHECKED = {"type_vocab_size", "make_vocab_size_divisible_by", "max_position_embeddings"}


def test_every_model_field_has_a_role_and_a_resume_decision():
    """megatron/model/fields.py: a new BertConfig field states what it is (its roles) and, where it shapes
    or computes the weights, whether a resume keeps it; it cannot go unchecked by forgetting a list."""
    import dataclasses

    from megatron.model import fields
    from megatron.model.args import BertConfig

    names = [field.name for field in dataclasses.fields(BertConfig)]
    assert all(fields.info(name).roles for name in names)
    assert set().union(*(fields.fields_with(role=role) for role in fields.Role)) >= set(names)
    weighty = set(fields.fields_with(role=fields.Role.SIZE) + fields.fields_with(role=fields.Role.MATH))
    undecided = weighty - set(fields.resume_kept()) - SHAPE_CHECKED
    assert not undecided, f"say whether a resume keeps {sorted(undecided)} (resume_order, or SHAPE_CHECKED)"
    orders = [fields.info(name).resume_order for name in fields.resume_kept()]
    assert len(set(orders)) == len(orders)
    free = fields.fields_with(role=fields.Role.REGIME) + fields.fields_with(role=fields.Role.RUN)
    assert not set(fields.resume_kept()) & set(free)


def test_every_field_flag_is_declared():
    """The flags the field facts name exist in pretrain_bert.py's parser, with the field's destination,
    taking a value or setting True / False as stated; every flag of the model groups sets a field or is
    one of the few that do not (aliases, presets, the global batch and activation checkpointing)."""
    from megatron.arguments import add_model_and_parallel_args, build_parser
    from megatron.model import fields

    options = build_parser()._option_string_actions
    for name in fields.dest_to_field().values():
        facts = fields.info(name)
        for flag, const in ((facts.flag, None), (facts.on_flag, True), (facts.off_flag, False)):
            if flag is not None:
                action = options.get(flag)
                assert action is not None and action.dest == (facts.dest or name), (name, flag)
                assert (action.nargs != 0) if const is None else (action.nargs == 0 and action.const is const), flag
    not_fields = {"help", "model_preset", "global_batch_size", "checkpoint_activations", "checkpoint_num_layers"}
    for action in add_model_and_parallel_args(argparse.ArgumentParser())._actions:
        assert action.dest in fields.dest_to_field() or action.dest in not_fields, action.option_strings


def test_the_json_section_keys_are_the_fields_json_keys():
    """Each field's JSON key reads back as that field (section_values), and the variant sub-sections are
    the variants that read the fields under them."""
    from megatron.config import section_values
    from megatron.model import fields

    for name in fields.fields_with(has_json=True):
        key, value = fields.info(name).json, fields.value_type(name)(1)
        variant, _, sub = key.rpartition(".")
        section = {variant: {sub: value}} if variant else {key: value}
        assert section_values({"sequence_parallel": section}) == {name: value}
        assert not variant or fields.info(name).variant == variant
    assert fields.variants_with_options() == ("linformer", "bigbird")


@pytest.mark.parametrize("ds_update, message", [
    # DeepSpeed features its JSON switches on that no check read: tracebacks inside DeepSpeed, or a run that changes
    ({"tensor_parallel": {"autotp_size": 2}}, 'tensor_parallel.autotp_size 2 is DeepSpeed\'s AutoTP tensor '
                                              'parallelism, which this trainer does not have'),
    ({"expert_parallel": {"enabled": True}}, 'expert_parallel.enabled switches on DeepSpeed\'s AutoEP'),
    ({"hybrid_engine": {"enabled": True}}, 'hybrid_engine.enabled switches on DeepSpeed-Chat\'s hybrid engine'),
    ({"autotuning": {"enabled": True}}, "autotuning.enabled switches on DeepSpeed's autotuning profile, which ends "
                                        "the process"),
    ({"datastates_ckpt": {}}, '"datastates_ckpt" switches DeepSpeed to the DataStates checkpoint engine'),
    ({"tensor_parallel": {"autotp_size": "2"}}, 'tensor_parallel.autotp_size = "2" is not an integer'),
    ({"gradient_allreduce_op": "SUM"}, 'gradient_allreduce_op "sum" adds up the ranks\' gradients'),
    ({"managed_gradient_accumulation": False}, "gradient accumulation would be lost"),
    # a grad_accum_dtype other than the weights' without ZeRO: DeepSpeed's NotImplementedError "unsupported mix"
    ({"data_types": {"grad_accum_dtype": "bf16"}, "zero_optimization": {"stage": 0}},
     'data_types.grad_accum_dtype bf16 with fp32 weights at zero_optimization.stage 0 stops DeepSpeed 0.19.8 with '
     '"unsupported mix"; remove data_types.grad_accum_dtype (DeepSpeed accumulates in another dtype than the '
     "weights' only for bf16 weights with fp32 accumulation at ZeRO 1"),
    ({"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"}},  # no zero section: stage 0
     '"unsupported mix"; set zero_optimization.stage to 1 (its BF16 optimizer)'),
    ({"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"},
      "zero_optimization": {"stage": 1, "compute_grad_norm": False}}, "zero_optimization.compute_grad_norm false"),
    # a path value DeepSpeed would take literally
    ({"tensorboard": {"enabled": True, "output_path": "$HOME/tb"}},
     'tensorboard.output_path "$HOME/tb" holds $HOME, which DeepSpeed does not expand'),
    ({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "${SCRATCH}/swap"}}},
     "zero_optimization.offload_param.nvme_path \"${SCRATCH}/swap\" holds ${SCRATCH}"),
    ({"flops_profiler": {"enabled": True, "output_file": "~nosuchuser1234/f.txt"}},
     'flops_profiler.output_file "~nosuchuser1234/f.txt" starts with ~nosuchuser1234, which names no user\'s home'),
    # a monitor's job_name, which DeepSpeed joins under its output_path
    ({"csv_monitor": {"enabled": True, "output_path": "out", "job_name": "run_$SLURM_JOB_ID"}},
     'csv_monitor.job_name "run_$SLURM_JOB_ID" holds $SLURM_JOB_ID, which DeepSpeed does not expand'),
    ({"tensorboard": {"enabled": True, "output_path": "out", "job_name": "~/tb"}},
     'tensorboard.job_name "~/tb" is not a folder name under tensorboard.output_path (DeepSpeed joins the two: it '
     "would write into a folder named ~); put the folder in tensorboard.output_path and a plain name in"),
    ({"tensorboard": {"enabled": True, "output_path": "out", "job_name": "/scratch/tb"}}, "would write outside"),
    ({"csv_monitor": {"enabled": True, "output_path": "out", "job_name": "a/../../b"}}, "would write outside"),
    # a Hugging Face Trainer template's "auto": the line says what it is
    ({"gradient_clipping": "auto"}, 'gradient_clipping = "auto" is not a number >= 0; set gradient_clipping to a '
                                    'number (0 turns clipping off) ("auto" is the Hugging Face Trainer\'s placeholder'),
    ({"train_micro_batch_size_per_gpu": "auto"}, 'train_micro_batch_size_per_gpu = "auto" is not an integer; set '
                                                 'train_micro_batch_size_per_gpu to an integer ("auto" is the Hugging'),
])
def test_json_settings_deepspeed_would_fail_on_or_misread_are_refused(ds_update, message):
    """Each is refused in one line naming the key (by the trainer's start-up, tools/ds_config.py validate and
    azureml/submit.py alike: resolve() runs check_deepspeed_types)."""
    with pytest.raises(ConfigError) as error:
        resolve(SMALL, {**BASE, **ds_update}, world_size=4, deepspeed_check=False)
    text = str(error.value)
    assert message in text and "\n" not in text and text.count("; ") == 1, text


@pytest.mark.parametrize("problem, noted", [
    ("zero_optimization.stage = \"auto\" is not an integer", True),
    ("zero_optimization.stage 3 refuses this", True),
    ("zero_optimization.stage3_prefetch_bucket_size = -1 is below 0", False),  # another key that starts alike
    ("the JSON's zero_optimization.stage_x is not a DeepSpeed key", False)])
def test_the_placeholder_note_is_for_errors_that_name_the_auto_key_as_a_whole(problem, noted):
    from megatron.ds_schema import PLACEHOLDER_NOTE, naming_placeholders

    with pytest.raises(ConfigError) as error:
        with naming_placeholders({"zero_optimization": {"stage": "auto"}}):
            raise ConfigError(problem, "fix it")
    assert error.value.problem == problem and (PLACEHOLDER_NOTE in error.value.fix) == noted, error.value.fix


@pytest.mark.parametrize("ds_update", [
    {"tensor_parallel": {"autotp_size": 1}}, {"tensor_parallel": {}}, {"expert_parallel": {"enabled": False}},
    {"hybrid_engine": {"enabled": False, "max_out_tokens": 512}}, {"autotuning": {"enabled": False}},
    {"datastates_ckpt": False}, {"gradient_allreduce_op": "mean"}, {"managed_gradient_accumulation": True},
    {"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"}, "zero_optimization": {"stage": 1}},
    {"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "bf16"}},  # the weights' own dtype at stage 0
    {"csv_monitor": {"enabled": True, "output_path": "~/csv"}},  # expanded by the trainer (expand_home_paths)
    # paths DeepSpeed never writes to: a disabled monitor's, an nvme_path of a CPU offload
    {"tensorboard": {"enabled": False, "output_path": "$OUT/tb"}},
    {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "nvme_path": "${SCRATCH}/swap"}}},
    {"zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"}},  # DeepSpeed's models drop an "auto"
])
def test_harmless_values_of_those_settings_pass(ds_update):
    ds_config = {**BASE, **ds_update}
    resolve(SMALL, ds_config, world_size=4, deepspeed_check=False)
    deepspeed_accepts(ds_config)


@pytest.mark.parametrize("ds_update, noted", [
    ({"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"}, "zero_optimization": {"stage": 1}},
     False),  # DeepSpeed's BF16 optimizer: fp32 accumulation
    ({"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"}, "zero_optimization": {"stage": 2}}, True),
    ({"data_types": {"grad_accum_dtype": "bf16"}, "zero_optimization": {"stage": 1}}, True),  # fp32 weights
    ({"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"},
      "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}}, True),  # ZeRO's CPU optimizer
])
def test_a_grad_accum_dtype_deepspeed_does_not_read_is_a_note(ds_update, noted):
    """DeepSpeed 0.19.8 reads grad_accum_dtype in its optimizer choice only (bf16 weights, fp32, ZeRO 1 without
    offload: its BF16 optimizer); ZeRO's optimizers never do: such a run starts, with one note saying so."""
    ds_config = {**BASE, **ds_update}
    resolve(SMALL, ds_config, world_size=4, deepspeed_check=False)
    notes = [note for note in json_notes(ds_config) if "grad_accum_dtype" in note]
    assert len(notes) == int(noted) and all("changes nothing" in note and "ZeRO 1 (its BF16 optimizer" in note
                                            for note in notes), notes

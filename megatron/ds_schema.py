"""What DeepSpeed 0.19.8's JSON accepts, checked without DeepSpeed where that is possible: its
top-level and section keys, the optimizer types and the params each takes, precision, ZeRO,
offload, dtype and quantizer rules, and the keys it would ignore or misread. megatron.config
resolves this project's own settings on top; tools/ds_config.py and azureml/submit.py refuse what
the trainer's start-up would. Nothing here imports torch or DeepSpeed except deepspeed_accepts
(DeepSpeed's own config models) and the op checks it runs.
"""
import contextlib
import copy
import difflib
import importlib.util
import json
import os
import re
import sys
from typing import NamedTuple

from megatron.errors import ConfigError
from megatron.paths import in_repository

SECTION = "sequence_parallel"  # this project's top-level key in the DeepSpeed JSON (megatron.config reads it)
# the monitor sections that write files, into output_path/job_name, made by DeepSpeed on rank 0
FILE_MONITORS = ("tensorboard", "csv_monitor")


def _bf16_key(ds_config: dict) -> str:
    """The JSON's bf16 section: "bf16", or its old name "bfloat16", which DeepSpeed reads when "bf16" is absent."""
    return "bf16" if "bf16" in ds_config else "bfloat16"


def check_checkpointing_section(ds_config: dict, sequence: int, pipeline: int, accumulation: int) -> None:
    """The JSON's "activation_checkpointing" settings DeepSpeed 0.19.8 cannot run here: a traceback on
    every rank (cpu_checkpointing without partitioned activations, which mangles the layers' saved
    inputs; contiguous_memory_optimization at the first evaluation; profile with a pipeline's non-reentrant
    checkpoint over several micro-batches), or activations split twice."""
    section = dict_section(ds_config, "activation_checkpointing")
    if (section.get("profile") and pipeline > 1 and accumulation > 1
            and dict_section(ds_config, "pipeline").get("use_reentrant") is False):
        raise ConfigError("activation_checkpointing.profile with the pipeline's non-reentrant checkpoint (pipeline."
                          f"use_reentrant false) and gradient accumulation ({accumulation} micro-batches a step) stops "
                          "DeepSpeed 0.19.8 at the first step (\"timer is not started\")", "drop "
                          "activation_checkpointing.profile, or pipeline.use_reentrant (the reentrant checkpoint, "
                          "DeepSpeed's default, profiles)")
    if section.get("partition_activations") and sequence > 1:
        raise ConfigError("activation_checkpointing.partition_activations would split sequence-split activations "
                          "across the seq ranks a second time", "set activation_checkpointing.partition_activations "
                          "to false with sequence parallelism")
    if section.get("cpu_checkpointing") and not section.get("partition_activations"):
        raise ConfigError("activation_checkpointing.cpu_checkpointing needs activation_checkpointing."
                          "partition_activations, which is not set", "set partition_activations (true, at "
                          "sequence-parallel size 1), or drop cpu_checkpointing")
    if section.get("contiguous_memory_optimization"):  # its buffers are freed by backward passes only
        raise ConfigError("activation_checkpointing.contiguous_memory_optimization fills DeepSpeed 0.19.8's "
                          "fixed checkpoint buffers in evaluation (forward passes without backward) and stops "
                          "the run there", "drop contiguous_memory_optimization")


def precision(ds_config: dict) -> str:
    """"fp16", "bf16" or "fp32": what the DeepSpeed JSON enables (bf16 under either name, _bf16_key)."""
    sections = {"fp16": ds_config.get("fp16"), "bf16": ds_config.get(_bf16_key(ds_config))}
    return next((kind for kind, section in sections.items() if isinstance(section, dict) and section.get("enabled")),
                "fp32")


def precision_description(ds_config: dict) -> str:
    """precision() for people: with torch_autocast on, the weights' dtype and the autocast's ("fp32 weights,
    bf16 autocast"), where precision() says the weights' alone (which decides kernels and checkpoint rules)."""
    autocast = ds_config.get("torch_autocast")
    if not (isinstance(autocast, dict) and autocast.get("enabled") is True):
        return precision(ds_config)
    dtype = "fp16" if autocast.get("dtype") in _DTYPE_NAMES["fp16"] else "bf16"  # what _check_autocast lets by
    return f"{precision(ds_config)} weights, {dtype} autocast"


# DeepSpeed 0.19.8's top-level keys (tests/ds_trace.py's traced_deepspeed_top_level_keys, which imports
# DeepSpeed, finds the same set: tests/test_ds_config_tool.py holds the two equal, so a DeepSpeed upgrade updates it)
DEEPSPEED_TOP_LEVEL_KEYS = frozenset({
    "activation_checkpointing", "aio", "amp", "auto", "auto_cast", "autotuning", "bf16",
    "bf16_master_weights_and_grads", "bf16_optimizer_states", "bfloat16", "buffer_dtype", "check_overflow",
    "checkpoint", "comet", "comms_logger", "communication_data_type", "compile", "compression_training",
    "consecutive_hysteresis", "csv_monitor", "curriculum_learning", "data_efficiency", "data_parallel_group",
    "data_types", "dataloader_drop_last", "datastates_ckpt", "ddp_bf16", "disable_allgather", "disable_python_gc",
    "ds_pipe_replicated", "dtype", "dump_state", "eigenvalue", "elasticity", "enabled", "encode", "eval",
    "expert_parallel", "flops_profiler", "fp16", "fp16_master_weights_and_grads", "fp32", "global_rank",
    "grad_accum_dtype", "gradient_accumulation_steps", "gradient_allreduce_op", "gradient_clipping",
    "gradient_predivide_factor", "graph_harvesting", "hybrid_engine", "hysteresis", "immediate_grad_update",
    "initial_scale_power", "keep_in_fp32_modules", "legacy_fusion", "load_universal", "log_level", "loss_scale",
    "loss_scale_window", "lower_precision_safe_modules", "managed_gradient_accumulation", "max_grad_norm", "mean",
    "memory_breakdown", "min_loss_scale", "nebula", "optimizer", "parallel_write", "param_dtype",
    "params", "pipeline", "pipeline_stage", "predict", "prescale_gradients", "progressive_layer_drop",
    "quantize_training", "scheduler", "seq_parallel_communication_data_type", "sparse_attention",
    "sparse_gradients", "steps_per_print", "sum", "tag_validation", "tensor_parallel", "tensorboard", "timers",
    "torch_autocast", "train", "train_batch_size", "train_micro_batch_size_per_gpu", "type",
    "use_data_before_expert_parallelism", "use_node_local_storage", "vocabulary_size", "wall_clock_breakdown",
    "wandb", "weight_quantization", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer",
    "zero_optimization"})
# optimizer.type spellings DeepSpeed accepts: its own optimizers and torch.optim's classes, by lower-case
# name (tests/ds_trace.py's traced_optimizer_names finds the same)
OPTIMIZER_NAMES = {name.lower(): name for name in (
    "Adadelta", "Adafactor", "adagrad", "adam", "Adamax", "adamw", "ASGD", "lamb", "LBFGS", "lion", "muadam",
    "muadamw", "muon", "musgd", "NAdam", "RAdam", "RMSprop", "Rprop", "SGD", "SparseAdam")}
# read by DeepSpeed outside DeepSpeedConfig's own look-ups (launcher, autotuner, profilers, ...)
_DEEPSPEED_OTHER_KEYS = {"optimizer", "scheduler", "activation_checkpointing", "flops_profiler", "aio", "autotuning",
                         "sparse_attention", "zero_optimization", "train_batch_size",
                         "fp16", "bf16", "amp", "checkpoint", "pipeline", "elasticity", "compression_training"}
# the top-level keys DeepSpeed 0.19.8 refuses as removed features (runtime/config.py's
# _REMOVED_TOP_LEVEL_CONFIG_KEYS; tests/test_ds_config_tool.py holds the two equal) -> (the feature, what to set
# instead here, "" where nothing replaces it): DeepSpeed's own sentence names no key and, for some, a successor
# this trainer refuses (data_efficiency's curriculum)
REMOVED_KEYS = {
    "nebula": ("Nebula checkpointing", "the trainer writes its checkpoints itself (--save)"),
    "compression_training": ("its compression library", ""),
    "amp": ("the NVIDIA Apex AMP integration", 'set "bf16": {"enabled": true} (or "fp16") instead'),
    "quantize_training": ("Mixture-of-Quantization (MoQ)", ""),
    "sparse_gradients": ("sparse embedding gradients", "this model's gradients are dense"),
    "eigenvalue": ("eigenvalue-based Mixture-of-Quantization", ""),
    "sparse_attention": ("DeepSpeed Sparse Attention", "for block-sparse attention pass --attention bigbird"),
    "elasticity": ("elastic training", "set the batch with train_batch_size and train_micro_batch_size_per_gpu (or "
                                       "--global-batch-size and --micro-batch-size)"),
    "graph_harvesting": ("graph harvesting", ""),
    "curriculum_learning": ("the top-level curriculum learning", ""),
    "progressive_layer_drop": ("Progressive Layer Dropping", ""),
}
# the "compile" section's keys of DeepSpeed 0.12-0.14 (torch.compile of the whole engine), which 0.19.8 refuses
_OLD_COMPILE_KEYS = ("enabled", "backend", "kwargs")
# ZeRO's keys that make DeepSpeed's save_16bit_model() gather the weights (three spellings of one setting)
GATHER_16BIT_KEYS = ("stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
                     "gather_16bit_weights_on_model_save")


# optimizer.params the trainer fills where neither its flags (--lr, --weight-decay, --adam-beta1/2,
# --adam-eps) nor the JSON give them, each only for an optimizer that takes it (training.deepspeed_settings;
# tools/ds_config.py show prints them)
OPTIMIZER_DEFAULTS = {"lr": 1e-4, "weight_decay": 0.01, "betas": [0.9, 0.999], "eps": 1e-8}
# keys DeepSpeed pops from an Adam's params before the optimizer class sees them (engine.py
# _configure_basic_optimizer, get_optimizer_configuration)
_ADAM_DEEPSPEED_KEYS = ("adam_w_mode", "torch_adam", "fp32_optimizer_states")
# optimizer.params each optimizer.type takes (lower-case): the keyword arguments of the class(es) DeepSpeed
# 0.19.8 builds for it (DeepSpeed's own: FusedAdam or DeepSpeedCPUAdam, FusedLamb, FusedLion or DeepSpeedCPULion,
# torch's Adagrad or DeepSpeedCPUAdagrad, Muon's halves; else torch.optim's class); tests/ds_trace.py's
# traced_optimizer_params finds the same (tests/test_ds_config_tool.py holds the two equal). Anything else is a
# TypeError inside deepspeed.initialize, or (Muon) silently ignored.
_TORCH_ADAMW = ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "foreach", "capturable",
                "differentiable", "fused")
_DEEPSPEED_ADAM = ("lr", "bias_correction", "betas", "eps", "weight_decay", "amsgrad", "set_grad_none",
                   *_ADAM_DEEPSPEED_KEYS)
OPTIMIZER_PARAMS = {name: frozenset(params) for name, params in {
    "adam": _DEEPSPEED_ADAM, "adamw": _DEEPSPEED_ADAM,
    "adagrad": ("lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps", "foreach", "maximize",
                "differentiable", "fused", "amsgrad", "fp32_optimizer_states"),
    "lamb": ("lr", "bias_correction", "betas", "eps", "eps_inside_sqrt", "weight_decay", "max_coeff", "min_coeff",
             "amsgrad"),
    "lion": ("lr", "betas", "weight_decay", "set_grad_none", "fp32_optimizer_states"),
    "muon": ("lr", "momentum", "weight_decay", "ns_method", "betas", "eps", "muon_lr", "adam_lr",
             *_ADAM_DEEPSPEED_KEYS),
    "adadelta": ("lr", "rho", "eps", "weight_decay", "foreach", "capturable", "maximize", "differentiable"),
    "adafactor": ("lr", "beta2_decay", "eps", "d", "weight_decay", "foreach", "maximize"),
    "adamax": ("lr", "betas", "eps", "weight_decay", "foreach", "maximize", "differentiable", "capturable"),
    "asgd": ("lr", "lambd", "alpha", "t0", "weight_decay", "foreach", "maximize", "differentiable", "capturable"),
    "lbfgs": ("lr", "max_iter", "max_eval", "tolerance_grad", "tolerance_change", "history_size", "line_search_fn"),
    "nadam": ("lr", "betas", "eps", "weight_decay", "momentum_decay", "decoupled_weight_decay", "foreach", "maximize",
              "capturable", "differentiable"),
    "radam": ("lr", "betas", "eps", "weight_decay", "decoupled_weight_decay", "foreach", "maximize", "capturable",
              "differentiable"),
    "rmsprop": ("lr", "alpha", "eps", "weight_decay", "momentum", "centered", "capturable", "foreach", "maximize",
                "differentiable"),
    "rprop": ("lr", "etas", "step_sizes", "capturable", "foreach", "maximize", "differentiable"),
    "sgd": ("lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize", "foreach", "differentiable",
            "fused"),
    "sparseadam": ("lr", "betas", "eps", "maximize"),
}.items()}
# Adam / AdamW with optimizer.params.torch_adam true: torch's AdamW (or Adam) gets the params
TORCH_ADAM_PARAMS = frozenset((*_TORCH_ADAMW, *_ADAM_DEEPSPEED_KEYS))
# muP's optimizers come from the `mup` package (not a dependency); their params are torch's
_MUP_OPTIMIZERS = ("muadam", "muadamw", "musgd")
# optimizer types that cannot train this model whatever their params
_UNUSABLE_OPTIMIZERS = {
    "lbfgs": "LBFGS needs a closure that re-evaluates the loss, which DeepSpeed's engine.step() does not pass",
    "sparseadam": "SparseAdam takes only sparse gradients and every gradient of this model is dense"}
_CUDA_ONLY_OPTIMIZERS = {"lamb": "FusedLamb", "lion": "FusedLion"}  # DeepSpeed's kernels: "not implemented on CPU"
# optimizer types whose class is in DeepSpeed's ZERO_SUPPORTED_OPTIMIZERS (runtime/zero/utils.py; muP's MuAdam /
# MuAdamW build torch's Adam / AdamW): any other needs "zero_allow_untested_optimizer" under ZeRO 1-3
_ZERO_TESTED_OPTIMIZERS = ("adam", "adamw", "adagrad", "lion", "muon", "muadam", "muadamw")
# value rules of the params that have one meaning in every optimizer taking them
_NON_NEGATIVE_PARAMS = ("lr", "weight_decay", "momentum", "dampening", "lr_decay", "initial_accumulator_value",
                        "momentum_decay", "muon_lr", "adam_lr", "rho", "alpha")
_BOOLEAN_PARAMS = ("amsgrad", "bias_correction", "set_grad_none", "nesterov", "maximize", "capturable",
                   "differentiable", "centered", "decoupled_weight_decay", "eps_inside_sqrt", *_ADAM_DEEPSPEED_KEYS)
_BOOLEAN_OR_NULL_PARAMS = ("foreach", "fused")


# the classes DeepSpeed builds from its own optimizer types (engine._configure_basic_optimizer); the others
# are torch.optim's class of that name
_CLASSES_BUILT = {
    "adam": "FusedAdam on CUDA, DeepSpeedCPUAdam under ZeRO offload, torch's AdamW without CUDA",
    "adamw": "FusedAdam on CUDA, DeepSpeedCPUAdam under ZeRO offload, torch's AdamW without CUDA",
    "lamb": "FusedLamb, on CUDA only", "lion": "FusedLion on CUDA, DeepSpeedCPULion under ZeRO offload",
    "adagrad": "torch's Adagrad, DeepSpeedCPUAdagrad under ZeRO offload"}


def optimizer_type_of_class(spelling: str) -> str | None:
    """The optimizer.type whose class `spelling` names, as Megatron-DeepSpeed and DeepSpeed's docs write
    them (FusedAdam, DeepSpeedCPUAdam, CPU_Adam, deepspeed.ops.lamb.FusedLamb, torch.optim.AdamW), or None."""
    name = spelling.rsplit(".", 1)[-1].lower().replace("_", "").replace("-", "")
    return OPTIMIZER_NAMES.get(re.sub(r"^(deepspeed)?(fused|cpu)?", "", name))


def optimizer_params_taken(ds_config: dict, cuda: bool | None = None) -> tuple:
    """(the optimizer.params the JSON's optimizer.type takes, the optimizer named as in an error), or
    (None, name) where they are not known here (muP's). Which Adam DeepSpeed builds follows
    optimizer.params.torch_adam, which the trainer sets without CUDA: `cuda` None (not known) takes
    either Adam's params."""
    optimizer = ds_config.get("optimizer") or {}
    name = str(optimizer.get("type") or "AdamW")
    params = optimizer.get("params") if isinstance(optimizer.get("params"), dict) else {}
    if name.lower() in ("adam", "adamw"):
        torch_adam = params.get("torch_adam", None if cuda is None else not cuda)
        if torch_adam is True:
            return TORCH_ADAM_PARAMS, f"torch's {name} (optimizer.params.torch_adam true, the default without CUDA)"
        if torch_adam is None:
            return OPTIMIZER_PARAMS[name.lower()] | TORCH_ADAM_PARAMS, f"optimizer.type {name}"
        return OPTIMIZER_PARAMS[name.lower()], f"DeepSpeed's {name} (FusedAdam, or CPUAdam under ZeRO offload)"
    return OPTIMIZER_PARAMS.get(name.lower()), f"optimizer.type {name}"


def check_optimizer(ds_config: dict, cuda: bool | None = None) -> None:
    """optimizer.type usable here and optimizer.params that it takes, each of the right type and range:
    otherwise deepspeed.initialize fails with a TypeError (or a value error inside torch) after the
    data's index maps are built, or (Muon) ignores the key. `cuda`: whether the run has CUDA (None:
    not known, the device-only rules are skipped)."""
    optimizer = ds_config.get("optimizer")
    if not isinstance(optimizer, dict):
        return
    name = str(optimizer.get("type") or "AdamW")
    kind = name.lower()
    if kind in _UNUSABLE_OPTIMIZERS:
        raise ConfigError(f"optimizer.type {name} cannot train this model: {_UNUSABLE_OPTIMIZERS[kind]}",
                          "use AdamW (the default) or another optimizer")
    if kind in _MUP_OPTIMIZERS and importlib.util.find_spec("mup") is None:
        raise ConfigError(f"optimizer.type {name} comes from the mup package, which is not installed",
                          "pip install mup, or use AdamW (the default)")
    zero = ds_config.get("zero_optimization")
    offload = zero.get("offload_optimizer") if isinstance(zero, dict) else None
    on_cpu = isinstance(offload, dict) and offload.get("device") in ("cpu", "nvme")
    if cuda is False and kind in _CUDA_ONLY_OPTIMIZERS and not (kind == "lion" and on_cpu):
        raise ConfigError(f"optimizer.type {name} is DeepSpeed's {_CUDA_ONLY_OPTIMIZERS[kind]}, a CUDA kernel, and "
                          "this run has no CUDA", "use AdamW (torch's, the default without CUDA) or run on GPUs")
    params = optimizer.get("params", {})
    if not isinstance(params, dict):
        raise ConfigError(f"optimizer.params = {json.dumps(params)} is not a JSON object",
                          "make optimizer.params a JSON object or remove it")
    taken, which = optimizer_params_taken(ds_config, cuda)
    for key, value in params.items():
        where = f"optimizer.params.{key}"
        if key == "max_grad_norm":
            raise ConfigError(f"{where} is not read by DeepSpeed (it refuses it at start-up)",
                              "set the top-level gradient_clipping (or --clip-grad) instead")
        if taken is not None and key not in taken:
            raise ConfigError(f"{where} is not a parameter of {which}, which takes {', '.join(sorted(taken))}",
                              f"remove {key} or choose an optimizer.type that takes it")
        _check_optimizer_value(where, key, value, kind)
    stage = zero.get("stage", 0) if isinstance(zero, dict) else 0
    if (kind not in _ZERO_TESTED_OPTIMIZERS and isinstance(stage, int) and stage > 0
            and ds_config.get("zero_allow_untested_optimizer") is not True):
        raise ConfigError(f"optimizer.type {name} is not one DeepSpeed has tested with ZeRO (zero_optimization.stage "
                          f"{stage}), and it refuses it", 'add "zero_allow_untested_optimizer": true to use it anyway, '
                          "or set zero_optimization.stage to 0, or use AdamW")


def _check_optimizer_value(where: str, key: str, value, kind: str) -> None:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if key in _NON_NEGATIVE_PARAMS and not (number and value >= 0):
        raise ConfigError(f"{where} = {json.dumps(value)} is not a number >= 0",
                          f"set {where} to a number{', e.g. 1e-4' if key == 'lr' else ''}, without quotes")
    if key == "eps" and kind != "adafactor" and not (number and value > 0):  # Adafactor's eps is a pair
        raise ConfigError(f"{where} = {json.dumps(value)} is not a number > 0", f"set {where} to e.g. 1e-8")
    if key == "betas" and not (isinstance(value, list) and len(value) == 2 and all(
            isinstance(beta, (int, float)) and not isinstance(beta, bool) and 0 <= beta < 1 for beta in value)):
        raise ConfigError(f"{where} = {json.dumps(value)} is not two numbers in [0, 1)",
                          f"set {where} to e.g. [0.9, 0.999]")
    if key in _BOOLEAN_PARAMS and not isinstance(value, bool):
        raise ConfigError(f"{where} = {json.dumps(value)} is not a boolean", f"set {where} to true or false")
    if key in _BOOLEAN_OR_NULL_PARAMS and not (value is None or isinstance(value, bool)):
        raise ConfigError(f"{where} = {json.dumps(value)} is not a boolean or null",
                          f"set {where} to true, false or null")


def default_optimizer(ds_config: dict, cuda: bool) -> dict:
    """Checks the JSON's optimizer (check_optimizer), then fills it in place: AdamW when it names none,
    the OPTIMIZER_DEFAULTS its params lack (those its type takes), and torch's Adam where there is no
    CUDA (DeepSpeed's FusedAdam needs a GPU); returns the params."""
    optimizer = ds_config.setdefault("optimizer", {"type": "AdamW", "params": {}})
    params = optimizer.setdefault("params", {}) if isinstance(optimizer, dict) else None
    if not isinstance(params, dict):
        key, value = ("optimizer", optimizer) if params is None else ("optimizer.params", params)
        raise ConfigError(f"{key} = {json.dumps(value)} is not a JSON object", f"make {key} a JSON object or remove it")
    if optimizer.get("type") is None:  # DeepSpeed would build no optimizer at all
        optimizer["type"] = "AdamW"
    check_optimizer(ds_config, cuda)
    adam = optimizer["type"].lower() in ("adam", "adamw")
    if adam and not cuda:
        params.setdefault("torch_adam", True)
    taken, _ = optimizer_params_taken(ds_config, cuda)
    for key, value in OPTIMIZER_DEFAULTS.items():
        if (taken is None or key in taken) and not (key == "eps" and optimizer["type"].lower() == "adafactor"):
            # Adafactor's eps is a pair (its own default stays)
            params.setdefault(key, copy.deepcopy(value))  # the defaults' betas list is never the JSON's
    return params


def deepspeed_top_level_keys() -> set:
    """Top-level keys DeepSpeed reads, and this project's section. DeepSpeed ignores any other
    key, so a typo such as `trian_batch_size` would change nothing."""
    return DEEPSPEED_TOP_LEVEL_KEYS | {SECTION}


def check_deepspeed_types(ds_config: dict) -> None:
    """The DeepSpeed keys read here (and by the trainer) before DeepSpeed sees them have the right JSON
    type: otherwise the mistake surfaces later as an AttributeError or TypeError far from the key.
    Keys DeepSpeed would ignore and `enabled` values that are not booleans (DeepSpeed reads "false"
    as true) are refused too, and so are a "scheduler", which DeepSpeed would silently drop for the
    schedule the trainer hands it, a checkpoint writer, which would write around the trainer's staged
    save, universal-checkpoint loading (the trainer reads its checkpoints in any layout), and data
    efficiency, which works on a loader the trainer does not use, and the DeepSpeed features it does not run
    (_unsupported_feature), a grad_accum_dtype DeepSpeed cannot mix with the weights' (_check_grad_accum_mix) and
    a $VAR in a path value (here, so that tools/ds_config.py and azureml/submit.py refuse them too). A refused
    value "auto" gets the note saying what it is (naming_placeholders)."""
    with naming_placeholders(ds_config):
        _refuse_ignored_sections(ds_config)
        _check_enabled_flags(ds_config, "")
        _check_optimizer_type(ds_config)
        for key in ("zero_optimization", "activation_checkpointing", "pipeline", "optimizer", "fp16", "bf16",
                    "bfloat16", "torch_autocast", "data_types", SECTION):
            if key in ds_config and not isinstance(ds_config[key], dict):
                raise ConfigError(f"{key} = {json.dumps(ds_config[key])} is not a JSON object",
                                  f'write "{key}": {{...}} or remove it')
        check_optimizer(ds_config)
        _check_pipeline_section(dict_section(ds_config, "pipeline"))
        _check_checkpointing_keys(dict_section(ds_config, "activation_checkpointing"))
        for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
            if ds_config.get(key) is not None:  # null: derived from the other two
                typed(key, ds_config[key], int)
        _check_precision_and_zero(ds_config)
        _check_dtypes(ds_config)
        _check_top_level_scalars(ds_config)
        _check_path_values(ds_config)


def check_section_keys(name: str, section: dict, known) -> None:
    """Each key of the JSON's `name` section is one of `known`: a top-level key of DeepSpeed's there is named with
    the level it belongs at, any other with the keys to use (neither DeepSpeed nor the trainer would read it)."""
    for key in section:
        if key in known:
            continue
        if key in deepspeed_top_level_keys() and key != name:  # a DeepSpeed key one level too deep
            raise ConfigError(f"{name}.{key} is a top-level key of DeepSpeed's, not one of the {name} section "
                              "(DeepSpeed would not read it there)", f"move {key!r} out of the {name} section to the "
                              "JSON's top level")
        close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75)
        raise ConfigError(f"unknown key {name}.{key}", (f"did you mean {close[0]!r}? " if close else "")
                          + f"use one of: {', '.join(sorted(known))}")


# DeepSpeed 0.19.8's "pipeline" keys that the run honours: the stages (megatron.config), use_reentrant (read by its
# pipeline engine), the activation partitioning at false (the trainer sets it) and the recompute interval at 0
# (--checkpoint-num-layers sets it); its others, read only from the PipelineModule the trainer builds -> why
PIPELINE_KEYS = ("stages", "use_reentrant", "pipe_partitioned", "grad_partitioned", "activation_checkpoint_interval")
_PIPELINE_NOT_READ = {
    "partition": "which the trainer builds split by transformer layer",
    "seed_layers": "which the trainer builds; each layer's starting weights come from --seed and the layer's BertModel "
                   "name, the same in any layout"}


def _check_pipeline_section(section: dict) -> None:
    """The JSON's "pipeline" keys as the run reads them: a key of DeepSpeed's section that only its PipelineModule
    takes (_PIPELINE_NOT_READ), or one the trainer overrides (activation partitioning, which the seq ranks'
    sequence chunks rule out) or would not know about (a recompute interval DeepSpeed's pipeline engine switches on
    without the trainer's activation checkpointing), is refused as an unknown one is: each ran silently as
    something else."""
    for key, why in _PIPELINE_NOT_READ.items():
        if key in section:
            raise ConfigError(f"pipeline.{key} is not read (DeepSpeed takes it from the PipelineModule, {why})",
                              f'remove "{key}" from "pipeline"')
    check_section_keys("pipeline", section, PIPELINE_KEYS)
    if section.get("use_reentrant") is not None:  # DeepSpeed reads anything but false as true
        typed("pipeline.use_reentrant", section["use_reentrant"], bool)
    for key, sent in (("pipe_partitioned", "a stage's activations"), ("grad_partitioned", "their gradients")):
        if typed(f"pipeline.{key}", section.get(key, False), bool):
            raise ConfigError(f"pipeline.{key} true is not used: the trainer sends {sent} whole (DeepSpeed would "
                              "split them over the seq ranks, which hold different sequence chunks)",
                              f"remove {key} (or set it false)")
    interval = typed("pipeline.activation_checkpoint_interval", section.get("activation_checkpoint_interval", 0), int)
    if interval:
        raise ConfigError(f"pipeline.activation_checkpoint_interval {interval} would switch on DeepSpeed's recompute "
                          "behind the trainer, which neither configures DeepSpeed's activation checkpointing for it "
                          "nor records it", "remove it and pass --checkpoint-activations --checkpoint-num-layers "
                          f"{interval} (or add an \"activation_checkpointing\" section)")


# DeepSpeed 0.19.8's "activation_checkpointing" keys (runtime/activation_checkpointing/config.py, which reads them
# without a check: a typo was ignored, "false" read as true) -> their type
CHECKPOINTING_KEYS = {"partition_activations": bool, "contiguous_memory_optimization": bool, "cpu_checkpointing": bool,
                      "number_checkpoints": int, "synchronize_checkpoint_boundary": bool, "profile": bool}


def _check_checkpointing_keys(section: dict) -> None:
    check_section_keys("activation_checkpointing", section, CHECKPOINTING_KEYS)
    for key, value in section.items():
        if value is not None:  # null: DeepSpeed's default
            typed(f"activation_checkpointing.{key}", value, CHECKPOINTING_KEYS[key])


PLACEHOLDER = "auto"  # the Hugging Face Trainer's value for "fill this in from my arguments"
PLACEHOLDER_NOTE = ('"auto" is the Hugging Face Trainer\'s placeholder, which it replaces before DeepSpeed reads the '
                    "JSON: write the value, or drop the key where a flag sets it")


def placeholder_keys(node, prefix: str = "") -> list[str]:
    """The dotted keys of the JSON whose value is "auto" (a Hugging Face Trainer template's)."""
    found = []
    for key, value in node.items() if isinstance(node, dict) else ():
        found += [prefix + key] if value == PLACEHOLDER else placeholder_keys(value, f"{prefix}{key}.")
    return found


@contextlib.contextmanager
def naming_placeholders(ds_config: dict):
    """A ConfigError about a value "auto" gets PLACEHOLDER_NOTE after its fix: a Hugging Face Trainer template's
    placeholder, which no check here (nor DeepSpeed) can fill in. The error names the value or its dotted key
    as a whole word (train_batch_size "auto" is not what an error about train_batch_size_per_gpu names)."""
    try:
        yield
    except ConfigError as error:
        named = f'"{PLACEHOLDER}"' in error.problem or any(
            re.search(rf"(?<![\w.]){re.escape(key)}(?![\w])", error.problem) for key in placeholder_keys(ds_config))
        if not named or PLACEHOLDER_NOTE in error.fix:
            raise
        raise ConfigError(error.problem, f"{error.fix} ({PLACEHOLDER_NOTE})") from None


# the JSON's path values (a folder or a file DeepSpeed writes), which DeepSpeed uses as written: it expands
# neither ~ nor $VAR (a folder named "~" in the current one would take the files)
PATH_KEYS = (("tensorboard", "output_path"), ("csv_monitor", "output_path"), ("flops_profiler", "output_file"),
             ("zero_optimization", "offload_optimizer", "nvme_path"),
             ("zero_optimization", "offload_param", "nvme_path"))
_VARIABLE = re.compile(r"\$(\{[A-Za-z_]\w*\}|[A-Za-z_]\w*)")  # $HOME, ${HOME}


def path_values(ds_config: dict) -> list[tuple[str, dict, str, str]]:
    """(dotted key, the section holding it, its last key, value) of each PATH_KEYS value the JSON gives as a string
    and DeepSpeed writes to: a monitor's or the profiler's with "enabled": true, an offload's nvme_path with
    "device": "nvme" (a template's other paths are never used)."""
    found = []
    for keys in PATH_KEYS:
        section = ds_config
        for key in keys[:-1]:
            section = section.get(key) if isinstance(section, dict) else None
        in_use = isinstance(section, dict) and (section.get("device") == "nvme" if keys[-1] == "nvme_path"
                                                else section.get("enabled") is True)
        if in_use and isinstance(section.get(keys[-1]), str):
            found.append((".".join(keys), section, keys[-1], section[keys[-1]]))
    return found


def _check_path_values(ds_config: dict) -> None:
    """A $VAR in a path value, which DeepSpeed would take as a folder's name ("$HOME" in the current folder);
    a leading ~ passes: the trainer expands it (expand_home_paths) as it does in a path flag. A file-writing
    monitor's job_name is one folder's name under its output_path, where DeepSpeed joins it: a $VAR, a ~, an
    absolute path or a .. in it wrote into a folder named so, or past output_path."""
    for key, _, _, value in path_values(ds_config):
        _refuse_variable(key, value, "write the full path in")
        if value.startswith("~") and os.path.expanduser(value) == value:
            raise ConfigError(f"{key} {json.dumps(value)} starts with {value.split('/')[0]}, which names no user's "
                              "home here", f"write the full path in {key}")
    for name in FILE_MONITORS:
        section = ds_config.get(name)
        job = section.get("job_name") if isinstance(section, dict) and section.get("enabled") is True else None
        if not isinstance(job, str):
            continue
        key = f"{name}.job_name"
        _refuse_variable(key, job, "write the name itself in")
        if job.startswith("~") or os.path.isabs(job) or ".." in job.split("/"):
            where = "into a folder named ~" if job.startswith("~") else "outside output_path"
            raise ConfigError(f"{key} {json.dumps(job)} is not a folder name under {name}.output_path (DeepSpeed "
                              f"joins the two: it would write {where})", f"put the folder in {name}.output_path and "
                              f"a plain name in {key}")


def _refuse_variable(key: str, value: str, fix: str) -> None:
    if variable := _VARIABLE.search(value):
        raise ConfigError(f"{key} {json.dumps(value)} holds {variable.group(0)}, which DeepSpeed does not expand "
                          f"(it would write into a folder named {json.dumps(variable.group(0))})", f"{fix} {key}")


def expand_home_paths(ds_config: dict) -> dict:
    """`ds_config` with a leading ~ of its path values expanded, in place (the dict the trainer hands DeepSpeed,
    not the user's file): as paths.expand_home does for the flags, so the files go to the home folder and not into
    a folder named "~" in the current one."""
    for _, section, key, value in path_values(ds_config):
        section[key] = os.path.expanduser(value)
    return ds_config


def dict_section(ds_config: dict, key: str) -> dict:
    """The JSON's `key` section, {} when it is missing or no object (its type is checked elsewhere)."""
    value = ds_config.get(key)
    return value if isinstance(value, dict) else {}


def _refuse_ignored_sections(ds_config: dict) -> None:
    """Top-level keys DeepSpeed would ignore, and the sections it reads that the trainer works around
    (check_deepspeed_types says why each is refused)."""
    unknown = sorted(set(ds_config) - deepspeed_top_level_keys())
    from megatron.config import section_keys  # config imports this module: here, once both are loaded

    misplaced = [key for key in unknown if key in section_keys()]
    if misplaced:
        raise ConfigError(f"{misplaced[0]!r} at the top level of the DeepSpeed JSON is a key of its {SECTION} section "
                          "(DeepSpeed would ignore it there)", f'move it into "{SECTION}": {{...}}')
    for key in unknown:  # a wrapper object ("monitor_config": {"tensorboard": ...})
        inner = sorted(set(ds_config[key]) & deepspeed_top_level_keys()) if isinstance(ds_config[key], dict) else []
        if inner:
            raise ConfigError(f"unknown top-level key {key!r}: DeepSpeed would ignore it, and the "
                              f"{', '.join(map(repr, inner))} in it", f"move {', '.join(map(repr, inner))} to the top "
                              f"level of the JSON and remove {key!r}")
    if unknown:
        close = difflib.get_close_matches(unknown[0], sorted(deepspeed_top_level_keys()), n=1, cutoff=0.75)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(f"unknown top-level key {unknown[0]!r} (DeepSpeed would ignore it)",
                          f"{hint}fix the spelling or remove it (https://www.deepspeed.ai/docs/config-json/)")
    _refuse_removed_and_uncalled(ds_config)
    if "scheduler" in ds_config:
        raise ConfigError('the DeepSpeed JSON\'s "scheduler" section is not used (the trainer runs Megatron\'s '
                          'warm-up + decay schedule)', 'remove "scheduler" and set --lr, --min-lr, --lr-decay-style '
                          "and --lr-warmup-fraction")
    checkpointing = dict_section(ds_config, "checkpoint")
    if checkpointing.get("writer") is not None:
        raise ConfigError("checkpoint.writer cannot be used: the trainer stages each checkpoint in a .partial folder "
                          "and renames it when complete, which DeepSpeed's writers (decoupled, fast, mock) defer, "
                          "skip or fail without the launcher", 'remove "writer" from "checkpoint"')
    if checkpointing.get("load_universal"):
        raise ConfigError("checkpoint.load_universal cannot be used: the trainer resumes its checkpoints in any "
                          "layout itself; with it DeepSpeed reads them as universal checkpoints, which they are not",
                          'remove "load_universal" from "checkpoint" (see ' + in_repository("docs/resuming.md") + ")")
    if _enables_anything(ds_config.get("data_efficiency")):
        raise ConfigError('the DeepSpeed JSON\'s "data_efficiency" section is not used (the trainer builds its own '
                          "samples and loader, which DeepSpeed's data sampling and routing never see; random-LTD "
                          "fails inside DeepSpeed)", 'remove "data_efficiency"')
    if unsupported := _unsupported_feature(ds_config):
        raise ConfigError(*unsupported)
    if ds_config.get("weight_quantization"):
        raise ConfigError('the DeepSpeed JSON\'s "weight_quantization" section is ZeRO-Inference\'s weight '
                          "quantization, not training's (post_init_quant is never read; quantized_initialization "
                          "fails inside DeepSpeed at the first ZeRO-3 step)", 'remove "weight_quantization"')


def _unsupported_feature(ds_config: dict) -> tuple[str, str] | None:
    """(problem, fix) of the first top-level setting that switches on a DeepSpeed feature this trainer does not
    run: each key is one DeepSpeed knows (so _refuse_ignored_sections lets it by) and no other check reads, and a
    template's harmless values (autotp_size 1, "enabled": false) pass."""
    autotp = typed("tensor_parallel.autotp_size", dict_section(ds_config, "tensor_parallel").get("autotp_size", 0),
                   int)  # DeepSpeed's model reads "2" and 2.0 as 2
    if autotp > 1:
        return (f"tensor_parallel.autotp_size {autotp} is DeepSpeed's AutoTP tensor parallelism, which this trainer "
                "does not have (DeepSpeed stops at the first batch: \"Data inconsistency within the TP group\")",
                'remove "tensor_parallel" (or set autotp_size to 1) and split the sequence (--sequence-parallel-size '
                "N --attention ring), the layers (--pipeline-model-parallel-size N) or the optimizer state "
                "(zero_optimization.stage 1-3)")
    for key, feature in _ENABLED_FEATURES.items():
        if dict_section(ds_config, key).get("enabled") is True:
            return f"{key}.enabled switches on {feature}", f'remove "{key}" (or set {key}.enabled to false)'
    if "datastates_ckpt" in ds_config and ds_config["datastates_ckpt"] is not False:
        return ('"datastates_ckpt" switches DeepSpeed to the DataStates checkpoint engine (any value but false), '
                "which writes around the trainer's staged save and needs the datastates package",
                'remove "datastates_ckpt" (the trainer writes its checkpoints itself: --save)')
    if str(ds_config.get("gradient_allreduce_op", "mean")).lower() == "sum":
        return ('gradient_allreduce_op "sum" adds up the ranks\' gradients, where the trainer\'s loss is written '
                "for DeepSpeed's default mean: each update would grow with the number of ranks",
                'remove gradient_allreduce_op (DeepSpeed\'s default "mean")')
    if ds_config.get("managed_gradient_accumulation") is False:
        return ("managed_gradient_accumulation false makes each engine.step() an optimizer step, and the trainer "
                "steps the engine after every micro batch: gradient accumulation would be lost",
                "remove managed_gradient_accumulation (true, DeepSpeed's default)")
    return None


# top-level sections whose "enabled": true switches on a DeepSpeed feature this trainer does not run -> what it does
_ENABLED_FEATURES = {
    "expert_parallel": "DeepSpeed's AutoEP, expert parallelism for Mixture-of-Experts layers, which this model "
                       "does not have",
    "hybrid_engine": "DeepSpeed-Chat's hybrid engine (RLHF generation with inference kernels), which "
                     "deepspeed.initialize then builds in place of the training engine this trainer drives",
    "autotuning": "DeepSpeed's autotuning profile, which ends the process after autotuning.end_profile_step "
                  "(step 5 by default) as only the experiments of its autotuner (deepspeed --autotuning) want",
}


def _refuse_removed_and_uncalled(ds_config: dict) -> None:
    """The keys DeepSpeed 0.19.8 refuses as removed features (REMOVED_KEYS), named with what to set instead,
    and a "compile" section that asks for compilation (read by engine.compile() alone, which the trainer never
    calls; one of defaults only, as templates carry, changes nothing and passes)."""
    removed = next((key for key in REMOVED_KEYS if key in ds_config), None)
    if removed:
        feature, instead = REMOVED_KEYS[removed]
        raise ConfigError(f'"{removed}" in the DeepSpeed JSON: DeepSpeed 0.19.8 removed {feature} and refuses the key',
                          f'remove "{removed}"' + (f"; {instead}" if instead else ""))
    compile_section = dict_section(ds_config, "compile")
    old = [key for key in _OLD_COMPILE_KEYS if key in compile_section]
    if old or compile_section.get("deepcompile"):  # a section of defaults alone (a template's) changes nothing
        form = (f" (compile.{old[0]} is DeepSpeed 0.12-0.14's form, which 0.19.8 refuses)" if old else "")
        raise ConfigError(f'the DeepSpeed JSON\'s "compile" section is not used: DeepSpeed compiles only in '
                          f"engine.compile(), which this trainer does not call{form}", 'remove "compile"; this '
                          "trainer compiles each layer's MLP with --compile-mlp (torch.compile, inductor)")


def _check_optimizer_type(ds_config: dict) -> None:
    """optimizer.type is one DeepSpeed knows; a class name (FusedAdam, torch.optim.AdamW) gets the type to write."""
    optimizer_type = (ds_config.get("optimizer", {}).get("type") if isinstance(ds_config.get("optimizer"), dict)
                      else None)
    if optimizer_type is not None:
        names = OPTIMIZER_NAMES
        if not isinstance(optimizer_type, str) or optimizer_type.lower() not in names:
            meant = optimizer_type_of_class(optimizer_type) if isinstance(optimizer_type, str) else None
            if meant:
                raise ConfigError(f"optimizer.type {json.dumps(optimizer_type)} names a class, which DeepSpeed does "
                                  "not take as optimizer.type", f'use "{meant}": DeepSpeed picks the class from it '
                                  f"({_CLASSES_BUILT.get(meant.lower(), f'torch.optim.{meant}')})")
            raise ConfigError(f"optimizer.type {json.dumps(optimizer_type)} is not an optimizer DeepSpeed knows",
                              f"use one of {', '.join(sorted(set(names.values()), key=str.lower))}")


def _check_top_level_scalars(ds_config: dict) -> None:
    """gradient_clipping and the _TOP_LEVEL_SCALARS, which DeepSpeed reads without checking their type."""
    clipping = ds_config.get("gradient_clipping", 0.0)
    if isinstance(clipping, bool) or not isinstance(clipping, (int, float)) or not clipping >= 0:
        raise ConfigError(f"gradient_clipping = {json.dumps(clipping)} is not a number >= 0",
                          "set gradient_clipping to a number (0 turns clipping off)")
    for key, rule in _TOP_LEVEL_SCALARS.items():
        value = ds_config.get(key)
        if value is None:
            continue
        if rule == "boolean" and not isinstance(value, bool):
            raise ConfigError(f"{key} = {json.dumps(value)} is not a boolean (DeepSpeed would read it without "
                              "checking)", f"set {key} to true or false, without quotes")
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if (rule == "an integer >= 1" and not (number and isinstance(value, int) and value >= 1)
                or rule == "a number > 0" and not (number and value > 0)):
            raise ConfigError(f"{key} = {json.dumps(value)} is not {rule}", f"set {key} to {rule}, without quotes")


# the keys DeepSpeed 0.19.8's config models for these sections accept (they forbid any other);
# tests/ds_trace.py's traced_section_keys finds the same (tests/test_ds_config_tool.py holds the two equal)
_BF16_KEYS = frozenset({"enabled", "immediate_grad_update", "check_grad_overflow", "bf16_master_weights_and_grads",
                        "bf16_optimizer_states"})
DEEPSPEED_SECTION_KEYS = {
    "fp16": frozenset({"enabled", "auto_cast", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
                       "consecutive_hysteresis", "min_loss_scale", "fp16_master_weights_and_grads"}),
    "bf16": _BF16_KEYS, "bfloat16": _BF16_KEYS,
    "zero_optimization": frozenset({
        "allgather_bucket_size", "allgather_partitions", "allgather_sequential", "compute_grad_norm",
        "contiguous_gradients", "cpu_offload", "cpu_offload_param", "cpu_offload_use_pin_memory", "elastic_checkpoint",
        "enable_sanity_checks", "gather_16bit_weights_on_model_save", "ignore_unused_parameters", "leaf_module",
        "legacy_stage1", "load_from_fp32_weights", "log_trace_cache_warnings", "max_live_parameters",
        "max_reuse_distance", "memory_efficient_linear", "model_persistence_threshold", "module_granularity_threshold",
        "offload_optimizer", "offload_param", "overlap_comm", "override_module_apply", "param_persistence_threshold",
        "parameter_alignment", "pipeline_loading_checkpoint", "prefetch_bucket_size", "reduce_bucket_size",
        "reduce_scatter", "round_robin_gradients", "save_muon_momentum_buffer_in_memory", "stage",
        "stage3_allgather_sequential", "stage3_gather_16bit_weights_on_model_save",
        "stage3_gather_fp16_weights_on_model_save", "stage3_max_live_parameters", "stage3_max_reuse_distance",
        "stage3_model_persistence_threshold", "stage3_module_granularity_threshold",
        "stage3_param_persistence_threshold", "stage3_prefetch_bucket_size", "stage3_use_all_reduce_for_fetch_params",
        "sub_group_size", "use_all_reduce_for_fetch_params", "use_multi_rank_bucket_allreduce", "zenflow",
        "zero_hpz_partition_size", "zero_quantized_gradients", "zero_quantized_nontrainable_weights",
        "zero_quantized_weights"})}
# ZeRO++'s features and the stage-3 settings (under both of DeepSpeed's names), which only DeepSpeed's
# stage-3 optimizer reads -> DeepSpeed's default (tests/test_ds_config_tool.py holds them equal to DeepSpeed's)
_STAGE3_SETTINGS = {"prefetch_bucket_size": 50_000_000, "param_persistence_threshold": 100_000,
                    "model_persistence_threshold": sys.maxsize, "max_live_parameters": 1_000_000_000,
                    "max_reuse_distance": 1_000_000_000, "gather_16bit_weights_on_model_save": False,
                    "module_granularity_threshold": 0, "use_all_reduce_for_fetch_params": False,
                    "allgather_sequential": False}
_ZERO3_ONLY = {"zero_quantized_gradients": False, "zero_quantized_weights": False,
               "zero_quantized_nontrainable_weights": False, "zero_hpz_partition_size": 1,
               "stage3_gather_fp16_weights_on_model_save": False, **_STAGE3_SETTINGS,
               **{f"stage3_{key}": default for key, default in _STAGE3_SETTINGS.items()}}
# offload section -> its deprecated boolean spelling, and the lowest ZeRO stage at which DeepSpeed reads it
_OFFLOADS = {"offload_optimizer": ("cpu_offload", 1), "offload_param": ("cpu_offload_param", 3)}
# fp16's integer settings; the two that dynamic loss scaling divides by or floors at must be >= 1 there
_FP16_INTEGERS = ("initial_scale_power", "loss_scale_window", "hysteresis", "min_loss_scale")
_FP16_DYNAMIC_POSITIVE = ("loss_scale_window", "min_loss_scale")


def _check_precision_and_zero(ds_config: dict) -> None:
    """What DeepSpeed's own checks of fp16, bf16 and zero_optimization refuse in plain cases (unknown
    keys, ZeRO stage, both precisions, loss scaling), without importing DeepSpeed: `ds_config.py set`
    and `validate` refuse what the trainer's start-up would."""
    for section, known in DEEPSPEED_SECTION_KEYS.items():
        if section == "bfloat16" and "bf16" in ds_config:  # DeepSpeed reads the old name only without the new
            continue
        unknown = sorted(set(ds_config.get(section, {})) - known)
        if unknown:
            close = difflib.get_close_matches(unknown[0], sorted(known), n=1, cutoff=0.75)
            raise ConfigError(f"unknown key {section}.{unknown[0]} (DeepSpeed refuses it)",
                              f"{f'did you mean {close[0]!r}? ' if close else ''}fix the spelling or remove it "
                              "(https://www.deepspeed.ai/docs/config-json/)")
    zero = ds_config.get("zero_optimization", {})
    stage = typed("zero_optimization.stage", zero.get("stage", 0), int)
    if not 0 <= stage <= 3:
        raise ConfigError(f"zero_optimization.stage {stage} is not a ZeRO stage",
                          "set zero_optimization.stage to 0, 1, 2 or 3")
    for key, off in _ZERO3_ONLY.items():
        if zero.get(key, off) != off and stage < 3:
            raise ConfigError(f"zero_optimization.{key} works at ZeRO stage 3 only and does nothing at stage {stage}",
                              f"remove {key}, or set zero_optimization.stage to 3")
    _check_offload(zero, stage)
    bf16_section = _bf16_key(ds_config)
    fp16, bf16 = ds_config.get("fp16", {}), ds_config.get(bf16_section, {})
    if fp16.get("enabled") and bf16.get("enabled"):
        raise ConfigError(f"fp16.enabled and {bf16_section}.enabled are both true", "pick one: set the other to false")
    loss_scale = fp16.get("loss_scale", 0)
    if isinstance(loss_scale, bool) or not isinstance(loss_scale, (int, float)) or loss_scale < 0:
        raise ConfigError(f"fp16.loss_scale = {json.dumps(loss_scale)} is not a number >= 0",
                          "set fp16.loss_scale to 0 (dynamic loss scaling) or a fixed scale > 0, without quotes")
    for key in _FP16_INTEGERS:
        value = fp16.get(key, 1)
        value = typed(f"fp16.{key}", int(value) if isinstance(value, float) and value.is_integer() else value, int)
        if key in _FP16_DYNAMIC_POSITIVE and value < 1 and fp16.get("enabled") and loss_scale == 0:
            raise ConfigError(f"fp16.{key} = {value} must be >= 1 with dynamic loss scaling (fp16.loss_scale 0)",
                              f"set fp16.{key} to a positive integer")
    for section, key in (("fp16", "fp16_master_weights_and_grads"), (bf16_section, "bf16_master_weights_and_grads"),
                         (bf16_section, "bf16_optimizer_states")):
        if ds_config.get(section, {}).get(key) and stage == 0:
            raise ConfigError(f"{section}.{key} needs ZeRO (zero_optimization.stage is 0)",
                              "set zero_optimization.stage to 1, 2 or 3, or drop the key")
    if bf16.get("bf16_optimizer_states") and not bf16.get("bf16_master_weights_and_grads"):
        raise ConfigError(f"{bf16_section}.bf16_optimizer_states needs {bf16_section}.bf16_master_weights_and_grads",
                          f"set {bf16_section}.bf16_master_weights_and_grads to true, or drop bf16_optimizer_states")


def _offload_device(zero: dict, key: str) -> str:
    """Where zero_optimization's `key` (offload_optimizer / offload_param) sends its tensors: its device,
    or "cpu" for the deprecated boolean spelling (cpu_offload / cpu_offload_param), else "none"."""
    section = zero.get(key)
    if isinstance(section, dict):
        return section.get("device", "none")
    return "cpu" if zero.get(_OFFLOADS[key][0]) is True else "none"


def _check_offload(zero: dict, stage: int) -> None:
    """Offload that DeepSpeed 0.19.8 ignores at the stage: any offload at stage 0 (read only inside
    ZeRO), parameters below stage 3, and nvme below stage 3 (stage 1/2 offload the optimizer to cpu only)."""
    for key, (legacy, lowest) in _OFFLOADS.items():
        device = _offload_device(zero, key)
        if device == "none":
            continue
        named = f"zero_optimization.{key}" if isinstance(zero.get(key), dict) else f"zero_optimization.{legacy}"
        if stage < lowest:
            raise ConfigError(f"{named} works at ZeRO stage {lowest}{'-3' if lowest < 3 else ''} only and does "
                              f"nothing at stage {stage}", f"remove it, or set zero_optimization.stage to {lowest}"
                              f"{' or above' if lowest < 3 else ''}")
        if device == "nvme" and stage < 3:
            raise ConfigError(f'{named}.device "nvme" works at ZeRO stage 3 only (stage {stage} offloads to cpu '
                              "only and ignores it)", f'set {named}.device to "cpu", or zero_optimization.stage to 3')


_DEVICE_NAMES = {"cpu": "CPU", "nvme": "NVMe"}  # offload devices as people write them


def offload_description(ds_config: dict) -> str:
    """What ZeRO offloads, for the config line: " (optimizer offloaded to CPU)", "" for nothing."""
    zero = dict_section(ds_config, "zero_optimization")
    moved = [f"{what} offloaded to {_DEVICE_NAMES.get(_offload_device(zero, key), _offload_device(zero, key))}"
             for key, what in (("offload_optimizer", "optimizer"), ("offload_param", "parameters"))
             if _offload_device(zero, key) != "none"]
    return f" ({', '.join(moved)})" if moved else ""


# the optimizer types whose class under ZeRO optimizer offload is a DeepSpeed CPU op, built by JIT on first use
# (engine._configure_basic_optimizer): type -> (the op's name in the extensions folder, its class)
CPU_OPTIMIZER_OPS = {"adam": ("cpu_adam", "DeepSpeedCPUAdam"), "adamw": ("cpu_adam", "DeepSpeedCPUAdam"),
                     "lion": ("cpu_lion", "DeepSpeedCPULion"), "adagrad": ("cpu_adagrad", "DeepSpeedCPUAdagrad")}


def cpu_optimizer_op(ds_config: dict) -> tuple[str, str] | None:
    """(op, class) of the DeepSpeed CPU optimizer the JSON makes DeepSpeed build: an optimizer offloaded
    (cpu or nvme) whose type has one (CPU_OPTIMIZER_OPS), Adam/AdamW only with optimizer.params.torch_adam
    false (true, the trainer's default without CUDA, runs torch's AdamW); else None."""
    zero = dict_section(ds_config, "zero_optimization")
    optimizer = dict_section(ds_config, "optimizer")
    kind = str(optimizer.get("type") or "AdamW").lower()
    params = optimizer.get("params") if isinstance(optimizer.get("params"), dict) else {}
    if _offload_device(zero, "offload_optimizer") == "none" or kind not in CPU_OPTIMIZER_OPS:
        return None
    return None if kind in ("adam", "adamw") and params.get("torch_adam") else CPU_OPTIMIZER_OPS[kind]


# DeepSpeed's log levels at which its logger shows its INFO lines (its default shows warnings only)
_INFO_LOG_LEVELS = ("debug", "info")


def json_notes(ds_config: dict, log_interval: int | None = None) -> list[str]:
    """The start-up notes of JSON settings DeepSpeed reads that show or change nothing in this trainer's run,
    as a DeepSpeed user would not guess: steps_per_print (DeepSpeed's step line is an INFO log line, which its
    default log level hides; the trainer's own line, every --log-interval steps, is the progress report),
    comms_logger.verbose (its per-collective lines alike), the 16-bit model gathered at a save (GATHER_16BIT_KEYS:
    a setting of save_16bit_model(), never called here; common in ZeRO-3 templates), and
    activation_checkpointing.number_checkpoints (read for contiguous_memory_optimization only, refused here).
    `log_interval`: the run's --log-interval, named in the first (which it leaves out when they are equal)."""
    notes = []
    info = str(ds_config.get("log_level", "")).lower() in _INFO_LOG_LEVELS
    every = ds_config.get("steps_per_print")
    if every is not None and every != log_interval and not info:
        now = f" (now {log_interval})" if log_interval is not None else ""
        notes.append(f"note: steps_per_print {every} prints nothing: DeepSpeed logs its step line at \"log_level\": "
                     f"\"info\" only; the trainer's own line (step, lr, loss) comes every --log-interval steps{now}: "
                     f"pass --log-interval {every} for it every {every} steps")
    comms = dict_section(ds_config, "comms_logger")
    if comms.get("enabled") is True and comms.get("verbose") is True and not info:
        notes.append("note: comms_logger.verbose prints nothing: DeepSpeed logs each collective at \"log_level\": "
                     "\"info\" only; the comms_logger summary is printed at the end of the run")
    zero = dict_section(ds_config, "zero_optimization")
    gather = next((key for key in GATHER_16BIT_KEYS if zero.get(key)), None)
    if gather:
        notes.append(f"note: zero_optimization.{gather} writes nothing here: it sets how DeepSpeed's "
                     "save_16bit_model() gathers the weights, which the trainer never calls; export a checkpoint's "
                     f"weights with python {in_repository('tools/convert_checkpoint.py')} to-torch --load SAVE_DIR "
                     "--output OUT.pt (or to-hf)")
    mix = grad_accum_mix(ds_config)
    if mix is not None and mix.stage > 0 and not mix.used:  # at stage 0 refused
        notes.append(f"note: data_types.grad_accum_dtype {mix.accumulated} changes nothing with {mix.weights} weights "
                     f"at ZeRO stage {mix.stage}: DeepSpeed's ZeRO optimizers do not read it; {BF16_FP32_ACCUMULATION}")
    checkpointing = ds_config.get("activation_checkpointing")
    if isinstance(checkpointing, dict) and "number_checkpoints" in checkpointing:
        notes.append(f"note: activation_checkpointing.number_checkpoints {checkpointing['number_checkpoints']} "
                     "changes nothing: DeepSpeed reads it only for contiguous_memory_optimization, which this trainer "
                     "refuses; the layers per checkpointed chunk are --checkpoint-num-layers")
    return notes


# DeepSpeed's DtypeEnum spellings of the floating-point dtypes
_DTYPE_NAMES = {"fp32": ("fp32", "float32", "float", "torch.float32"),
                "fp16": ("fp16", "float16", "half", "torch.float16"), "bf16": ("bf16", "bfloat16", "torch.bfloat16")}
_DTYPE_NAME_OF = {name: kind for kind, names in _DTYPE_NAMES.items() for name in names}
_COMMUNICATION_DTYPES = ("fp32", "fp16", "bf16")  # what DeepSpeed's get_communication_data_type takes (any case)


def _check_dtypes(ds_config: dict) -> None:
    """The dtype keys DeepSpeed reads late: an unknown one is a traceback inside deepspeed.initialize
    (grad_accum_dtype), DeepSpeed's line names another key (seq_parallel_communication_data_type's
    "Invalid communication_data_type"), or torch drops it for fp32 with a warning (torch_autocast int8)."""
    grad_accum = ds_config.get("data_types", {}).get("grad_accum_dtype")
    if grad_accum is not None and not (isinstance(grad_accum, str) and grad_accum in _DTYPE_NAME_OF):
        raise ConfigError(f"data_types.grad_accum_dtype = {json.dumps(grad_accum)} is not a dtype DeepSpeed knows",
                          "set it to fp32, fp16 or bf16, or remove it (the model's dtype)")
    _check_grad_accum_mix(ds_config)
    for key in ("communication_data_type", "seq_parallel_communication_data_type"):
        value = ds_config.get(key)
        if value is not None and not (isinstance(value, str) and value.lower() in _COMMUNICATION_DTYPES):
            raise ConfigError(f"{key} = {json.dumps(value)} is not a communication dtype DeepSpeed knows",
                              f"set {key} to fp32, fp16 or bf16, or remove it")
    _check_autocast(ds_config.get("torch_autocast", {}))


class GradAccumMix(NamedTuple):
    weights: str  # the weights' dtype: fp32, fp16, bf16
    accumulated: str  # data_types.grad_accum_dtype, by the same names
    stage: int  # ZeRO's
    used: bool  # whether DeepSpeed reads it (its BF16 optimizer)


def grad_accum_mix(ds_config: dict) -> GradAccumMix | None:
    """(weights' dtype, grad_accum_dtype, ZeRO stage, whether DeepSpeed uses it) of a JSON whose
    data_types.grad_accum_dtype differs from the weights' (None: no such setting). DeepSpeed 0.19.8 reads it
    in engine._do_optimizer_sanity_check only: bf16 weights with fp32 accumulation at ZeRO 1 without optimizer
    offload is its BF16 optimizer; at ZeRO 0 any mix is its NotImplementedError ("unsupported mix"); ZeRO's
    own optimizers never read it."""
    grad_accum = dict_section(ds_config, "data_types").get("grad_accum_dtype")
    if not isinstance(grad_accum, str) or grad_accum not in _DTYPE_NAME_OF:
        return None
    accumulated, weights = _DTYPE_NAME_OF[grad_accum], precision(ds_config)
    if accumulated == weights:
        return None
    zero = dict_section(ds_config, "zero_optimization")
    stage = zero.get("stage", 0)
    used = (weights, accumulated, stage) == ("bf16", "fp32", 1) and _offload_device(zero, "offload_optimizer") == "none"
    return GradAccumMix(weights, accumulated, stage, used)


BF16_FP32_ACCUMULATION = ("DeepSpeed accumulates in another dtype than the weights' only for bf16 weights with fp32 "
                          "accumulation at ZeRO 1 (its BF16 optimizer: ds_configs/bf16_ring_sp2.json with "
                          '"data_types": {"grad_accum_dtype": "fp32"})')


def _check_grad_accum_mix(ds_config: dict) -> None:
    """grad_accum_mix's crashes, refused before deepspeed.initialize: any mix at ZeRO 0, and the BF16
    optimizer without the gradient norm it needs. An ignored mix at ZeRO 1-3 is a start-up note (json_notes)."""
    mix = grad_accum_mix(ds_config)
    if mix is None:
        return
    if mix.stage == 0:
        fix = ('set zero_optimization.stage to 1 (its BF16 optimizer)' if mix[:2] == ("bf16", "fp32")
               else f'remove data_types.grad_accum_dtype ({BF16_FP32_ACCUMULATION})')
        raise ConfigError(f"data_types.grad_accum_dtype {mix.accumulated} with {mix.weights} weights at "
                          "zero_optimization.stage 0 stops DeepSpeed 0.19.8 with \"unsupported mix\"", fix)
    if mix.used and dict_section(ds_config, "zero_optimization").get("compute_grad_norm") is False:
        raise ConfigError("zero_optimization.compute_grad_norm false cannot run bf16 weights with data_types."
                          "grad_accum_dtype fp32 at ZeRO 1 (DeepSpeed 0.19.8 refuses it inside deepspeed.initialize)",
                          "remove compute_grad_norm (true by default)")


def _check_autocast(autocast: dict) -> None:
    """torch_autocast with a dtype, bf16 or fp16 (torch falls back to fp32 for any other; where DeepSpeed runs
    fp16 wrong: check_fp16_autocast). Its lower_precision_safe_modules are imported inside deepspeed.initialize
    (a traceback per rank for a bad one; a string is read letter by letter): their shape is checked here, their
    import in deepspeed_accepts. DeepSpeed ignores any other key of the section (a typo)."""
    check_section_keys("torch_autocast", autocast, ("enabled", "dtype", "lower_precision_safe_modules"))
    if autocast.get("enabled") and autocast.get("dtype") is None:
        raise ConfigError("torch_autocast is enabled without a dtype (torch would pick its device's default, float16 "
                          "on a GPU)", 'set torch_autocast.dtype to "bfloat16"')
    if not autocast.get("enabled"):
        return
    dtype = autocast["dtype"]
    if dtype not in (*_DTYPE_NAMES["bf16"], *_DTYPE_NAMES["fp16"]):
        raise ConfigError(f"torch_autocast.dtype = {json.dumps(dtype)} is not an autocast dtype (torch would run fp32)",
                          'set torch_autocast.dtype to "bfloat16"')
    modules = autocast.get("lower_precision_safe_modules")
    if modules is None:
        return
    if not isinstance(modules, list):
        raise ConfigError(f"torch_autocast.lower_precision_safe_modules = {json.dumps(modules)} is not a list",
                          'write it as a list of "package.Class" names, e.g. ["torch.nn.Linear"]')
    for name in modules:
        if not (isinstance(name, str) and re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_]\w*)+", name)):
            raise ConfigError(f"torch_autocast.lower_precision_safe_modules entry {json.dumps(name)} is not a "
                              '"package.Class" name', 'name each module class with its package, e.g. "torch.nn.Linear"')


def check_fp16_autocast(ds_config: dict, pipeline: str | None, clipping: str) -> None:
    """fp16 torch_autocast where DeepSpeed 0.19.8 runs it wrong: its pipeline engine steps a GradScaler that
    never scaled a loss (an AssertionError on every rank at the first step), and its ZeRO 1-3 optimizers clip
    the loss-scaled gradients by their scaled norm before the GradScaler unscales them (updates damped some
    65536-fold, no word; ZeRO 0 unscales first). `ds_config`: the run's (--clip-grad in its gradient_clipping);
    `pipeline`: the stages as the user set them ('pipeline.stages 2'), None without a pipeline; `clipping`: the
    clipping as the user set it ('--clip-grad 1.0')."""
    autocast = dict_section(ds_config, "torch_autocast")
    dtype = autocast.get("dtype")
    if not (autocast.get("enabled") is True and dtype in _DTYPE_NAMES["fp16"]):
        return
    bf16 = 'torch_autocast.dtype "bfloat16"'
    if pipeline:
        raise ConfigError(f"torch_autocast.dtype {json.dumps(dtype)} with a pipeline ({pipeline}) stops DeepSpeed "
                          "0.19.8 at the first step (its pipeline engine steps a GradScaler that never scaled the "
                          "loss: \"Attempted step but _scale is None\")", f"use {bf16} with a pipeline, or run "
                          "without one")
    stage = dict_section(ds_config, "zero_optimization").get("stage", 0)
    if stage >= 1 and ds_config.get("gradient_clipping", 1.0):  # DeepSpeed's default clipping: 1.0
        raise ConfigError(f"torch_autocast.dtype {json.dumps(dtype)} at ZeRO stage {stage} with {clipping} would "
                          "train on damped updates (DeepSpeed 0.19.8 clips fp16 autocast's loss-scaled gradients "
                          "before unscaling them)", 'use "fp16": {"enabled": true} in place of torch_autocast (the '
                          f"trainer's loss-scaling path), or {bf16}")


def check_sequence_communication(ds_config: dict, sequence: int) -> None:
    """DeepSpeed 0.19.8 reduces gradients in seq_parallel_communication_data_type (default fp32) whenever
    its sequence-parallel group (the trainer's, without a pipeline) has more than one rank, overwriting
    communication_data_type without a word."""
    value = ds_config.get("communication_data_type")
    reduction = ds_config.get("seq_parallel_communication_data_type", "fp32")
    if value is None or reduction is not None and value.lower() == reduction.lower():
        return
    used = json.dumps(reduction) + ("" if "seq_parallel_communication_data_type" in ds_config else " (the default)")
    raise ConfigError(f"communication_data_type {json.dumps(value)} is not used at sequence-parallel size {sequence}: "
                      f"DeepSpeed reduces gradients in seq_parallel_communication_data_type {used} there",
                      f'set "seq_parallel_communication_data_type": {json.dumps(value)} in its place (the key that '
                      "sets the gradient reduction dtype with sequence parallelism), or remove communication_data_type")


def _check_autocast_modules(ds_config: dict) -> None:
    """Each torch_autocast.lower_precision_safe_modules entry names a torch.nn.Module class that imports
    (DeepSpeed imports them inside deepspeed.initialize; a name that is no module class matches nothing)."""
    import torch

    for name in ds_config.get("torch_autocast", {}).get("lower_precision_safe_modules") or ():
        package, class_name = name.rsplit(".", 1)
        try:
            found = getattr(importlib.import_module(package), class_name, None)
        except ImportError as error:
            found, reason = None, f"cannot be imported ({error})"
        else:
            reason = f"is not a class of {package}" if found is None else "is not a torch.nn.Module class"
        if not (isinstance(found, type) and issubclass(found, torch.nn.Module)):
            raise ConfigError(f"torch_autocast.lower_precision_safe_modules entry {json.dumps(name)} {reason}",
                              'name an importable module class with its package, e.g. "torch.nn.Linear", or remove it')


# ZeRO++'s quantized communication: each loads DeepSpeed's quantizer op (QuantizerBuilder)
QUANTIZED_ZERO_KEYS = ("zero_quantized_weights", "zero_quantized_nontrainable_weights", "zero_quantized_gradients")


def _check_quantizer_supported(ds_config: dict) -> None:
    """ZeRO++'s quantized weights and gradients load DeepSpeed's quantizer op, which its CPU accelerator
    does not have: a traceback per rank inside deepspeed.zero.Init (weights, whatever the precision or
    torch_autocast), or at the first gradient reduction over two or more ranks (gradients; at one rank
    they quantize nothing)."""
    zero = ds_config.get("zero_optimization", {})
    quantized = [key for key in QUANTIZED_ZERO_KEYS if zero.get(key)]
    if not quantized:
        return
    from deepspeed.accelerator import get_accelerator
    from deepspeed.ops.op_builder.cpu import NotImplementedBuilder

    accelerator = get_accelerator()
    builder = accelerator.create_op_builder("QuantizerBuilder")
    if builder is None or isinstance(builder, NotImplementedBuilder) or not builder.is_compatible(verbose=False):
        raise ConfigError(f"zero_optimization.{quantized[0]} needs DeepSpeed's quantizer op, which its "
                          f"{accelerator.device_name()} accelerator does not have (it would fail inside DeepSpeed)",
                          f"remove {quantized[0]} (ZeRO++'s quantized communication), or run on GPUs")


def _check_nvme_supported(ds_config: dict) -> None:
    """nvme offload loads DeepSpeed's async_io op (libaio), which fails inside deepspeed.initialize
    with a traceback per rank after the swap folder was made: say so before anything is built."""
    zero = ds_config.get("zero_optimization", {})
    nvme = [key for key in ("offload_optimizer", "offload_param") if _offload_device(zero, key) == "nvme"]
    if not nvme:
        return
    from deepspeed.git_version_info import installed_ops
    from deepspeed.ops.op_builder import AsyncIOBuilder

    if not (installed_ops.get("async_io") or AsyncIOBuilder().is_compatible()):
        raise ConfigError(f'zero_optimization.{nvme[0]}.device "nvme" needs DeepSpeed\'s async_io op, which cannot '
                          "be built here (libaio and its headers are missing)",
                          f'use zero_optimization.{nvme[0]}.device "cpu", or install libaio (e.g. libaio-dev)')


# DeepSpeed's top-level scalars that its config reads without checking the type (a string or a number
# where a boolean belongs is accepted, then misread, or a TypeError mid-run)
_TOP_LEVEL_SCALARS = {
    "steps_per_print": "an integer >= 1", "gradient_predivide_factor": "a number > 0",
    "prescale_gradients": "boolean", "wall_clock_breakdown": "boolean", "memory_breakdown": "boolean",
    "dataloader_drop_last": "boolean", "dump_state": "boolean", "disable_allgather": "boolean",
    "zero_allow_untested_optimizer": "boolean", "zero_force_ds_cpu_optimizer": "boolean"}


def _enables_anything(node) -> bool:
    """Whether a JSON section turns anything on: an "enabled": true at any depth."""
    return isinstance(node, dict) and any(value is True if key == "enabled" else _enables_anything(value)
                                          for key, value in node.items())


def _check_enabled_flags(node, path: str) -> None:
    for key, value in node.items():
        where = f"{path}{key}"
        if key == "enabled" and not isinstance(value, bool):
            raise ConfigError(f"{where} = {json.dumps(value)} is not a boolean (DeepSpeed would read any non-empty "
                              "value as true)", f"set {where} to true or false, without quotes")
        if isinstance(value, dict):
            _check_enabled_flags(value, f"{where}.")


def deepspeed_accepts(ds_config: dict) -> None:
    """Runs DeepSpeed's own config checks (its pydantic models for ZeRO, bf16, ...) now, so that a key
    it rejects is one line naming the key before any model is built, not a traceback inside
    deepspeed.initialize. The batch keys are left out: their arithmetic is checked above at the
    real world size, which DeepSpeed cannot know before the processes start."""
    _check_autocast_modules(ds_config)
    _check_nvme_supported(ds_config)
    _check_quantizer_supported(ds_config)
    trial = {key: value for key, value in ds_config.items() if key != "train_batch_size"}
    with naming_placeholders(ds_config):
        _deepspeed_config_accepts(trial, ds_config)


def _deepspeed_config_accepts(trial: dict, ds_config: dict) -> None:
    """DeepSpeedConfig(trial), its refusal one line naming the key of `ds_config` (deepspeed_accepts)."""
    import pydantic
    from deepspeed.runtime.config import DeepSpeedConfig, DeepSpeedConfigError

    try:
        DeepSpeedConfig(trial)
    except pydantic.ValidationError as error:
        first = error.errors()[0]
        key = _json_path(ds_config, tuple(str(part) for part in first["loc"])) or f"{error.title}." + ".".join(
            str(part) for part in first["loc"])
        raise ConfigError(f"DeepSpeed rejects {key}: {first['msg']}",
                          f"fix or remove {key} (https://www.deepspeed.ai/docs/config-json/)") from None
    except (AssertionError, ValueError, TypeError, KeyError, DeepSpeedConfigError) as error:
        text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ConfigError(f"DeepSpeed rejects the config: {text}",
                          "fix the setting it names (https://www.deepspeed.ai/docs/config-json/)") from None


def _json_path(tree: dict, loc: tuple, prefix: str = "") -> str | None:
    """The dotted path in `tree` that ends with the keys `loc` (a pydantic error location inside one
    of DeepSpeed's sub-configs, which does not say which JSON section it came from)."""
    node = tree
    for part in loc:
        if not isinstance(node, dict) or part not in node:
            break
        node = node[part]
    else:
        return prefix + ".".join(loc)
    for key, child in tree.items():
        if isinstance(child, dict):
            found = _json_path(child, loc, f"{prefix}{key}.")
            if found:
                return found
    return None


def typed(key: str, value, kind):
    """`value`, refused in one line naming `key` unless it is a `kind` (a JSON boolean is no integer)."""
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} = {json.dumps(value)} is not a boolean", f"set {key} to true or false")
    elif kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key} = {json.dumps(value)} is not an integer", f"set {key} to an integer")
    elif not isinstance(value, kind):
        raise ConfigError(f"{key} = {json.dumps(value)} is not a {kind.__name__}", f"set {key} to a {kind.__name__}")
    return value

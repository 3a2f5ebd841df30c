"""One resolved, validated configuration: model + parallel layout + attention + batch sizes.

Sources, highest precedence first:
  1. Megatron-style flags given on the command line (`--sequence-parallel-size 4`),
  2. the DeepSpeed JSON: this project's top-level `"sequence_parallel"` section and DeepSpeed's
     own keys (`train_batch_size`, `train_micro_batch_size_per_gpu`,
     `gradient_accumulation_steps`, `zero_optimization.stage`),
  3. defaults.
The JSON section DeepSpeed itself never reads (it ignores unknown top-level keys):

    "sequence_parallel": {
        "size": 4,                      # SP degree (ranks that split one sequence)
        "attention": "ring",            # dense | ring | ulysses | hybrid | linformer | bigbird
        "ulysses_size": 2,              # hybrid: all-to-all over groups of 2 adjacent ranks, ring across them
        "linformer": {"k": 256, "share_heads": false, "share_kv": false},
        "bigbird": {"block_size": 64, "num_window_blocks": 3, "num_random_blocks": 2},
        "pack_samples": false,          # several segments per sample (--pack-samples)
        "max_segment_length": 512,      # packed: the longest segment (default min(seq, positions); rope: seq)
        "model_preset": "modernbert-base"  # the model fields of a preset (--model-preset), below the flags
    }

The pipeline degree may live in the JSON too, in DeepSpeed's own (otherwise unused) key
`"pipeline": {"stages": 2}` ("auto", DeepSpeed's default, means 1 here), so that one file
describes the whole layout; --pipeline-model-parallel-size overrides it.

Every violated constraint is a ConfigError naming the key (or flag) and the fix. Nothing here
imports torch or DeepSpeed unless DeepSpeed's own checks are asked for (`resolve(...,
deepspeed_check=True)`, the trainer's default): tools/ds_config.py answers in a fraction of a second.
"""
import copy
import dataclasses
import difflib
import importlib.util
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from megatron.arguments import flag_setting
from megatron.errors import ConfigError
from megatron.hf_forms import export_note
from megatron.paths import in_repository, repository_twin
from megatron.model import attention
from megatron.model.args import ROPE_THETA_FLOOR, BertConfig, preset_fields

SECTION = "sequence_parallel"
# JSON sub-sections of SECTION -> BertConfig field prefix
_ATTENTION_OPTIONS = {"linformer": ("k", "share_heads", "share_kv"),
                      "bigbird": ("block_size", "num_window_blocks", "num_random_blocks")}


@dataclass
class TrainConfig:
    model: BertConfig
    pipeline_parallel_size: int = 1
    sequence_parallel_size: int = 1
    data_parallel_size: int = 1
    micro_batch_size: int = 1
    gradient_accumulation_steps: int = 1
    zero_stage: int = 0
    activation_checkpoint_interval: int = 0  # transformer layers per checkpointed chunk; 0 = off
    compile_mlp: bool = False  # torch.compile each layer's MLP sublayer (engine.compile_mlp_sublayers)
    pack_samples: bool = False  # several segments per sample, up to model.max_segment_length tokens each
    ds_config: dict = field(default_factory=dict)  # what deepspeed.initialize receives

    @property
    def global_batch_size(self) -> int:
        return self.micro_batch_size * self.gradient_accumulation_steps * self.data_parallel_size

    def to_dict(self) -> dict:
        """JSON-ready, for the log directory's config.json and for checkpoints."""
        return dataclasses.asdict(self)

    def summary(self) -> str:
        """One line: layout, attention, precision, ZeRO, batch, model size."""
        model = self.model
        attention = model.attention + (f" (Ulysses {model.ulysses_size} x ring "
                                       f"{self.sequence_parallel_size // model.ulysses_size})"
                                       if model.attention == "hybrid" and model.ulysses_size else "")
        return (f"pipeline {self.pipeline_parallel_size} x data {self.data_parallel_size} x sequence "
                f"{self.sequence_parallel_size}, {attention} attention, {precision_description(self.ds_config)}, ZeRO "
                f"{self.zero_stage}, global batch {self.global_batch_size} = micro {self.micro_batch_size} x grad-acc "
                f"{self.gradient_accumulation_steps} x data {self.data_parallel_size}"
                + (", packed samples" if self.pack_samples else "")
                + f", {model.num_layers} layers x hidden {model.hidden_size} x {model.num_attention_heads} heads, "
                f"seq {model.seq_length}, {model.layernorm_layout}-LN" + _layer_options(model))


def _layer_options(model: BertConfig) -> str:
    """The modern layer options in use, e.g. ', rope, local window 128 (global every 3rd), geglu, no biases'.
    A window that spans every sequence (packed: every segment) is named so: its local layers see every
    token, as in a fine-tune of ModernBERT (window 128) at --seq-length 64, the model's own function."""
    options = ["rope"] if model.position_embedding_type == "rope" else []
    if model.has_local_layers:
        reach, packed, sees_all = window_reach(model)
        spanned = "every segment of up to" if packed else "the whole sequence of"
        whole = f"; it spans {spanned} {reach} tokens: the local layers see every token" if sees_all else ""
        options.append(f"local window {model.local_attention_window} (global every {model.global_attention_every}"
                       f"{whole})")
    options += [model.mlp_type] if model.mlp_type != "gelu" else []
    options += ["no biases"] if not model.add_bias_linear else []
    options += [model.normalization] if model.normalization != "LayerNorm" else []
    return "".join(f", {option}" for option in options)


def window_reach(model: BertConfig) -> tuple[int, bool, bool]:
    """(reach, packed, sees_all) of a model's local window: the tokens a query may see (the sequence;
    `packed`: the longest segment), and whether the window spans them, its local layers seeing every token
    (global layers). The config line (_layer_options) and the wide-window note (wide_window_note) read it."""
    reach = model.max_segment_length or model.seq_length  # the farthest key a query may see, plus one
    return reach, bool(model.max_segment_length), model.local_attention_window // 2 >= reach - 1


def _bf16_key(ds_config: dict) -> str:
    """The JSON's bf16 section: "bf16", or its old name "bfloat16", which DeepSpeed reads when "bf16" is absent."""
    return "bf16" if "bf16" in ds_config else "bfloat16"


def check_checkpointing_section(section: dict, sequence: int) -> None:
    """The JSON's "activation_checkpointing" settings DeepSpeed 0.19.8 cannot run here: a traceback on
    every rank (cpu_checkpointing without partitioned activations, which mangles the layers' saved
    inputs; contiguous_memory_optimization at the first evaluation), or activations split twice."""
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


def read_ds_config(path, given: str = "to --deepspeed_config") -> dict:
    """Reads a DeepSpeed JSON file strictly (strict_json_loads: no duplicate keys, no NaN / Infinity);
    syntax errors name the line and column; the types and ranges are checked (check_deepspeed_types).
    `given`: how the caller's user passes the file, for the fixes (a tool's own flag or argument)."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"DeepSpeed config {path} is a directory", f"pass the JSON file itself {given}")
    if not path.is_file():
        twin = repository_twin(path)
        raise ConfigError(f"DeepSpeed config {path} does not exist", f"pass an existing JSON file {given}"
                          + (f" (this repository has {twin}: pass that path from this folder)" if twin else ""))
    try:
        config = strict_json_loads(path.read_text(encoding="utf-8"), path)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path}:{error.lineno}:{error.colno}: invalid JSON ({error.msg})",
                          "fix the JSON syntax at that position") from None
    except (UnicodeDecodeError, OSError) as error:
        raise ConfigError(f"DeepSpeed config {path} cannot be read as UTF-8 text "
                          f"({getattr(error, 'strerror', None) or error.__class__.__name__})",
                          f"pass a readable JSON file {given}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path} holds a JSON {type(config).__name__}, not an object", "wrap the settings in { }")
    check_deepspeed_types(config)
    return config


class _NotFinite:
    """Stands for a JSON number that is not finite while the document is parsed: `NaN`,
    `Infinity`, `-Infinity` (Python's json reads them, strict readers refuse them) or a literal
    too large for a float (`1e999` reads as inf)."""

    def __init__(self, text: str):
        self.text = text


def _finite_float(text: str):
    value = float(text)
    return value if math.isfinite(value) else _NotFinite(text)


def strict_json_loads(text: str, source, key: str = "") -> object:
    """json.loads that refuses what a strict JSON reader refuses and Python's accepts: a key given
    twice in one object (the second would win silently), and NaN / Infinity / numbers that overflow
    to infinity, named by their key path (`optimizer.params.lr = NaN`; `key`: the path of the whole
    text). `source` (a file) starts the error line. Syntax errors stay json.JSONDecodeError (the
    caller names line and column)."""
    value = json.loads(text, object_pairs_hook=_refuse_duplicates(source), parse_constant=_NotFinite,
                       parse_float=_finite_float)
    _refuse_not_finite(value, key, source)
    return value


def _refuse_not_finite(node, where: str, source) -> None:
    if isinstance(node, _NotFinite):
        key = where or "the document"
        raise ConfigError(f"{source}: {key} = {node.text} is not a finite number (strict JSON readers, DeepSpeed's "
                          "checks and this trainer refuse NaN and Infinity)", f"write a finite number for {key}")
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        _refuse_not_finite(child, f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}" if where else key,
                           source)


def _refuse_duplicates(path):
    """json object_pairs_hook: a key given twice in one object (json keeps the last, silently)."""
    def build(pairs):
        seen = {}
        for key, value in pairs:
            if key in seen:
                raise ConfigError(f"{path}: key {key!r} appears twice in one object (the second would win "
                                  "silently)", f"keep one {key!r}")
            seen[key] = value
        return seen
    return build


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
    "memory_breakdown", "min_loss_scale", "monitor_config", "nebula", "optimizer", "parallel_write", "param_dtype",
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
                         "sparse_attention", "monitor_config", "zero_optimization", "train_batch_size",
                         "fp16", "bf16", "amp", "checkpoint", "pipeline", "elasticity", "compression_training"}


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
# traced_optimizer_params finds the same (tests/test_ds_config_tool.py holds the two equal). Anything else is a TypeError inside
# deepspeed.initialize, or (Muon) silently ignored.
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
    efficiency, which works on a loader the trainer does not use (here, so that tools/ds_config.py
    and azureml/submit.py refuse them too)."""
    unknown = sorted(set(ds_config) - deepspeed_top_level_keys())
    if unknown:
        close = difflib.get_close_matches(unknown[0], sorted(deepspeed_top_level_keys()), n=1, cutoff=0.75)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(f"unknown top-level key {unknown[0]!r} (DeepSpeed would ignore it)",
                          f"{hint}fix the spelling or remove it (https://www.deepspeed.ai/docs/config-json/)")
    if "scheduler" in ds_config:
        raise ConfigError('the DeepSpeed JSON\'s "scheduler" section is not used (the trainer runs Megatron\'s '
                          'warm-up + decay schedule)', 'remove "scheduler" and set --lr, --min-lr, --lr-decay-style '
                          "and --lr-warmup-fraction")
    checkpointing = ds_config.get("checkpoint") if isinstance(ds_config.get("checkpoint"), dict) else {}
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
    if ds_config.get("weight_quantization"):
        raise ConfigError('the DeepSpeed JSON\'s "weight_quantization" section is ZeRO-Inference\'s weight '
                          "quantization, not training's (post_init_quant is never read; quantized_initialization "
                          "fails inside DeepSpeed at the first ZeRO-3 step)", 'remove "weight_quantization"')
    _check_enabled_flags(ds_config, "")
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
    for key in ("zero_optimization", "activation_checkpointing", "pipeline", "optimizer", "fp16", "bf16", "bfloat16",
                "torch_autocast", "data_types", SECTION):
        if key in ds_config and not isinstance(ds_config[key], dict):
            raise ConfigError(f"{key} = {json.dumps(ds_config[key])} is not a JSON object",
                              f'write "{key}": {{...}} or remove it')
    check_optimizer(ds_config)
    for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
        if ds_config.get(key) is not None:  # null: derived from the other two
            _typed(key, ds_config[key], int)
    _check_precision_and_zero(ds_config)
    _check_dtypes(ds_config)
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
    stage = _typed("zero_optimization.stage", zero.get("stage", 0), int)
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
        value = _typed(f"fp16.{key}", int(value) if isinstance(value, float) and value.is_integer() else value, int)
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


# DeepSpeed's DtypeEnum spellings of the floating-point dtypes
_DTYPE_NAMES = {"fp32": ("fp32", "float32", "float", "torch.float32"),
                "fp16": ("fp16", "float16", "half", "torch.float16"), "bf16": ("bf16", "bfloat16", "torch.bfloat16")}
_COMMUNICATION_DTYPES = ("fp32", "fp16", "bf16")  # what DeepSpeed's get_communication_data_type takes (any case)


def _check_dtypes(ds_config: dict) -> None:
    """The dtype keys DeepSpeed reads late: an unknown one is a traceback inside deepspeed.initialize
    (grad_accum_dtype), DeepSpeed's line names another key (seq_parallel_communication_data_type's
    "Invalid communication_data_type"), or torch drops it for fp32 with a warning (torch_autocast int8)."""
    grad_accum = ds_config.get("data_types", {}).get("grad_accum_dtype")
    if grad_accum is not None and not any(grad_accum in names for names in _DTYPE_NAMES.values()):
        raise ConfigError(f"data_types.grad_accum_dtype = {json.dumps(grad_accum)} is not a dtype DeepSpeed knows",
                          "set it to fp32, fp16 or bf16, or remove it (the model's dtype)")
    for key in ("communication_data_type", "seq_parallel_communication_data_type"):
        value = ds_config.get(key)
        if value is not None and not (isinstance(value, str) and value.lower() in _COMMUNICATION_DTYPES):
            raise ConfigError(f"{key} = {json.dumps(value)} is not a communication dtype DeepSpeed knows",
                              f"set {key} to fp32, fp16 or bf16, or remove it")
    _check_autocast(ds_config.get("torch_autocast", {}), ds_config)


def _check_autocast(autocast: dict, ds_config: dict) -> None:
    """torch_autocast in bf16, or fp16 where DeepSpeed 0.19.8 gets it right: its ZeRO 1/2 clip fp16
    autocast's loss-scaled gradients by their scaled norm and its GradScaler then unscales them (updates
    damped some 65536-fold, no word); torch falls back to fp32 for any other dtype. Its
    lower_precision_safe_modules are imported inside deepspeed.initialize (a traceback per rank for a
    bad one; a string is read letter by letter): their shape is checked here, their import in
    deepspeed_accepts."""
    if autocast.get("enabled") and autocast.get("dtype") is None:
        raise ConfigError("torch_autocast is enabled without a dtype (torch would pick its device's default, float16 "
                          "on a GPU)", 'set torch_autocast.dtype to "bfloat16"')
    if not autocast.get("enabled"):
        return
    dtype = autocast["dtype"]
    stage = ds_config.get("zero_optimization", {}).get("stage", 0)
    clipping = ds_config.get("gradient_clipping", 1.0)  # DeepSpeed's default
    if dtype in _DTYPE_NAMES["fp16"] and stage in (1, 2) and clipping:
        raise ConfigError(f"torch_autocast.dtype {json.dumps(dtype)} at ZeRO stage {stage} with gradient_clipping "
                          f"{clipping} would train on damped updates (DeepSpeed 0.19.8 clips fp16 autocast's "
                          "loss-scaled gradients before unscaling them)",
                          'use "fp16": {"enabled": true} in place of torch_autocast (the trainer\'s loss-scaling '
                          'path), or torch_autocast.dtype "bfloat16"')
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


def _check_sequence_communication(ds_config: dict, sequence: int) -> None:
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
    import pydantic
    from deepspeed.runtime.config import DeepSpeedConfig, DeepSpeedConfigError

    _check_autocast_modules(ds_config)
    _check_nvme_supported(ds_config)
    _check_quantizer_supported(ds_config)
    trial = {key: value for key, value in ds_config.items() if key != "train_batch_size"}
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


def _typed(key: str, value, kind):
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} = {value!r} is not a boolean", f"set {key} to true or false")
    elif kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key} = {value!r} is not an integer", f"set {key} to an integer")
    elif not isinstance(value, kind):
        raise ConfigError(f"{key} = {value!r} is not a {kind.__name__}", f"set {key} to a {kind.__name__}")
    return value


def section_values(ds_config: dict) -> dict:
    """The project's JSON section as BertConfig / TrainConfig field values (type-checked)."""
    section = ds_config.get(SECTION, {})
    if not isinstance(section, dict):
        raise ConfigError(f"{SECTION} must be a JSON object", f'write "{SECTION}": {{"size": ..., "attention": ...}}')
    known = {"size", "attention", "ulysses_size", "pack_samples", "max_segment_length", "model_preset",
             *_ATTENTION_OPTIONS}
    for key in section:
        if key not in known:
            raise ConfigError(f"unknown key {SECTION}.{key}", f"use one of: {', '.join(sorted(known))}")
    values = {}
    if "size" in section:
        values["sequence_parallel_size"] = _typed(f"{SECTION}.size", section["size"], int)
    if "attention" in section:
        values["attention"] = _typed(f"{SECTION}.attention", section["attention"], str)
    if section.get("ulysses_size") is not None:
        values["ulysses_size"] = _typed(f"{SECTION}.ulysses_size", section["ulysses_size"], int)
    if "pack_samples" in section:
        values["pack_samples"] = _typed(f"{SECTION}.pack_samples", section["pack_samples"], bool)
    if section.get("max_segment_length") is not None:
        values["max_segment_length"] = _typed(f"{SECTION}.max_segment_length", section["max_segment_length"], int)
    if section.get("model_preset") is not None:
        values["model_preset"] = _typed(f"{SECTION}.model_preset", section["model_preset"], str)
    for variant, options in _ATTENTION_OPTIONS.items():
        sub = section.get(variant, {})
        for key, value in sub.items():
            if key not in options:
                raise ConfigError(f"unknown key {SECTION}.{variant}.{key}", f"use one of: {', '.join(options)}")
            name = f"{variant}_{key}"
            kind = type(getattr(BertConfig, name))  # the default's type: int or bool
            values[name] = _typed(f"{SECTION}.{variant}.{key}", value, kind)
    return values


def resolve(flags: dict, ds_config: dict, world_size: int, deepspeed_check: bool = True) -> TrainConfig:
    """Merges flags (None = not given) over the JSON over defaults, then validates.

    `flags` keys are TrainConfig / BertConfig field names; `micro_batch_size`, `global_batch_size`
    and `gradient_clipping` (--clip-grad) mirror DeepSpeed's keys and override them. `deepspeed_check`:
    also run DeepSpeed's own checks of its sections (imports DeepSpeed: seconds).
    """
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ConfigError(f"world size {world_size} must be >= 1", "launch at least one process (--world-size N)")
    check_deepspeed_types(ds_config)
    given = {key: value for key, value in flags.items() if value is not None}
    section = section_values(ds_config)
    values = {**section, **given}
    _check_model_numbers(values)
    values = {**resized_preset(model_preset(flags, ds_config), values), **values}  # each below its own flag
    values.pop("model_preset", None)
    values.update(rope_positions(values, given.keys() | section.keys()))
    # --checkpoint-activations, else DeepSpeed's own "activation_checkpointing" section turns it on
    checkpoint_interval = (values.pop("activation_checkpoint_interval", 0)
                           or int("activation_checkpointing" in ds_config))
    compile_mlp = values.pop("compile_mlp", False)
    pack_samples = _packing(values)
    pipeline, sequence, data = _layout(values, ds_config, world_size, given)

    micro, gas, global_batch = _batch_sizes(values, ds_config, data)
    zero_stage = _typed("zero_optimization.stage", ds_config.get("zero_optimization", {}).get("stage", 0), int)
    if pipeline > 1 and zero_stage > 1:
        raise ConfigError(f"zero_optimization.stage {zero_stage} cannot be combined with pipeline parallelism "
                          f"(pipeline size {pipeline})", "use zero_optimization.stage 0 or 1 with a pipeline")

    check_checkpointing_section(ds_config.get("activation_checkpointing", {}), sequence)
    clipping_flag = values.pop("gradient_clipping", None)  # --clip-grad, over the JSON's
    if clipping_flag is not None:
        ds_config = {**ds_config, "gradient_clipping": clipping_flag}
    _check_pipeline_clipping(ds_config, clipping_flag, pipeline, zero_stage)

    _ulysses_size(values, sequence)
    model_fields = {f.name for f in dataclasses.fields(BertConfig)}
    unknown = set(values) - model_fields
    if unknown:
        raise ConfigError(f"unknown setting(s) {sorted(unknown)}", "remove them or check the spelling")
    where = ""  # the model's own checks; then the attention's, named by the JSON section where it set them
    try:
        model = BertConfig(**values)
        where = f"{SECTION}: " if section.keys() - _NOT_ATTENTION_KEYS else ""
        attention.check(model, sequence)
    except ConfigError as error:
        fix = _section_fix(_preset_fix(error.fix, given, section, flags, ds_config), given, section)
        raise ConfigError(where + _preset_problem(error.problem, values, given, section, flags, ds_config),
                          fix) from None
    _refuse_unused_options(given, section, model)
    _refuse_stages_without_layers(pipeline, model.num_layers, "pipeline_parallel_size" in given)

    resolved = {**ds_config, "train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": gas,
                "train_batch_size": global_batch}
    if pipeline > 1:  # sequence-split activations must travel whole between stages
        resolved["pipeline"] = {**ds_config.get("pipeline", {}), "stages": pipeline, "pipe_partitioned": False,
                                "grad_partitioned": False}
    if deepspeed_check:
        deepspeed_accepts(resolved)
    return TrainConfig(model=model, pipeline_parallel_size=pipeline, sequence_parallel_size=sequence,
                       data_parallel_size=data, micro_batch_size=micro, gradient_accumulation_steps=gas,
                       zero_stage=zero_stage, activation_checkpoint_interval=checkpoint_interval,
                       compile_mlp=compile_mlp, pack_samples=pack_samples, ds_config=resolved)


def _layout(values: dict, ds_config: dict, world_size: int, given: dict) -> tuple[int, int, int]:
    """The (pipeline, sequence, data) parallel sizes: the first two popped from `values` (a flag, else
    the JSON's), each named as the user set it when it is not positive; data parallelism takes the
    rest of the world, which the other two must divide."""
    pipeline = values.pop("pipeline_parallel_size", None) or json_pipeline_stages(ds_config)
    sequence = values.pop("sequence_parallel_size", 1)
    sequence_key = "--sequence-parallel-size" if "sequence_parallel_size" in given else f"{SECTION}.size"
    for key, value in (("--pipeline-model-parallel-size (pipeline.stages)", pipeline), (sequence_key, sequence)):
        if value < 1:
            raise ConfigError(f"{key} = {value} must be >= 1", f"set {key} to a positive integer")
    if world_size % (pipeline * sequence):
        raise ConfigError(
            f"{SECTION}.size {sequence} x pipeline {pipeline} does not divide the world size {world_size}",
            "launch a multiple of sp*pp processes or change the sizes")
    if pipeline == 1 and sequence > 1:
        _check_sequence_communication(ds_config, sequence)
    return pipeline, sequence, world_size // (pipeline * sequence)


def _check_pipeline_clipping(ds_config: dict, clipping_flag, pipeline: int, zero_stage: int) -> None:
    """Refuses gradient clipping with a pipeline at ZeRO stage 0: DeepSpeed 0.19.8 runtime/utils.py
    clip_grad_norm_ counts only the parameters of the rank whose pipeline-grid model-parallel rank is
    0 (the first stage), a wrong norm. The line names the setting as the user gave it: --clip-grad
    (`clipping_flag`, already in `ds_config`), the JSON's gradient_clipping, or DeepSpeed's default 1.0."""
    clipping = ds_config.get("gradient_clipping", 1.0)  # DeepSpeed's default is 1.0
    if not (pipeline > 1 and zero_stage == 0 and clipping > 0):
        return
    if clipping_flag is not None:
        setting, off = f"--clip-grad {clipping}", "--clip-grad 0"
    else:
        default = "" if "gradient_clipping" in ds_config else " (the default: the JSON sets none)"
        setting = f"gradient_clipping {clipping}{default}"
        off = '"gradient_clipping": 0 in the JSON, or --clip-grad 0'
    raise ConfigError(f"{setting} with a pipeline at zero_optimization.stage 0 would clip by the first stage's "
                      "gradient norm only", f"use zero_optimization.stage 1, or turn clipping off ({off})")


# the JSON section's values (section_values) that attention.check does not read
_NOT_ATTENTION_KEYS = {"pack_samples", "max_segment_length", "model_preset"}
# a preset's setting that a fix tells to drop (as if it were a flag) -> the flag that undoes it
_PRESET_UNDO = {"local_attention_window": ("--local-attention-window", "--global-attention-every 1 to make every "
                                                                    "layer global"),
                "first_layer_attention_norm": ("--no-first-layer-attention-norm", "--first-layer-attention-norm")}


def _preset_fix(fix: str, given: dict, section: dict, flags: dict, ds_config: dict) -> str:
    """`fix` where it tells to drop a flag that the user did not give but the preset set, which cannot
    be dropped: the flag that undoes it instead ('pass --first-layer-attention-norm (--model-preset
    modernbert-base sets --no-first-layer-attention-norm)')."""
    for name in model_preset(flags, ds_config).keys() & _PRESET_UNDO.keys() - given.keys() - section.keys():
        flag, undo = _PRESET_UNDO[name]
        fix = re.sub(f"drop {flag}(?![-\\w])", f"pass {undo} ({preset_source(flags, ds_config)} sets {flag})", fix)
    return fix


def _preset_problem(problem: str, values: dict, given: dict, section: dict, flags: dict, ds_config: dict) -> str:
    """`problem` with each 'field value' that the preset set (no flag, no JSON key) named with its preset:
    'num_attention_heads 16 (from --model-preset modernbert-large)', which the user never typed."""
    for name in (model_preset(flags, ds_config).keys() & values.keys()) - given.keys() - section.keys():
        said = f"{name} {values[name]}"
        named = f"{said} (from {preset_source(flags, ds_config)})"
        problem = re.sub(f"\\b{re.escape(said)}(?![\\w.])", lambda _: named, problem, count=1)
    return problem


def _section_fix(fix: str, given: dict, section: dict) -> str:
    """`fix` naming the JSON key rather than the flag of a variant option the JSON section set and
    no flag did ('choose sequence_parallel.linformer.k at most --seq-length')."""
    for options in _VARIANT_OPTIONS.values():
        for name, (flag, json_key) in options.items():
            if name in section and name not in given:
                fix = re.sub(f"{flag}(?![-\\w])", json_key, fix)
    return fix


# options that belong to one attention variant: BertConfig field -> (flag, JSON key)
_VARIANT_OPTIONS = {
    "linformer": {"linformer_k": ("--linformer-k", f"{SECTION}.linformer.k"),
                  "linformer_share_heads": ("--linformer-share-heads", f"{SECTION}.linformer.share_heads"),
                  "linformer_share_kv": ("--linformer-share-kv", f"{SECTION}.linformer.share_kv")},
    "bigbird": {"bigbird_block_size": ("--block-size", f"{SECTION}.bigbird.block_size"),
                "bigbird_num_window_blocks": ("--bigbird-num-window-blocks", f"{SECTION}.bigbird.num_window_blocks"),
                "bigbird_num_random_blocks": ("--bigbird-num-random-blocks", f"{SECTION}.bigbird.num_random_blocks")}}
# model fields that must be finite and above a bound whatever else is set (BertConfig checks the rest)
# (flag, the bound a value must exceed): a rope theta as BertConfig states it (ROPE_THETA_FLOOR)
_BOUNDED_MODEL_NUMBERS = {"init_method_std": ("--init-method-std", 0), "layernorm_epsilon": ("--layernorm-epsilon", 0),
                          "rotary_base": ("--rotary-base", ROPE_THETA_FLOOR),
                          "local_rotary_base": ("--local-rotary-base", ROPE_THETA_FLOOR)}


def _check_model_numbers(values: dict) -> None:
    """Model numbers BertConfig takes as they come: a negative or zero init std or LayerNorm epsilon
    (or NaN, inf) reaches torch's init or the first forward pass, after the data's index maps are built."""
    for key, (flag, floor) in _BOUNDED_MODEL_NUMBERS.items():
        value = values.get(key)
        if value is not None and not (isinstance(value, (int, float)) and not isinstance(value, bool)
                                      and math.isfinite(value) and value > floor):
            raise ConfigError(f"{key} = {value} is not a finite number > {floor}",
                              f"pass {flag} above {floor}, e.g. {getattr(BertConfig, key)}")


def _refuse_unused_options(flags: dict, section: dict, model: BertConfig) -> None:
    """Options given (by flag or in the JSON section) that the resolved run would not read: a variant's
    options with another attention variant (as ulysses_size is refused), rope bases with learned
    positions, local-layer options when no layer is local. Preset values are not "given": only what
    the user set is refused."""
    def name(key: str, flag: str, json_key: str | None = None) -> str:
        return flag if key in flags or json_key is None else json_key

    for variant, options in _VARIANT_OPTIONS.items():
        for key, (flag, json_key) in options.items():
            if (key in flags or key in section) and model.attention != variant:
                option = name(key, flag, json_key)
                raise ConfigError(f"{option} is set but attention is '{model.attention}' ({variant} options are "
                                  "read by that variant only)", f"set attention '{variant}' or drop {option}")
    rope = model.position_embedding_type == "rope"
    for key in ("rotary_base", "local_rotary_base"):
        if key in flags and not rope:
            flag = "--" + key.replace("_", "-")
            raise ConfigError(f"{flag} {flags[key]} is set but positions are learned (a table, no rotary angles)",
                              f"add --position-embedding-type rope or drop {flag}")
    if "global_attention_every" in flags and model.local_attention_window is None:
        raise ConfigError(f"--global-attention-every {flags['global_attention_every']} is set without "
                          "--local-attention-window: every layer is global", "add --local-attention-window W or drop "
                          "--global-attention-every")
    for key in ("local_attention_window", "local_rotary_base"):
        if key in flags and not model.has_local_layers:
            flag = "--" + key.replace("_", "-")
            raise ConfigError(f"{flag} {flags[key]} is set but no layer is local (layer i is local when "
                              f"i % --global-attention-every != 0; it is {model.global_attention_every}, with "
                              f"{model.num_layers} layers)", f"add --global-attention-every N (N > 1, with "
                              f"--local-attention-window W) or drop {flag}")


def _refuse_stages_without_layers(stages: int, layers: int, by_flag: bool) -> None:
    """More pipeline stages than transformer layers: DeepSpeed's partition (by transformer layer) leaves
    a stage holding only the embeddings or the heads, a rank that mostly waits (Megatron refuses it too)."""
    if stages > layers:
        key = "--pipeline-model-parallel-size" if by_flag else "pipeline.stages"
        raise ConfigError(f"{key} {stages} is more pipeline stages than the {layers} transformer layers: a stage "
                          "would hold no transformer layer", f"pass at most {layers} stages, or --num-layers {stages} "
                          "or more")


def wide_window_note(model: BertConfig, window_given: bool) -> str | None:
    """The line of a --local-attention-window (`window_given`) as long as what a query may see (window_reach):
    the local layers are (nearly) global ones that pay a halo exchange, more often a window given as the
    tokens of one side (it counts both) than meant. A preset's or the starting weights' window is the model's
    own (ModernBERT's 128 fine-tuned at 128 tokens): no note. Local layers that see every token the config
    line says, not this line too."""
    if not (window_given and model.has_local_layers):
        return None
    window, half = model.local_attention_window, model.local_attention_window // 2
    reach, packed, sees_all = window_reach(model)
    if window < reach:
        return None
    span = "segment (--max-segment-length)" if packed else "sequence (--seq-length)"
    sees = "" if sees_all else f": the local layers see all but the tokens more than {half} apart"
    return (f"note: --local-attention-window {window} ({half} tokens each side) is not below the {reach}-token "
            f"{span}{sees}; the window counts both sides")


def model_notes(model: BertConfig, window_given: bool) -> list:
    """The start-up notes of a model that trains but is likely not what was meant: one that to-hf would
    refuse, local layers that are not local (`window_given`: by --local-attention-window). The trainer prints
    them, tools/ds_config.py show/validate too."""
    return [note for note in (export_note(model), wide_window_note(model, window_given)) if note]


def rope_positions(values: dict, given: set) -> dict:
    """{max_position_embeddings: seq_length} for a rotary model whose length no flag, JSON key or starting
    weights set: with no table, the field only declares the length the model was trained at (the
    Hugging Face export's max_position_embeddings, which extend_context.py scales the theta from), so
    a preset's 8192 or BertConfig's 512 would claim positions the run never trained. Weights from a
    folder (--init-from-hf ModernBERT at 8192) bring theirs, which a shorter fine-tune keeps."""
    if values.get("position_embedding_type") != "rope" or "max_position_embeddings" in given:
        return {}
    return {"max_position_embeddings": values.get("seq_length", BertConfig.seq_length)}


def model_preset(flags: dict, ds_config: dict) -> dict:
    """The BertConfig fields of the preset named by --model-preset, else by the JSON's
    sequence_parallel.model_preset ({} when neither names one); two different names are refused."""
    name, named = flags.get("model_preset"), section_values(ds_config).get("model_preset")
    if name is not None and named is not None and name != named:
        raise ConfigError(f"--model-preset {name} contradicts {SECTION}.model_preset {named} of the DeepSpeed JSON",
                          "drop one of them (or name the same preset in both)")
    if name is None:
        name = named
    try:
        return preset_fields(name)
    except ConfigError as error:
        source = "--model-preset" if flags.get("model_preset") is not None else f"{SECTION}.model_preset"
        raise ConfigError(f"{source}: {error.problem}", error.fix) from None


def resized_preset(preset: dict, values: dict) -> dict:
    """The preset's fields with its FFN width kept in ratio to a hidden size that `values` sets (1152 / 768
    for modernbert-base: 96 at --hidden-size 64), unless `values` sets the FFN width too."""
    if "hidden_size" in values and "ffn_hidden_size" not in values and "ffn_hidden_size" in preset:
        return {**preset, "ffn_hidden_size": round(preset["ffn_hidden_size"] * values["hidden_size"]
                                                   / preset["hidden_size"])}
    return preset


def preset_source(flags: dict, ds_config: dict) -> str | None:
    """Where the preset comes from, for errors about a field it set: '--model-preset modernbert-base'
    or 'sequence_parallel.model_preset modernbert-base' (None: no preset)."""
    if flags.get("model_preset") is not None:
        return f"--model-preset {flags['model_preset']}"
    name = section_values(ds_config).get("model_preset")
    return None if name is None else f"{SECTION}.model_preset {name}"


# fields of the weights a run starts from (--init-from-hf, a weights-only --load) that the run may set
# otherwise: the position table's length (extended by repetition), the rope thetas and the window (a
# longer context), the sentence-order head (initialised) and the vocab padding. The others (sizes,
# layout, layer types, the global-layer period) are the weights' own.
ADJUSTABLE_START_FIELDS = ("max_position_embeddings", "rotary_base", "local_rotary_base", "local_attention_window",
                           "add_binary_head", "make_vocab_size_divisible_by")


def adjustable_start_fields(start: dict, from_hf: bool, resume: bool = False) -> tuple:
    """ADJUSTABLE_START_FIELDS for an HF folder, whose weights are converted (table extended, vocab
    padded again, head initialised); a weights-only checkpoint's are loaded as they are, so only the
    fields that shape no weight: the rope thetas, the window, and the length where rope leaves no table,
    and the vocab padding, whose rows no token reaches (padded again: hf_convert.repadded_vocab, as from
    an HF folder). A resume keeps the thetas, the window and the padding too (checkpoint.MODEL_FIELDS):
    only that length."""
    if from_hf:
        return ADJUSTABLE_START_FIELDS
    table_free = ("max_position_embeddings",) * (start.get("position_embedding_type") == "rope")
    return table_free if resume else (*WEIGHTLESS_FIELDS, *table_free, "make_vocab_size_divisible_by")


WEIGHTLESS_FIELDS = ("rotary_base", "local_rotary_base", "local_attention_window")  # of the model, shaping no weight


def refuse_contradictions(start: dict, source: str, flags: dict, ds_config: dict, adjustable: tuple) -> None:
    """A model flag, or a preset's field, that contradicts the weights a run starts from (`start`: their
    BertConfig fields; `source`: e.g. 'the --init-from-hf folder DIR'; `adjustable`: the fields the run may
    set otherwise), naming the field and both values: the weights' fields would otherwise win over a preset
    silently, or a flag's value would meet the weights only as a shape error, or as an option refused for
    a reason the user never gave."""
    preset = resized_preset(model_preset(flags, ds_config), {k: v for k, v in flags.items() if v is not None})
    named = preset_source(flags, ds_config)
    for name, have in start.items():
        value = flags.get(name)
        if name in adjustable or (value if value is not None else preset.get(name, have)) == have:
            continue
        setter = drop = flag_setting(name, value) if value is not None else named
        setter += "" if value is not None else f" ({name} {preset[name]})"
        why = (f"a resume keeps the checkpoint's model; to train on with another {name}, start a new run from its "
               f"weights with --finetune, or {in_repository('tools/extend_context.py')} for a longer context"
               if name in WEIGHTLESS_FIELDS
               else f"the weights fix {name}")  # WEIGHTLESS_FIELDS are adjustable but on a resume
        raise ConfigError(f"{setter} contradicts {source}, whose model has {name} {have}", f"drop {drop}: {why}")


def json_pipeline_stages(ds_config: dict) -> int:
    """DeepSpeed's `pipeline.stages` (an int, or its default "auto": no pipeline here)."""
    stages = ds_config.get("pipeline", {}).get("stages", "auto")
    if stages == "auto":
        return 1
    if isinstance(stages, bool) or not isinstance(stages, int):
        raise ConfigError(f"pipeline.stages = {json.dumps(stages)} is not an integer",
                          'set pipeline.stages to the number of pipeline stages (or "auto": none)')
    return stages


def _ulysses_size(values: dict, sequence: int) -> None:
    """ulysses_size belongs to hybrid attention only; hybrid without it gets its default (hybrid.py)."""
    ulysses, variant = values.get("ulysses_size"), values.get("attention", BertConfig.attention)
    if variant != "hybrid":
        if ulysses is not None:
            raise ConfigError(f"{SECTION}.ulysses_size {ulysses} is set but attention is '{variant}'",
                              "set attention 'hybrid' or drop ulysses_size (--ulysses-size)")
        return
    if ulysses is not None and ulysses < 1:
        raise ConfigError(f"{SECTION}.ulysses_size {ulysses} must be >= 1", "set ulysses_size to a divisor of size")
    if ulysses is None:
        from megatron.model.attention import ulysses_degree

        values["ulysses_size"] = ulysses_degree(None, values.get("num_attention_heads", BertConfig.num_attention_heads),
                                                sequence)


def _packing(values: dict) -> bool:
    """Pops pack_samples; when packing, sets max_segment_length (default: the sequence or the position
    table, whichever is shorter; with rope, the sequence). BertConfig checks that a segment fits both."""
    pack_samples = values.pop("pack_samples", False)
    if not pack_samples:
        if values.get("max_segment_length") is not None:
            raise ConfigError(f"max_segment_length {values['max_segment_length']} is set without --pack-samples",
                              "add --pack-samples or drop --max-segment-length")
        return False
    if values.get("attention", BertConfig.attention) == "linformer":
        raise ConfigError("packed samples (--pack-samples) cannot use linformer attention: its projection mixes "
                          "the positions of all segments of a sample", "use ring, ulysses, bigbird or dense "
                          "attention, or drop --pack-samples")
    if values.get("max_segment_length") is None:  # rope has no table: a segment may fill the sequence
        sequence = values.get("seq_length", BertConfig.seq_length)
        table = values.get("max_position_embeddings", BertConfig.max_position_embeddings)
        learned = values.get("position_embedding_type", BertConfig.position_embedding_type) == "learned"
        values["max_segment_length"] = min(sequence, table) if learned else sequence
    return True


def _batch_sizes(values: dict, ds_config: dict, data: int) -> tuple:
    """(micro, grad-acc, global) from flags over DeepSpeed's keys; global = micro * gas * data."""
    micro, global_batch = values.pop("micro_batch_size", None), values.pop("global_batch_size", None)
    for flag, value in (("--micro-batch-size", micro), ("--global-batch-size", global_batch)):
        if value is not None and value < 1:  # not "not given": 0 must not fall back to the JSON
            raise ConfigError(f"{flag} {value} must be >= 1", f"pass {flag} 1 or more")
    # messages name what the user wrote: the flag where one was passed, else DeepSpeed's key
    micro_name = "train_micro_batch_size_per_gpu" if micro is None else "--micro-batch-size"
    global_name = "train_batch_size" if global_batch is None else "--global-batch-size"
    micro = ds_config.get("train_micro_batch_size_per_gpu") if micro is None else micro
    global_batch = ds_config.get("train_batch_size") if global_batch is None else global_batch
    gas = ds_config.get("gradient_accumulation_steps")
    given = {micro_name: micro, "gradient_accumulation_steps": gas}
    for key, value in (("train_micro_batch_size_per_gpu", micro), ("train_batch_size", global_batch),
                       ("gradient_accumulation_steps", gas)):
        if value is not None and (_typed(key, value, int) < 1):
            raise ConfigError(f"{key} = {value} must be >= 1", f"set {key} to a positive integer")
    if micro is None:
        micro = 1 if global_batch is None else max(1, global_batch // (data * (gas or 1)))
    if gas is None:
        gas = 1 if global_batch is None else max(1, global_batch // (micro * data))
    global_batch = global_batch or micro * gas * data
    if global_batch != micro * gas * data and None in given.values():  # derived ones: name only what was written
        written = [f"{name} {value}" for name, value in given.items() if value]
        known = data * math.prod(value for value in given.values() if value)
        raise ConfigError(f"{global_name} {global_batch} is not a multiple of {' x '.join(written + [''])}"
                          f"data-parallel size {data} (= world / (pp x sp)){f' = {known}' if written else ''}",
                          f"make {global_name} a multiple of {known}, or set all three batch sizes")
    if global_batch != micro * gas * data:
        raise ConfigError(
            f"{global_name} {global_batch} != {micro_name} {micro} x "
            f"gradient_accumulation_steps {gas} x data-parallel size {data} (= world / (pp x sp))",
            f"make {global_name} = micro x grad-acc x data-parallel size")
    return micro, gas, global_batch

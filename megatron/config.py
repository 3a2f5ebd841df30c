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

Every violated constraint is a ConfigError naming the key (or flag) and the fix. What DeepSpeed's own
keys accept is megatron.ds_schema's. Nothing here imports torch or DeepSpeed unless DeepSpeed's own
checks are asked for (`resolve(..., deepspeed_check=True)`, the trainer's default): tools/ds_config.py
answers in a fraction of a second.
"""
import dataclasses
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from megatron.arguments import flag_setting
from megatron.ds_schema import (SECTION, check_checkpointing_section, check_deepspeed_types, check_fp16_autocast,
                                check_section_keys, check_sequence_communication, deepspeed_accepts,
                                offload_description, precision_description, typed)
from megatron.errors import ConfigError
from megatron.hf_forms import export_note
from megatron.parallel.launch_check import LayoutError
from megatron.paths import in_repository, repository_twin
from megatron.model import attention
from megatron.model.args import BertConfig, check_bounded, check_window, preset_fields
from megatron.model.fields import (Role, fields_with, flag_of, info, json_options, may_be_none, meta, value_type,
                                   variants_with_options)

# the keys of SECTION that are no field: the preset (its fields) -> the type of its value
SECTION_ONLY_KEYS = {"model_preset": str}


@dataclass
class TrainConfig:
    model: BertConfig
    pipeline_parallel_size: int = meta(1, roles=Role.RUN, flag="--pipeline-model-parallel-size",
                                       dest="pipeline_model_parallel_size")
    sequence_parallel_size: int = meta(1, roles=Role.RUN, flag="--sequence-parallel-size", json="size")
    data_parallel_size: int = 1
    micro_batch_size: int = meta(1, roles=Role.RUN, flag="--micro-batch-size")
    gradient_accumulation_steps: int = 1
    zero_stage: int = 0
    activation_checkpoint_interval: int = 0  # transformer layers per checkpointed chunk; 0 = off
    # torch.compile each layer's MLP sublayer (engine.compile_mlp_sublayers)
    compile_mlp: bool = meta(False, roles=Role.RUN, on_flag="--compile-mlp")
    # several segments per sample, up to model.max_segment_length tokens each
    pack_samples: bool = meta(False, roles=Role.RUN, on_flag="--pack-samples", off_flag="--no-pack-samples",
                              json="pack_samples")
    # AdamW's weight decay on every parameter, in one group: how runs trained before biases and norm weights were
    # exempted (engine.optimizer_groups). A new run exempts them (False); a resume takes its checkpoint's, True for
    # one written before the field (checkpoint_compat.decays_norms_and_biases), so that it goes on as it trained
    decay_norms_and_biases: bool = False
    ds_config: dict = field(default_factory=dict)  # what deepspeed.initialize receives

    @property
    def global_batch_size(self) -> int:
        return self.micro_batch_size * self.gradient_accumulation_steps * self.data_parallel_size

    def to_dict(self) -> dict:
        """JSON-ready, for the log directory's config.json and for checkpoints."""
        return dataclasses.asdict(self)

    def summary(self) -> str:
        """One line: layout, attention, precision, ZeRO (and what it offloads), batch, model size."""
        model = self.model
        attention = model.attention + (f" (Ulysses {model.ulysses_size} x ring "
                                       f"{self.sequence_parallel_size // model.ulysses_size})"
                                       if model.attention == "hybrid" and model.ulysses_size
                                       and self.sequence_parallel_size > 1 else "")  # SP 1: plain attention
        return (f"pipeline {self.pipeline_parallel_size} x data {self.data_parallel_size} x sequence "
                f"{self.sequence_parallel_size}, {attention} attention, {precision_description(self.ds_config)}, ZeRO "
                f"{self.zero_stage}{offload_description(self.ds_config)}, global batch {self.global_batch_size} = "
                f"micro {self.micro_batch_size} x grad-acc "
                f"{self.gradient_accumulation_steps} x data {self.data_parallel_size}"
                + (", packed samples" if self.pack_samples else "")
                + (", weight decay on norms and biases too (the checkpoint's)" if self.decay_norms_and_biases else "")
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


def _section_fields() -> dict:
    """The keys of the JSON section that are fields (not a variant's sub-section) -> those fields."""
    return {info(name).json: name for name in fields_with(has_json=True) if "." not in info(name).json}


def section_keys() -> set:
    """The keys the JSON's sequence_parallel section takes: the fields', the preset's, the variants' sub-sections
    (ds_schema names one found at the JSON's top level as misplaced)."""
    return {*_section_fields(), *SECTION_ONLY_KEYS, *variants_with_options()}


def section_values(ds_config: dict) -> dict:
    """The project's JSON section as BertConfig / TrainConfig field values (type-checked; null where the
    field's default is None, or for the preset, is no value): the fields' JSON keys (Field.json), the
    attention variants' sub-sections of them, and the preset's name."""
    section = ds_config.get(SECTION, {})
    if not isinstance(section, dict):
        raise ConfigError(f"{SECTION} must be a JSON object", f'write "{SECTION}": {{"size": ..., "attention": ...}}')
    top = _section_fields()
    check_section_keys(SECTION, section, section_keys())
    values = {}
    for key, name in {**top, **{key: key for key in SECTION_ONLY_KEYS}}.items():
        null_is_unset = name in SECTION_ONLY_KEYS or may_be_none(name)
        if key in section and not (null_is_unset and section[key] is None):
            kind = SECTION_ONLY_KEYS[name] if name in SECTION_ONLY_KEYS else value_type(name)
            values[name] = typed(f"{SECTION}.{key}", section[key], kind)
    for variant in variants_with_options():
        options = json_options(variant)
        for key, value in section.get(variant, {}).items():
            if key not in options:
                raise ConfigError(f"unknown key {SECTION}.{variant}.{key}", f"use one of: {', '.join(options)}")
            values[options[key]] = typed(f"{SECTION}.{variant}.{key}", value, value_type(options[key]))
    return values


def resolve(flags: dict, ds_config: dict, world_size: int, deepspeed_check: bool = True,
            json_given: bool = True, weights_given: bool = False) -> TrainConfig:
    """Merges flags (None = not given) over the JSON over defaults, then validates.

    `flags` keys are TrainConfig / BertConfig field names; `micro_batch_size`, `global_batch_size`
    and `gradient_clipping` (--clip-grad) mirror DeepSpeed's keys and override them. `deepspeed_check`:
    also run DeepSpeed's own checks of its sections (imports DeepSpeed: seconds). `json_given`: the run
    was given a --deepspeed_config (`ds_config` also holds what the trainer fills in), so a fix may name
    its keys; else it names the file to pass. `weights_given`: the run starts from weights or resumes them
    (StartPlan.weights), whose head count no fix may change.
    """
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ConfigError(f"world size {world_size} must be >= 1", "launch at least one process (--world-size N)")
    check_deepspeed_types(ds_config)
    given = {key: value for key, value in flags.items() if value is not None}
    section = section_values(ds_config)
    values = {**section, **given}
    check_model_numbers(values)
    values = {**resized_preset(model_preset(flags, ds_config), values), **values}  # each below its own flag
    values.pop("model_preset", None)
    values.update(rope_positions(values, given.keys() | section.keys()))
    # --checkpoint-activations, else DeepSpeed's own "activation_checkpointing" section turns it on, in chunks of
    # --checkpoint-num-layers layers (default 1)
    chunk = values.pop("checkpoint_num_layers", None)
    checkpoint_interval = (values.pop("activation_checkpoint_interval", 0)
                           or (chunk or 1) * ("activation_checkpointing" in ds_config))
    if chunk and not checkpoint_interval:
        raise ConfigError("--checkpoint-num-layers is given without --checkpoint-activations or an "
                          "activation_checkpointing section in the DeepSpeed JSON (it sizes the recomputed chunks)",
                          "add --checkpoint-activations or drop --checkpoint-num-layers")
    compile_mlp = values.pop("compile_mlp", False)
    decay_norms_and_biases = values.pop("decay_norms_and_biases", False)  # a resume's: its checkpoint's grouping
    try:
        pack_samples = _packing(values)
    except ConfigError as error:  # named as given: a JSON key where the JSON set it
        raise _as_given(error.problem, error.fix, given, section) from None
    pipeline, sequence, data = _layout(values, ds_config, world_size, given)

    micro, gas, global_batch = _batch_sizes(values, ds_config, data)
    zero_stage = typed("zero_optimization.stage", ds_config.get("zero_optimization", {}).get("stage", 0), int)
    if pipeline > 1 and zero_stage > 1:
        raise ConfigError(f"zero_optimization.stage {zero_stage} cannot be combined with pipeline parallelism "
                          f"(pipeline size {pipeline})", "use zero_optimization.stage 0 or 1 with a pipeline")

    check_checkpointing_section(ds_config, sequence, pipeline, gas)
    clipping_flag = values.pop("gradient_clipping", None)  # --clip-grad, over the JSON's
    if clipping_flag is not None:
        ds_config = {**ds_config, "gradient_clipping": clipping_flag}
    _check_pipeline_clipping(ds_config, clipping_flag, pipeline, zero_stage, json_given)
    stages = "--pipeline-model-parallel-size" if "pipeline_parallel_size" in given else "pipeline.stages"
    check_fp16_autocast(ds_config, f"{stages} {pipeline}" if pipeline > 1 else None,
                        _clipping_setting(ds_config, clipping_flag, json_given))

    try:
        _ulysses_size(values, sequence)
    except ConfigError as error:
        raise _as_given(error.problem, error.fix, given, section) from None
    model_fields = {f.name for f in dataclasses.fields(BertConfig)}
    unknown = set(values) - model_fields
    if unknown:
        raise ConfigError(f"unknown setting(s) {sorted(unknown)}", "remove them or check the spelling")
    where = ""  # the model's own checks; then the attention's, named by the JSON section where it set them
    try:
        model = BertConfig(**values)
        where = f"{SECTION}: " if section.keys() - _NOT_ATTENTION_KEYS else ""
        _refuse_packed_linformer(model, pack_samples)
        attention.check(model, sequence)
    except ConfigError as error:
        fix = _preset_fix(error.fix, given, section, flags, ds_config)
        fix = attention.without_new_head_count(fix) if weights_given else fix
        problem = where + _preset_problem(error.problem, values, given, section, flags, ds_config)
        raise _as_given(problem, fix, given, section) from None
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
                       compile_mlp=compile_mlp, pack_samples=pack_samples,
                       decay_norms_and_biases=decay_norms_and_biases, ds_config=resolved)


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
        ulysses = values.get("ulysses_size") if values.get("attention") == "hybrid" else None
        raise LayoutError(f"{sequence_key} {sequence} x pipeline {pipeline} does not divide the world size "
                          f"{world_size}", world_size, pipeline, sequence, ulysses)
    if pipeline == 1 and sequence > 1:
        check_sequence_communication(ds_config, sequence)
    return pipeline, sequence, world_size // (pipeline * sequence)


def _check_pipeline_clipping(ds_config: dict, clipping_flag, pipeline: int, zero_stage: int,
                             json_given: bool = True) -> None:
    """Refuses gradient clipping with a pipeline at ZeRO stage 0: DeepSpeed 0.19.8 runtime/utils.py
    clip_grad_norm_ counts only the parameters of the rank whose pipeline-grid model-parallel rank is
    0 (the first stage), a wrong norm. The line names the setting as the user gave it: --clip-grad
    (`clipping_flag`, already in `ds_config`), the JSON's gradient_clipping, or DeepSpeed's default 1.0;
    without `json_given` the run has no JSON to edit (Megatron's habit: --pipeline-model-parallel-size alone),
    so the fix names the file to pass."""
    if not (pipeline > 1 and zero_stage == 0 and ds_config.get("gradient_clipping", 1.0) > 0):
        return
    setting = _clipping_setting(ds_config, clipping_flag, json_given)
    off = ('"gradient_clipping": 0 in the JSON, or --clip-grad 0' if json_given and clipping_flag is None
           else "--clip-grad 0")
    zero_1 = ('pass --deepspeed --deepspeed_config FILE holding {"zero_optimization": {"stage": 1}}' if not json_given
              else "use zero_optimization.stage 1")
    raise ConfigError(f"{setting} with a pipeline at zero_optimization.stage 0 would clip by the first stage's "
                      "gradient norm only", f"{zero_1}, or turn clipping off ({off})")


def _clipping_setting(ds_config: dict, clipping_flag, json_given: bool) -> str:
    """The run's gradient clipping as the user set it: --clip-grad (`clipping_flag`, already in `ds_config`), the
    JSON's gradient_clipping, or DeepSpeed's default 1.0 (said so; `json_given`: whether there is a JSON)."""
    clipping = ds_config.get("gradient_clipping", 1.0)  # DeepSpeed's default is 1.0
    if clipping_flag is not None:
        return f"--clip-grad {clipping}"
    if not json_given:
        return f"gradient clipping {clipping} (DeepSpeed's default: no --deepspeed_config is given)"
    return f"gradient_clipping {clipping}" + ("" if "gradient_clipping" in ds_config else
                                              " (the default: the JSON sets none)")


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
    """`fix` naming the JSON key rather than the flag of a setting the JSON section set and no flag did
    ('choose sequence_parallel.linformer.k at most --seq-length', 'drop sequence_parallel.pack_samples'). An
    attention option set by neither (ulysses_size, linformer.k) is named as the variant was set: the JSON's
    'sequence_parallel.attention hybrid with sequence_parallel.ulysses_size 4', not '... hybrid --ulysses-size 4'."""
    json_variant = "attention" in section and "attention" not in given
    for name in fields_with(has_json=True):
        unset_option = json_variant and name not in section and name not in given and info(name).flag and (
            name == "ulysses_size" or "." in info(name).json)
        if (name in section and name not in given) or unset_option:
            flag = info(name).flag or info(name).on_flag
            fix = re.sub(f"{flag}(?![-\\w])", f"{SECTION}.{info(name).json}", fix)
    # JSON keys are no command line: two settings side by side are joined
    return re.sub(f"({re.escape(SECTION)}\\.[\\w.]+ \\S+) (?={re.escape(SECTION)}\\.)", r"\1 with ", fix)


def _as_given(problem: str, fix: str, given: dict, section: dict) -> ConfigError:
    """The error of `problem` and `fix` naming each setting as the user gave it: the JSON key where the
    JSON section set it and no flag did (_section_fix)."""
    return ConfigError(_section_fix(problem, given, section), _section_fix(fix, given, section))


def _variant_options(variant: str) -> dict:
    """The options that attention `variant` alone reads: field -> (its flag, its JSON key)."""
    return {name: (info(name).flag or info(name).on_flag, f"{SECTION}.{variant}.{key}")
            for key, name in json_options(variant).items()}


def check_model_numbers(values: dict) -> None:
    """Model numbers checked alone, whatever else is set (BertConfig checks the rest): the fields with
    bounds (Field.above, .at_most): a negative or zero init std or LayerNorm epsilon (or NaN, inf) reaches
    torch's init or the first forward pass, after the data's index maps are built; a rope theta as
    BertConfig states it (ROPE_THETA_FLOOR, ROPE_THETA_CEILING); and the local window. Also before a run
    from weights notes a value that replaces theirs (starting_weights.model_flags)."""
    for key in (name for name in fields_with() if info(name).above is not None):
        if values.get(key) is not None:
            check_bounded(key, values[key])
    check_window(values.get("local_attention_window"))


def _refuse_unused_options(flags: dict, section: dict, model: BertConfig) -> None:
    """Options given (by flag or in the JSON section) that the resolved run would not read: a variant's
    options with another attention variant (as ulysses_size is refused), rope bases with learned
    positions, local-layer options when no layer is local. Preset values are not "given": only what
    the user set is refused."""
    def name(key: str, flag: str, json_key: str | None = None) -> str:
        return flag if key in flags or json_key is None else json_key

    for variant in variants_with_options():
        for key, (flag, json_key) in _variant_options(variant).items():
            if (key in flags or key in section) and model.attention != variant:
                option = name(key, flag, json_key)
                raise ConfigError(f"{option} is set but attention is '{model.attention}' ({variant} options are "
                                  "read by that variant only)", f"set attention '{variant}' or drop {option}")
    rope = model.position_embedding_type == "rope"
    for key in ("rotary_base", "local_rotary_base"):
        if key in flags and not rope:
            flag = flag_of(key)
            raise ConfigError(f"{flag} {flags[key]} is set but positions are learned (a table, no rotary angles)",
                              f"add --position-embedding-type rope or drop {flag}")
    if "global_attention_every" in flags and model.local_attention_window is None:
        raise ConfigError(f"--global-attention-every {flags['global_attention_every']} is set without "
                          "--local-attention-window: every layer is global", "add --local-attention-window W or drop "
                          "--global-attention-every")
    for key in ("local_attention_window", "local_rotary_base"):
        if key in flags and not model.has_local_layers:
            flag = flag_of(key)
            raise ConfigError(f"{flag} {flags[key]} is set but no layer is local (layer i is local when "
                              f"i % --global-attention-every != 0; it is {model.global_attention_every}, with "
                              f"{model.num_layers} layers)",
                              f"{'pass' if 'global_attention_every' in flags else 'add'} --global-attention-every N "
                              f"(N > 1, with --local-attention-window W) or drop {flag}")


def _refuse_stages_without_layers(stages: int, layers: int, by_flag: bool) -> None:
    """More pipeline stages than transformer layers: DeepSpeed's partition (by transformer layer) leaves
    a stage holding only the embeddings or the heads, a rank that mostly waits (Megatron refuses it too)."""
    if stages > layers:
        key = "--pipeline-model-parallel-size" if by_flag else "pipeline.stages"
        fewer = (f"pass {key} {layers}" if by_flag else f"set {key} to {layers}") + " or fewer" * (layers > 1)
        raise ConfigError(f"{key} {stages} is more pipeline stages than the {layers} transformer layer"
                          f"{'s' * (layers > 1)}: a stage "
                          "would hold no transformer layer", f"{fewer}, or pass --num-layers {stages} or more")


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


def model_notes(model: BertConfig, window_given: bool, weights_from: str | None = None) -> list:
    """The start-up notes of a model that trains but is likely not what was meant: one that to-hf would
    refuse (`weights_from`: the folder whose weights hold its layers, if any), local layers that are not
    local (`window_given`: by --local-attention-window). The trainer prints them, tools/ds_config.py
    show/validate too."""
    return [note for note in (export_note(model, weights_from), wide_window_note(model, window_given)) if note]


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


def adjustable_start_fields(start: dict, from_hf: bool, resume: bool = False) -> tuple:
    """The fields of the weights a run starts from (--init-from-hf, a weights-only --load) that the run may
    set otherwise. For an HF folder, whose weights are converted, the adjustable_start fields (the table
    extended by repetition, the rope thetas and the window for a longer context, the head initialised, the
    vocab padded again); the sizes, layout, layer types and global-layer period are the weights' own. A
    weights-only checkpoint's are loaded as they are, so only the fields that shape no weight: the rope
    thetas, the window, and the length where rope leaves no table, and the vocab padding, whose rows no
    token reaches (padded again: hf_convert.repadded_vocab, as from an HF folder). A resume keeps the
    thetas, the window and the padding too (fields.resume_kept): only that length."""
    if from_hf:
        return fields_with(adjustable_start=True)
    table_free = ("max_position_embeddings",) * (start.get("position_embedding_type") == "rope")
    return table_free if resume else (*fields_with(role=Role.WEIGHTLESS), *table_free, "make_vocab_size_divisible_by")


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
               f"weights with --finetune and another --save, or {in_repository('tools/extend_context.py')} for a "
               "longer context"
               if Role.WEIGHTLESS in info(name).roles
               else f"the weights fix {name}")  # weightless fields are adjustable but on a resume
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
            raise ConfigError(f"--ulysses-size {ulysses} is set but attention is '{variant}'",
                              "set --attention hybrid or drop --ulysses-size")
        return
    if ulysses is not None and ulysses < 1:
        raise ConfigError(f"--ulysses-size {ulysses} must be >= 1",
                          "set --ulysses-size to a divisor of --sequence-parallel-size")
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
    if values.get("max_segment_length") is None:  # rope has no table: a segment may fill the sequence
        sequence = values.get("seq_length", BertConfig.seq_length)
        table = values.get("max_position_embeddings", BertConfig.max_position_embeddings)
        learned = values.get("position_embedding_type", BertConfig.position_embedding_type) == "learned"
        values["max_segment_length"] = min(sequence, table) if learned else sequence
    return True


def _refuse_packed_linformer(model: BertConfig, pack_samples: bool) -> None:
    """Packed samples with linformer, whose projection mixes the positions of all segments of a sample;
    with local layers too (which linformer refuses as well: attention.check), both in one line, so that
    the fix given is one that clears both."""
    if not (pack_samples and model.attention == "linformer"):
        return
    packed = "packed samples (--pack-samples: its projection mixes the positions of all segments of a sample)"
    if model.has_local_layers:
        raise ConfigError(f"linformer attention cannot be combined with local sliding-window layers (its global "
                          f"layers would change the math of a windowed model) nor with {packed}",
                          "use attention dense, ring, ulysses or hybrid, or (to keep linformer) drop --pack-samples "
                          "and drop --local-attention-window")
    raise ConfigError(f"linformer attention cannot be combined with {packed}", "use ring, ulysses, bigbird or dense "
                      "attention, or drop --pack-samples")


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
        if value is not None and (typed(key, value, int) < 1):
            raise ConfigError(f"{key} = {value} must be >= 1", f"set {key} to a positive integer")
    if micro is None:
        micro = 1 if global_batch is None else max(1, global_batch // (data * (gas or 1)))
    if gas is None:
        gas = 1 if global_batch is None else max(1, global_batch // (micro * data))
    global_batch = global_batch or micro * gas * data
    if global_batch == micro * gas * data:
        return micro, gas, global_batch
    flags = "--" in micro_name + global_name  # a flag against the JSON's accumulation: say whose that is
    if None in given.values():  # derived ones: name only what was written
        raise _not_a_multiple(global_name, global_batch, {name: value for name, value in given.items() if value}, data)
    if flags and global_batch % (micro * data):  # no accumulation fits: dropping the JSON's would not do
        raise _not_a_multiple(global_name, global_batch, {micro_name: micro}, data, (
            f"make {global_name} {micro * gas * data} (micro x the JSON's gradient_accumulation_steps {gas} x "
            f"data-parallel size), or a multiple of {micro * data} with gradient_accumulation_steps dropped from the "
            "JSON"))
    whose = "the JSON's " if flags else ""
    raise ConfigError(
        f"{global_name} {global_batch} != {micro_name} {micro} x {whose}gradient_accumulation_steps {gas} x "
        f"data-parallel size {data} (= world / (pp x sp))",
        f"make {global_name} = micro x grad-acc x data-parallel size" + (
            ", or drop gradient_accumulation_steps from the JSON (the batch sizes then give it)" if flags else ""))


def _not_a_multiple(global_name: str, global_batch: int, written: dict, data: int, fix: str = "") -> ConfigError:
    """A global batch that no whole number of the `written` batch sizes (name -> value) x the data-parallel size
    makes. The fix (unless `fix` is given): those that make one, a multiple, or (one size written) a size that
    divides the global batch per data rank; 'set all three batch sizes' named none."""
    known = data * math.prod(written.values())
    factors = [f"{name} {value}" for name, value in written.items()]
    if not fix:
        fix = f"make {global_name} a multiple of {known}" + (
            f", or {next(iter(written))} a divisor of {global_batch // data}"
            if len(written) == 1 and global_batch % data == 0 else "")
    return ConfigError(f"{global_name} {global_batch} is not a multiple of {' x '.join(factors + [''])}data-parallel "
                       f"size {data} (= world / (pp x sp)){f' = {known}' if written else ''}", fix)

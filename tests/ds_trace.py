"""The DeepSpeed tables megatron/ds_schema.py hard-codes (so that it and tools/ds_config.py import neither
torch nor DeepSpeed), traced again from the installed DeepSpeed and torch: test_ds_config_tool.py
holds each pair equal, so a DeepSpeed upgrade that changes one fails there until the table follows."""
import contextlib
import inspect

from megatron.ds_schema import _ADAM_DEEPSPEED_KEYS, _DEEPSPEED_OTHER_KEYS, _MUP_OPTIMIZERS, OPTIMIZER_NAMES


def traced_optimizer_params() -> dict:
    """OPTIMIZER_PARAMS from the installed DeepSpeed and torch: the keyword arguments of the classes
    DeepSpeed's engine builds for each type, and the keys it reads or pops itself."""
    import torch
    from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad
    from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam
    from deepspeed.ops.lamb import FusedLamb
    from deepspeed.ops.lion import DeepSpeedCPULion, FusedLion
    from deepspeed.runtime.engine import DeepSpeedEngine

    def keywords(*classes, passed_by_deepspeed=()):
        names = {name for cls in classes for name in inspect.signature(cls.__init__).parameters}
        return names - {"self", "params", "model_params", "max_grad_norm", *passed_by_deepspeed}

    adam = keywords(FusedAdam, DeepSpeedCPUAdam, passed_by_deepspeed=("adamw_mode",)) | set(_ADAM_DEEPSPEED_KEYS)
    traced = {"adam": adam, "adamw": adam, "adagrad": keywords(torch.optim.Adagrad, DeepSpeedCPUAdagrad),
              "lamb": keywords(FusedLamb), "lion": keywords(FusedLion, DeepSpeedCPULion),
              "muon": {*DeepSpeedEngine._MUON_HALF_KEYS, *DeepSpeedEngine._ADAM_HALF_KEYS, "muon_lr", "adam_lr",
                       *_ADAM_DEEPSPEED_KEYS}}
    for name in OPTIMIZER_NAMES.values():
        cls = getattr(torch.optim, name, None)
        if name.lower() not in traced and name.lower() not in _MUP_OPTIMIZERS and cls is not None:
            traced[name.lower()] = keywords(cls)
    return {name: frozenset(params) for name, params in traced.items()}, keywords(torch.optim.AdamW) | set(
        _ADAM_DEEPSPEED_KEYS)


def traced_deepspeed_top_level_keys() -> set:
    """DEEPSPEED_TOP_LEVEL_KEYS from the installed DeepSpeed: the keys its DeepSpeedConfig looks
    up (traced on a minimal config), the keys named in its constants, and the few read elsewhere."""
    import deepspeed.runtime.constants as constants
    from deepspeed.runtime.config import DeepSpeedConfig

    looked_up = set()

    class Tracing(dict):
        def get(self, key, *default):
            looked_up.add(key)
            return super().get(key, *default)

        def __getitem__(self, key):
            looked_up.add(key)
            return super().__getitem__(key)

        def __contains__(self, key):
            looked_up.add(key)
            return super().__contains__(key)

    with contextlib.suppress(Exception):
        DeepSpeedConfig(Tracing(train_micro_batch_size_per_gpu=1, gradient_accumulation_steps=1))
    named = {value for name, value in vars(constants).items()
             if name.isupper() and isinstance(value, str) and value.isidentifier() and value.islower()}
    return looked_up | named | _DEEPSPEED_OTHER_KEYS


def traced_optimizer_names() -> dict:
    """OPTIMIZER_NAMES from the installed DeepSpeed and torch."""
    import torch
    from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS

    names = {name.lower(): name for name in DEEPSPEED_OPTIMIZERS}
    for name, value in vars(torch.optim).items():
        if isinstance(value, type) and issubclass(value, torch.optim.Optimizer) and value is not torch.optim.Optimizer:
            names.setdefault(name.lower(), name)
    return names


def traced_section_keys() -> dict:
    """DEEPSPEED_SECTION_KEYS from the installed DeepSpeed: its config models' field names and aliases."""
    from deepspeed.runtime.precision_config import DeepSpeedBF16Config, DeepSpeedFP16Config
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    def keys(model) -> frozenset:
        return frozenset({*model.model_fields, *(f.alias for f in model.model_fields.values() if f.alias)})

    return {"fp16": keys(DeepSpeedFP16Config), "bf16": keys(DeepSpeedBF16Config),
            "bfloat16": keys(DeepSpeedBF16Config), "zero_optimization": keys(DeepSpeedZeroConfig)}


def traced_stage3_settings() -> dict:
    """_STAGE3_SETTINGS from the installed DeepSpeed: its ZeRO fields also named stage3_*, with their defaults."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    return {name: field.default for name, field in DeepSpeedZeroConfig.model_fields.items()
            if field.alias == f"stage3_{name}"}

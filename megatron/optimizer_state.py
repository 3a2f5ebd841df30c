"""Adam state per parameter in BertModel names: what lets a checkpoint load in another layout.

DeepSpeed's own files follow the layout that wrote them: pipeline stages own disjoint parameters,
ZeRO flattens and partitions them over data x seq. `gather` turns one stage's optimizer into
{BertModel name: fp32 master, exp_avg, exp_avg_sq} plus Adam's step count (DeepSpeed's
`safe_get_full_*` for its ZeRO and bf16 optimizers, the torch optimizer's own state at ZeRO 0) and
the optimizer's settings (`settings`: what DeepSpeed's own files restore besides the tensors);
`scatter` writes such a dict into an engine of any pipeline degree, SP degree and ZeRO stage 0-2.
"""
import torch

from megatron.checkpoint_compat import NEW_RUN_FIX
from megatron.errors import ConfigError, DataError
from megatron.model.bert import BertConfig
from megatron.model.pipe import pipe_to_bert_name

MOMENTS = ("exp_avg", "exp_avg_sq")


def exempt_from_decay(name: str, shape) -> bool:
    """Megatron's rule (get_param_groups), which Hugging Face's Trainer and ModernBERT's training follow too: biases
    and 1-D parameters (LayerNorm / RMSNorm weights) get no weight decay. AdamW's decay pulls a weight towards 0, a
    prior that suits the matrices; a norm's gain pulled towards 0 (not its 1) and a bias towards 0 only fight the
    loss. `shape`: the parameter's whole shape (ZeRO 3's ds_shape, not its empty stand-in's)."""
    return name.endswith(".bias") or len(shape) == 1


def in_group_order(named: list, decay_norms_and_biases: bool) -> list:
    """`named` [(name, tensor)] in a module's order -> the same pairs in the order of the optimizer's parameters,
    group after group (engine.optimizer_groups: the decayed weights, then the biases and norm weights; one group
    of the module's order for `decay_norms_and_biases`): the order of the fp32 masters DeepSpeed flattens."""
    if decay_norms_and_biases:
        return list(named)
    exempt = [exempt_from_decay(name, tensor.shape) for name, tensor in named]
    return [item for item, spared in zip(named, exempt) if not spared] + [
        item for item, spared in zip(named, exempt) if spared]


def bert_names(engine, config: BertConfig) -> dict:
    """{engine.module parameter: BertModel name} for the parameters this rank's stage holds."""
    names = engine.module.named_parameters()
    if not hasattr(engine, "num_stages"):  # the plain model: names are BertModel's
        return {param: name for name, param in names}
    return {param: pipe_to_bert_name(name, config.num_layers) for name, param in names}


def _base_optimizer(engine) -> torch.optim.Optimizer:
    """The torch optimizer that holds Adam's tensors (DeepSpeed's wrappers keep it as .optimizer)."""
    optimizer = engine.optimizer
    return getattr(optimizer, "optimizer", optimizer)


def _uses_full_state_api(param) -> bool:
    """DeepSpeed's ZeRO / bf16 optimizers link every parameter to its fp32 fragment (a rank whose
    partition misses the parameter still has the attribute, set to None)."""
    return hasattr(param, "ds_id") or hasattr(param, "_hp_mapping")


def reshapable(engine) -> bool:
    """Whether gather / scatter can read and write this engine's optimizer (not fp16 or bf16 at
    ZeRO 0, whose FP16 optimizers keep their fp32 copies in their own groups)."""
    return not collective(engine) or all(map(_uses_full_state_api, engine.module.parameters()))


def collective(engine) -> bool:
    """Whether gather must run on every rank of the stage: DeepSpeed's ZeRO and bf16 optimizers
    assemble each parameter's state by an all-reduce over its data x seq group."""
    return engine.optimizer is not _base_optimizer(engine)


def adam_step(engine) -> float:
    """Adam's step count (equal for every parameter; 0 before the first step)."""
    for state in _base_optimizer(engine).state.values():
        if "step" in state:
            return float(state["step"])
    return 0.0


def gather(engine, config: BertConfig) -> dict:
    """{"step", "params": {name: {"fp32", "exp_avg", "exp_avg_sq"}}} of this rank's stage, on CPU.

    Collective over the stage's data x seq group at ZeRO >= 1 (every rank of it must call).
    Needs `reshapable(engine)`."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    base = _base_optimizer(engine)
    if collective(engine):
        _link_optimizer_states(engine)
    params = {}
    for param, name in bert_names(engine, config).items():
        if _uses_full_state_api(param):
            entry = {"fp32": safe_get_full_fp32_param(param)}
            entry.update({key: safe_get_full_optimizer_state(param, key) for key in MOMENTS})
        else:  # ZeRO 0 in fp32: torch's optimizer on the model's parameters
            state = base.state.get(param, {})
            entry = {"fp32": param.detach(), **{key: state.get(key, torch.zeros_like(param)) for key in MOMENTS}}
        params[name] = {key: value.detach().float().cpu().clone() for key, value in entry.items()}
    return {"step": adam_step(engine), "params": params, **settings(engine)}


def settings(engine) -> dict:
    """{"param_groups", "loss_scaler"}: every param-group field but the tensors (lr as the scheduler
    left it for the next step, betas, eps, weight decay, the scheduler's initial_lr, ...), and a
    dynamic loss scaler's state (fp16: scale, iterations since the last overflow, hysteresis; None
    for a static one, whose scale is the config's). DeepSpeed's own files restore both: the same
    resume in another layout must not run its next step with this run's fresh values."""
    groups = [{key: value for key, value in group.items() if key != "params"}
              for group in _base_optimizer(engine).param_groups]
    scaler = getattr(engine.optimizer, "loss_scaler", None)
    dynamic = getattr(scaler, "dynamic", False)
    return {"param_groups": groups, "loss_scaler": {key: value for key, value in vars(scaler).items()
                                                    if isinstance(value, (int, float))} if dynamic else None}


def restore_settings(engine, stored: dict) -> None:
    """Writes `settings` of a checkpoint into this engine's optimizer (any layout: one group per
    stage, the same fields); a dynamic loss scale only into a run that scales dynamically too."""
    groups = _base_optimizer(engine).param_groups
    if len(stored["param_groups"]) != len(groups):
        raise DataError(f"the checkpoint's optimizer has {len(stored['param_groups'])} parameter groups, this "
                        f"run's {len(groups)}", "resume in the layout the checkpoint was written in")
    for group, saved in zip(groups, stored["param_groups"]):
        group.update(saved)
    scaler = getattr(engine.optimizer, "loss_scaler", None)
    if stored["loss_scaler"] and getattr(scaler, "dynamic", False):
        vars(scaler).update(stored["loss_scaler"])


def scatter(engine, config: BertConfig, stored: dict, written: str) -> None:
    """Writes gathered state (any layout's, merged) into this engine's optimizer, settings included;
    `written`: the layout the state was saved in, for the refusals."""
    from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

    base = _base_optimizer(engine)
    names = bert_names(engine, config)
    if not reshapable(engine):
        raise ConfigError(f"a checkpoint of another layout ({written}) cannot be loaded into DeepSpeed's "
                          f"{type(engine.optimizer).__name__}",
                          "resume at ZeRO stage 1 or 2 (fp16 and bf16 at stage 0 cannot take it)")
    if any(hasattr(param, "ds_id") for param in names):
        raise ConfigError("ZeRO stage 3 resumes only its own checkpoints (stage 3, this layout); this one was "
                          f"written at {written}", f"resume at ZeRO stage 0-2, or {NEW_RUN_FIX} at stage 3 with a "
                          "fresh optimizer")
    step = torch.tensor(stored["step"], dtype=torch.float32)
    if collective(engine):
        _create_flat_state(engine, base, step)
    for param, name in names.items():
        entry = stored["params"][name]
        if _uses_full_state_api(param):
            safe_set_full_fp32_param(param, entry["fp32"].to(param.device))
            for key in MOMENTS:
                safe_set_full_optimizer_state(param, entry[key].to(param.device), key)
        else:
            with torch.no_grad():
                param.copy_(entry["fp32"])
            base.state[param] = {"step": step.clone(), **{key: entry[key].to(param) for key in MOMENTS}}
    if collective(engine) and hasattr(engine.optimizer, "update_lp_params"):
        engine.optimizer.update_lp_params()  # bf16 / fp16 model copies from the fp32 masters just set
    restore_settings(engine, stored)


def _create_flat_state(engine, base, step) -> None:
    """Adam's state on DeepSpeed's flat fp32 partitions exists only after a first step; creates it
    (zeros, then filled per parameter by scatter) and links each parameter's fragment to it."""
    for group in base.param_groups:
        for flat in group["params"]:
            base.state[flat] = {"step": step.clone(), **{key: torch.zeros_like(flat) for key in MOMENTS}}
    _link_optimizer_states(engine)


def _link_optimizer_states(engine) -> None:
    """Points each parameter's fragment at the Adam state of its flat fp32 partition, which safe_get_full_* and
    safe_set_full_* read. DeepSpeed 0.19.8's ZeRO 1/2 optimizer steps one parameter group at a time and links
    every group once, after the first group's first step: the later groups (the biases and norm weights,
    engine.optimizer_groups) had no state yet and stayed linked to none ('exp_avg not found in optimizer state
    fragment'). The bf16 optimizer links after stepping every group; linking again changes nothing there."""
    if hasattr(engine.optimizer, "_lazy_init_hp_params_optimizer_state"):
        engine.optimizer._hp_optimizer_states_linked = False
        engine.optimizer._lazy_init_hp_params_optimizer_state()

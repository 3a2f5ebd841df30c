"""Whether a checkpoint's model, attention and optimizer fit this run's: the settings a resume must
keep (check_same_model, check_model_shapes, check_same_optimizer), and the one-line notes when weights
meet attention of other math (attention_change, local_layers_added). Read by checkpoint.load, the
trainer's resume and --finetune checks and tools/convert_checkpoint.py.
"""
import dataclasses

import torch

from megatron.errors import ConfigError
from megatron.model.args import MODEL_PRESETS
from megatron.model.bert import BertConfig, BertModel
from megatron.model.fields import Role, fields_with, info, resume_kept
from megatron.parallel import state as parallel_state


RESUME_FIX = "resume with the model flags the checkpoint was trained with"
START_FIX = "pass the model flags the checkpoint was trained with"
# the other way on where a resume cannot take the checkpoint: a new run from its weights starts at iteration 0, so it
# needs a --save of its own (start_plan.refuse_finetune_in_place refuses the folder it starts from)
NEW_RUN_FIX = "pass --finetune and another --save to start a new run from the checkpoint's weights"
# the tensors of an attention core (Linformer's key / value projections, the only core with weights):
# weights trained with another variant lack them, a start from such weights initialises them
CORE_TENSORS = ".attention.core."


def _vocab_fix(vocab_size: int) -> str:
    return (f"pass --vocab-size {vocab_size}, the checkpoint's (a --model-preset used to set it; the vocab file "
            f"does now), or {RESUME_FIX}")


def _ffn_fix(trained: BertConfig) -> str:
    # a preset's FFN width under another hidden size: what a --model-preset resized by --hidden-size kept
    kept = any(preset["ffn_hidden_size"] == trained.ffn_hidden_size and preset["hidden_size"] != trained.hidden_size
               for preset in MODEL_PRESETS.values())
    why = (" (a --model-preset resized by --hidden-size used to keep the preset's; it keeps its ratio now)" if kept
           else "")
    return f"pass --ffn-hidden-size {trained.ffn_hidden_size}, the checkpoint's{why}, or {RESUME_FIX}"


def stored_bert_config(stored: dict) -> BertConfig:
    """The model a checkpoint's stored config (run_state.json's config.model) describes; keys this
    version's BertConfig lacks are passed over."""
    fields = {f.name for f in dataclasses.fields(BertConfig)}
    return BertConfig(**{k: v for k, v in stored.items() if k in fields})


def model_tensors(config: BertConfig) -> dict:
    """The tensors of the model `config` describes, on the meta device (their shapes alone), built as one
    process: the attention cores own no tensors that depend on the ranks, and a checkpoint's settings
    (hybrid's Ulysses size) would be checked against the groups made for this run's layout."""
    with torch.device("meta"), parallel_state.one_process():
        return BertModel(config).state_dict()


def check_model_shapes(stored: dict, config: BertConfig, folder: str, start: bool = False) -> tuple[list, list]:
    """The checkpoint's model must have this run's tensors and shapes; names the first that differs.
    `start`: a new run from the weights (a weights-only checkpoint, --finetune), which initialises the
    attention core's tensors the checkpoint lacks and drops those this model lacks (weights of another
    variant: Linformer's projections); returns their names (to initialise, to drop)."""
    trained = stored_bert_config(stored)
    found, expected = model_tensors(trained), model_tensors(config)
    fresh = [name for name in expected if start and name not in found and CORE_TENSORS in name]

    def fix(name: str) -> str:
        if name.endswith("word_embeddings.weight") and stored.get("vocab_size") != config.vocab_size:
            return _vocab_fix(stored["vocab_size"])
        if start:
            return START_FIX
        if CORE_TENSORS in name and (name in found) != (name in expected):  # to or from linformer
            return f"resume with attention {trained.attention}, the checkpoint's, or {NEW_RUN_FIX}"
        return RESUME_FIX

    for name, tensor in expected.items():
        if name not in fresh and (name not in found or found[name].shape != tensor.shape):
            if name not in found:
                raise ConfigError(f"checkpoint {folder} lacks {name}, which this model has", fix(name))
            raise ConfigError(f"checkpoint {folder} holds {name} of shape {list(found[name].shape)}, this model "
                              f"expects {list(tensor.shape)}", fix(name))
    # e.g. biases or a position table dropped; at a start, another variant's core tensors are dropped
    extra = [name for name in found if name not in expected]
    dropped = [name for name in extra if start and CORE_TENSORS in name]
    if len(extra) > len(dropped):
        name = next(name for name in extra if name not in dropped)
        raise ConfigError(f"checkpoint {folder} holds {name}, which this model does not have", fix(name))
    return fresh, dropped


def check_same_model(stored: dict, config: BertConfig, folder: str) -> None:
    """A resume whose model flags differ from the checkpoint's: the first differing field a resume keeps
    (fields.resume_kept: the sizes, what the weights compute, the optional tensors; dropout, init, sequence
    length, packing and the attention variant may change, a variant of other math with a warning:
    attention_change), named as a setting (`--num-layers 4` met a 3-layer checkpoint as 'lacks
    layers.3...'), else the first differing tensor shape."""
    trained = stored_bert_config(stored)
    # a variant's own fields where both runs use it: Linformer's projections' shapes (else the variant
    # differs: check_model_shapes names it)
    shared = trained.attention if trained.attention == config.attention else None
    for name in (name for name in resume_kept() if info(name).variant in (None, shared)):
        if getattr(trained, name) != getattr(config, name):
            fix = (_vocab_fix(trained.vocab_size) if name == "vocab_size" else _ffn_fix(trained)
                   if name == "ffn_hidden_size" else RESUME_FIX)
            raise ConfigError(f"checkpoint {folder} was trained with {name} {getattr(trained, name)}, this run's "
                              f"model has {getattr(config, name)}", fix)
    check_model_shapes(stored, config, folder)


# what an attention variant computes, where weights meet another variant than they were trained with
# (a resume, --finetune); dense, ring, ulysses and hybrid compute the same softmax over every
# token, split across ranks differently, so weights move between them unchanged
ATTENTION_MATH = {"linformer": "Linformer's low-rank projected attention",
                  "bigbird": "BigBird's block-sparse attention"}
EVERY_TOKEN = "attention to every token"


def local_fields() -> tuple:
    """The fields that decide which keys a query of any variant sees (the local layers): Role.VISIBILITY.
    BigBird's seed is not one: its random blocks are drawn anew every step; nor are the rope thetas,
    which a longer context changes on purpose."""
    return fields_with(role=Role.VISIBILITY, variant=None)


def attention_change(source: str, trained: dict, now: dict, user: str = "this run") -> str | None:
    """One line (None: the same math) saying that weights trained with the attention of model fields
    `trained` (a stored config's, or vars(BertConfig)) compute another function under `user`'s `now`:
    another variant's math, or the same variant with other blocks (its Role.VISIBILITY fields) or local
    layers. The outputs change, silently otherwise."""
    variant = trained["attention"]
    was, will = (ATTENTION_MATH.get(fields["attention"], EVERY_TOKEN) for fields in (trained, now))
    if was != will:
        return (f"{source} was trained with {was} ({variant}); {user} uses {will} ({now['attention']}), so its "
                "outputs differ from the trained model's")
    # an older config may lack one: the default
    names = (*fields_with(role=Role.VISIBILITY, variant=variant), *local_fields())
    was_set, now_set = ({name: fields.get(name, getattr(BertConfig, name)) for name in names}
                        for fields in (trained, now))
    changed = [name for name in names if was_set[name] != now_set[name]]
    if not changed:
        return None
    return _fields_change(f"{source} was trained with {variant} attention at", changed, was_set, now_set, user)


def _fields_change(trained_with: str, changed: list, was_set: dict, now_set: dict, user: str) -> str:
    old, new = (", ".join(f"{name} {values[name]}" for name in changed) for values in (was_set, now_set))
    return f"{trained_with} {old}; {user} uses {new}, so its outputs differ from the trained model's"


def local_layers_added(source: str, trained: dict, now: BertConfig) -> str | None:
    """The line of attention_change for weights trained elsewhere (an HF folder, a from-hf checkpoint),
    whose attention variant says nothing: local layers added to a model trained with every layer global
    (one with local layers keeps its global period: config.refuse_contradictions)."""
    was_set = {name: trained.get(name, getattr(BertConfig, name)) for name in local_fields()}
    if was_set["local_attention_window"] is not None or not now.has_local_layers:
        return None
    return _fields_change(f"{source} was trained with every layer global, at", local_fields(), was_set, vars(now),
                          "this run")


def check_same_optimizer(stored: dict, ds_config: dict, folder: str) -> None:
    """The optimizer state restores into an optimizer of the same kind only (another kind's state is
    keyed by other names: e.g. SGD reading Adam's state stops with a KeyError in its first step).
    Adam and AdamW keep the same state, but not the same weight-decay rule (decoupled_decay): which rule
    a resume would use depended on the direction of the change (torch's restored param groups keep
    AdamW's flag, not Adam's) and on the device (FusedAdam keeps it outside them), so a change is refused."""
    optimizers = [((config or {}).get("optimizer") or {}) for config in (stored.get("ds_config"), ds_config)]
    trained, current = (optimizer.get("type") for optimizer in optimizers)
    if trained and current and len({{"adamw": "adam"}.get(name.lower(), name.lower())
                                    for name in (trained, current)}) > 1:
        raise ConfigError(f"checkpoint {folder} holds the state of optimizer.type {trained}, this run's is {current}",
                          f"resume with optimizer.type {trained}, or {NEW_RUN_FIX} with a fresh optimizer")
    then, now = map(decoupled_decay, optimizers)
    if None not in (then, now) and then != now:
        rule = {True: "AdamW's decoupled weight decay", False: "Adam's L2 weight decay (adam_w_mode false)"}
        keep = 'optimizer.type AdamW (or Adam without "adam_w_mode": false)' if then else \
            'optimizer.type Adam with "adam_w_mode": false in optimizer.params'
        raise ConfigError(f"checkpoint {folder} was trained with {rule[then]}, this run's optimizer uses {rule[now]}",
                          f"resume with {keep}, or {NEW_RUN_FIX} with a fresh optimizer")


def refuse_clipped_into_unnormed(stored: dict, ds_config: dict, folder: str) -> None:
    """DeepSpeed's ZeRO 1/2 load stops with a ValueError (a traceback) on a checkpoint trained with gradient
    clipping when this run sets zero_optimization.compute_grad_norm false (its speed-up of a run without
    clipping). A checkpoint this run writes records its own clipping, 0, and loads so."""
    clipping = (stored.get("ds_config") or {}).get("gradient_clipping", 1.0)  # DeepSpeed's default 1.0
    if clipping and (ds_config.get("zero_optimization") or {}).get("compute_grad_norm") is False:
        raise ConfigError(f"checkpoint {folder} was trained with gradient_clipping {clipping}, and DeepSpeed's ZeRO "
                          "optimizer cannot load it with zero_optimization.compute_grad_norm false",
                          "drop compute_grad_norm false for this resume (its checkpoints, without clipping, then "
                          "load with it)")


def decoupled_decay(optimizer: dict) -> bool | None:
    """Whether an optimizer section decays weights AdamW's way: DeepSpeed builds AdamW for type AdamW, and for
    Adam unless its params' adam_w_mode is false; None for another type (or none given)."""
    name = str(optimizer.get("type") or "").lower()
    if name not in ("adam", "adamw"):
        return None
    return name == "adamw" or (optimizer.get("params") or {}).get("adam_w_mode", True) is not False


def decays_norms_and_biases(stored: dict) -> bool:
    """Whether a checkpoint's optimizer decays biases and norm weights too (TrainConfig.decay_norms_and_biases,
    `stored`: its config): a config written before the field is of a run whose one group decayed every parameter."""
    return stored.get("decay_norms_and_biases", True)


def check_same_grouping(stored: dict, config, folder: str) -> None:
    """The optimizer's parameter groups must be the checkpoint's: its state restores group for group (DeepSpeed's
    files, the layout-free files' settings). The trainer builds a resume's engine with the checkpoint's grouping
    (starting_weights.model_flags); an engine built otherwise would mix a group's state into another's."""
    then = decays_norms_and_biases(stored)
    if then != config.decay_norms_and_biases:
        raise ConfigError(f"checkpoint {folder} was trained with decay_norms_and_biases {then} (weight decay on "
                          f"biases and norm weights), this run's config has {config.decay_norms_and_biases}",
                          f"build the config with decay_norms_and_biases {then}, the checkpoint's (a resume through "
                          f"pretrain_bert.py takes it), or {NEW_RUN_FIX} with a fresh optimizer")

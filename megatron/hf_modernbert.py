"""Hugging Face ModernBERT <-> BertModel: the second adapter beside hf_convert's BERT one. One name
map used in both directions, the shape transforms, the config in both schemas of transformers; the
folder, safetensors and config-file plumbing is hf_io's, the choice of adapter hf_convert's (ADAPTER).

The layouts (transformers' modeling_modernbert against bert.py):
  - the fused Wqkv's output rows are [3][heads][head_dim] (all queries, then all keys, then all
    values), as our query_key_value viewed as (3, heads, head_dim): the same matrix, no reordering
    (a [heads][3][head_dim] reading, Megatron-LM's own, would scramble the heads);
  - GeGLU's Wi is [input half; gate half], the activation on the first (`input, gate =
    Wi(x).chunk(2)`), as our dense_h_to_4h: the same matrix (hidden_activation silu: SwiGLU);
  - layer 0 has no attention norm (Identity, no tensor), the others do; the embedding norm, the
    final norm and the head (dense -> act -> norm) are ours; every linear and norm has a bias or
    none (attention_bias = mlp_bias = norm_bias = classifier_bias: our add_bias_linear);
  - the decoder is tied to the token embeddings (transformers stores no decoder.weight) and has a
    bias (decoder_bias; a folder without one reads as a zero bias); no position, token-type or
    pooler weights: rope, no token types, no sentence-order head;
  - the vocab is ModernBERT's 50368 (a multiple of 64: make_vocab_size_divisible_by 64 gives our
    decoder exactly its rows); other sizes are padded and trimmed as BERT's are (hf_io);
  - local_attention is the full window (128: 64 keys each side), as our local_attention_window;
    layer i is global when i % global_attn_every_n_layers == 0, as our global_attention_every.

transformers has written two config schemas: up to 4.x `global_attn_every_n_layers`,
`global_rope_theta`, `local_rope_theta` (null: the global theta) and `local_attention`; 5.x
`layer_types` (one per layer) and `rope_parameters` (per layer type). Both are read (the newer
first, as transformers does); both are written, consistent, for either reader (the tests load the
export and a 4.x-schema folder in the installed 5.x). Dropout sits elsewhere in ModernBERT (after the
embedding norm, inside the MLP): the rates are carried, the placement is ours.
"""
import dataclasses
import json
import warnings
from types import SimpleNamespace

import torch
from tokenizers import decoders

from megatron import hf_io
from megatron.data.tokenizer import SPECIAL_TOKENS, sample_template, wordpiece
from megatron.errors import ConfigError, DataError
from megatron.hf_forms import ACTIVATIONS, SHAPE, check_modernbert_exportable as check_exportable, is_modern
from megatron.model.bert import BertConfig

MODEL_TYPE = "modernbert"
ARCHITECTURE = "ModernBertForMaskedLM"  # what to-hf writes; ModernBertModel and fine-tuned folders are read too
BASE_PREFIX = "model."  # ModernBertForMaskedLM's base model; a ModernBertModel folder's names lack it
BASE_NAMES = ("embeddings.", "layers.", "final_norm.")
TIED = {"decoder.weight": "model.embeddings.tok_embeddings.weight"}  # transformers stores the second only
LAYER_TYPES = ("full_attention", "sliding_attention")  # global, local
DEFAULTS = dict(global_attn_every_n_layers=3, local_attention=128, global_rope_theta=160000.0,
                local_rope_theta=10000.0)  # transformers' defaults for keys a config.json leaves out
# the fields that shape the tensors or the math, which a folder fixes: a run may restate them, not change
# them (rope thetas, the window and the global period may change: a longer context wants a new theta)
STRUCTURE = ("vocab_size", "hidden_size", "num_layers", "num_attention_heads", "ffn_hidden_size", "type_vocab_size",
             "layernorm_epsilon", "layernorm_layout", "embedding_layernorm", "position_embedding_type", "mlp_type",
             "add_bias_linear", "normalization", "first_layer_attention_norm")
LM_HEAD = "lm_head."  # the group a ModernBertModel folder lacks as a whole (head.* and decoder.bias)


def name_map(config: BertConfig) -> list[tuple[str, str]]:
    """(BertModel name, ModernBertForMaskedLM name), read left to right on export and right to left
    on import. One to one: the fused qkv and the gated MLP's halves have the same layout on both sides."""
    modules = [("embeddings.word_embeddings", "model.embeddings.tok_embeddings"),
               ("embeddings.layernorm", "model.embeddings.norm")]
    for i in range(config.num_layers):
        ours, hf = f"layers.{i}.", f"model.layers.{i}."
        norm = [(ours + "attention_layernorm", hf + "attn_norm")] if i else []  # layer 0: none
        modules += [*norm, (ours + "attention.query_key_value", hf + "attn.Wqkv"),
                    (ours + "attention.dense", hf + "attn.Wo"), (ours + "mlp_layernorm", hf + "mlp_norm"),
                    (ours + "mlp.dense_h_to_4h", hf + "mlp.Wi"), (ours + "mlp.dense_4h_to_h", hf + "mlp.Wo")]
    modules += [("final_layernorm", "model.final_norm"), ("lm_head.dense", "head.dense"),
                ("lm_head.layernorm", "head.norm")]
    kinds = ("weight", "bias") if config.add_bias_linear else ("weight",)
    pairs = [(f"{ours}.{kind}", f"{hf}.{kind}") for ours, hf in modules
             for kind in (("weight",) if ours == "embeddings.word_embeddings" else kinds)]
    return pairs + [("lm_head.bias", "decoder.bias")]


# ---------------------------------------------------------------- the shape transforms, both ways

def to_hf_tensor(ours: str, tensor: torch.Tensor, config: BertConfig) -> torch.Tensor:
    """Our tensor `ours` as ModernBERT stores it: the padded vocab rows trimmed (Wqkv and Wi: as they are)."""
    return tensor[:config.vocab_size] if ours in hf_io.PADDED else tensor


# ---------------------------------------------------------------- ours -> HF

def hf_state_from_bert(state: dict, config: BertConfig) -> dict:
    """BertModel state dict -> ModernBertForMaskedLM tensors as transformers stores them (no
    decoder.weight: tied). A sentence-order head has no counterpart: left out, with one warning."""
    check_exportable(config)
    pairs = name_map(config)
    mapped = {ours for ours, _ in pairs}
    dropped = sorted(name for name in state if name.startswith("binary_head."))
    unmapped = sorted(set(state) - mapped - set(dropped))
    if unmapped:
        raise ConfigError(f"tensors {', '.join(unmapped)} have no Hugging Face ModernBERT counterpart",
                          "export a model with dense-equivalent attention (linformer projections cannot be exported)")
    if dropped:
        warnings.warn(f"not exported (ModernBERT has no sentence-order head): {', '.join(dropped)}", stacklevel=2)
    return {hf: to_hf_tensor(ours, state[ours], config).contiguous() for ours, hf in pairs}


def hf_config_from_bert(config: BertConfig, special_ids: dict) -> dict:
    """ModernBertConfig's config.json, in both schemas (`special_ids`: pad/cls/sep token id or None)."""
    window = config.local_attention_window or DEFAULTS["local_attention"]  # unread when every layer is global
    every = config.global_attention_every if config.local_attention_window else 1
    thetas = {"full_attention": config.rotary_base, "sliding_attention": config.local_rotary_base}
    cls_id, sep_id = special_ids.get("cls"), special_ids.get("sep")
    bias = config.add_bias_linear
    return {"architectures": [ARCHITECTURE], "model_type": MODEL_TYPE, "vocab_size": config.vocab_size,
            "hidden_size": config.hidden_size, "intermediate_size": config.ffn_hidden_size,
            "num_hidden_layers": config.num_layers, "num_attention_heads": config.num_attention_heads,
            "hidden_activation": {"geglu": "gelu", "swiglu": "silu"}[config.mlp_type],
            "classifier_activation": "gelu", "max_position_embeddings": hf_io.hf_positions(config),
            "norm_eps": config.layernorm_epsilon, "initializer_range": config.init_method_std,
            "attention_bias": bias, "mlp_bias": bias, "norm_bias": bias, "classifier_bias": bias, "decoder_bias": True,
            "attention_dropout": config.attention_dropout, "embedding_dropout": config.hidden_dropout,
            "mlp_dropout": config.hidden_dropout, "local_attention": window,
            "layer_types": [LAYER_TYPES[config.is_local_layer(i)] for i in range(config.num_layers)],
            "rope_parameters": {kind: {"rope_type": "default", "rope_theta": theta} for kind, theta in thetas.items()},
            "global_attn_every_n_layers": every, "global_rope_theta": config.rotary_base,
            "local_rope_theta": config.local_rotary_base, "pad_token_id": special_ids["pad"], "cls_token_id": cls_id,
            "sep_token_id": sep_id, "bos_token_id": cls_id, "eos_token_id": sep_id, "tie_word_embeddings": True}


def wordpiece_tokenizer_json(vocab: list, lower_case: bool) -> dict:
    """tokenizer.json of the BERT WordPiece tokenizer over `vocab` (as megatron/data/tokenizer.py
    tokenizes, plus [CLS] A [SEP] B [SEP] around the text): transformers 5 loads a ModernBERT folder's
    tokenizer from this file only (its vocab.txt is kept for BertTokenizer and for this trainer)."""
    tokenizer = wordpiece({token: index for index, token in enumerate(vocab)}, lower_case)
    tokenizer.decoder = decoders.WordPiece()
    special = [token for token in SPECIAL_TOKENS if token in vocab]
    tokenizer.add_special_tokens(special)
    settings = json.loads(tokenizer.to_str())
    if "[CLS]" in special and "[SEP]" in special:
        settings["post_processor"] = sample_template(*((token, vocab.index(token)) for token in ("[CLS]", "[SEP]")))
    return settings


def hf_files(state: dict, config: BertConfig, vocab: list, lower_case: bool) -> tuple[dict, dict]:
    """(tensors, {file name: JSON}) of the export; `vocab`: the tokens of the vocab.txt it carries."""
    special_ids = {kind: vocab.index(token) if token in vocab else None
                   for kind, token in (("pad", "[PAD]"), ("cls", "[CLS]"), ("sep", "[SEP]"))}
    named = {f"{token[1:-1].lower()}_token": token for token in SPECIAL_TOKENS if token in vocab}
    return hf_state_from_bert(state, config), {
        "config.json": hf_config_from_bert(config, special_ids),
        "tokenizer_config.json": {**hf_io.tokenizer_config(config, lower_case), **named},
        "tokenizer.json": wordpiece_tokenizer_json(vocab, lower_case)}


def hf_tokenizer_model(state: dict, config: BertConfig, tokenizer) -> tuple[dict, dict]:
    """(tensors, config.json) of the export of a model trained with an HFTokenizer: its special ids."""
    special_ids = {"pad": tokenizer.pad, "cls": tokenizer.cls, "sep": tokenizer.sep}
    return hf_state_from_bert(state, config), hf_config_from_bert(config, special_ids)


# ---------------------------------------------------------------- HF -> ours

def _number(hf_config: dict, key: str, default=None, integer: bool = False, minimum: float = 0, strict=False):
    value = hf_config.get(key, default)
    if value is None and default is None:
        raise DataError(f"{key} is missing from the Hugging Face config.json",
                        "copy or download the model folder again")
    ok = isinstance(value, int if integer else (int, float)) and not isinstance(value, bool)
    if not ok or value < minimum or (strict and value == minimum):
        what = f"{'an integer' if integer else 'a number'} {'>' if strict else '>='} {minimum}"
        raise DataError(f"{key} = {value!r} in the Hugging Face config.json is not {what}",
                        "fix config.json in the model folder (or download it again)")
    return value


def _flag(hf_config: dict, key: str, default: bool) -> bool:
    value = hf_config.get(key, default)
    if not isinstance(value, bool):
        raise DataError(f"{key} = {value!r} in the Hugging Face config.json is not true or false",
                        "fix config.json in the model folder (or download it again)")
    return value


def layer_rule(layer_types, num_layers: int) -> int:
    """global_attention_every N from transformers' per-layer list: the smallest N with layer i global
    exactly when i % N == 0 (1: every layer global); a list no N gives is refused."""
    if (not isinstance(layer_types, list) or len(layer_types) != num_layers
            or any(kind not in LAYER_TYPES for kind in layer_types)):
        raise DataError(f"layer_types {layer_types!r} in the Hugging Face config.json is not a list of "
                        f"{num_layers} entries 'full_attention' / 'sliding_attention'",
                        "fix config.json in the model folder (or download it again)")
    is_global = [kind == "full_attention" for kind in layer_types]
    for every in range(1, num_layers + 1):
        if is_global == [i % every == 0 for i in range(num_layers)]:
            return every
    raise ConfigError(f"layer_types {layer_types} has no global layer every N (this model's layer i is global when "
                      "i % N == 0)", "convert a ModernBERT whose global layers are 0, N, 2N, ...")


def rope_thetas(hf_config: dict) -> tuple[float, float]:
    """(global, local) rope theta: 5.x's rope_parameters (per layer type, or one for both), else 4.x's
    global_rope_theta / local_rope_theta (a null local theta: the global one, as 4.x reads it)."""
    if hf_config.get("rope_scaling") is not None:
        raise ConfigError(f"rope_scaling {hf_config['rope_scaling']} is set in the Hugging Face config.json "
                          "(only plain rope is reproduced)", "convert a ModernBERT with default rope")
    global_theta = _number(hf_config, "global_rope_theta", DEFAULTS["global_rope_theta"], minimum=1, strict=True)
    local_theta = (global_theta if "local_rope_theta" in hf_config and hf_config["local_rope_theta"] is None
                   else _number(hf_config, "local_rope_theta", DEFAULTS["local_rope_theta"], minimum=1, strict=True))
    parameters = hf_config.get("rope_parameters")
    if parameters is None:
        return global_theta, local_theta
    if not isinstance(parameters, dict):
        raise DataError(f"rope_parameters {parameters!r} in the Hugging Face config.json is not an object",
                        "fix config.json in the model folder (or download it again)")
    per_type = set(parameters) <= set(LAYER_TYPES)
    thetas = []
    for kind, fallback in zip(LAYER_TYPES, (global_theta, local_theta)):
        entry = (parameters.get(kind) or {}) if per_type else parameters
        if entry.get("rope_type", "default") != "default":
            raise ConfigError(f"rope_parameters {kind} rope_type '{entry['rope_type']}' in the Hugging Face "
                              "config.json (only plain rope is reproduced)", "convert a ModernBERT with default rope")
        thetas.append(_number(entry, "rope_theta", fallback, minimum=1, strict=True) if "rope_theta" in entry
                      else fallback)
    return thetas[0], thetas[1]


def fields_from_hf(hf_config: dict) -> dict:
    """BertConfig fields of the model a ModernBERT config.json describes (either schema); refuses math
    we do not reproduce (another activation, mixed biases, scaled rope, untied decoder); the MLM head's
    options only where that head is read (hf_io.reads_mlm_head)."""
    layers = _number(hf_config, "num_hidden_layers", integer=True, minimum=1)
    sizes = {"vocab_size": _number(hf_config, "vocab_size", integer=True, minimum=1),
             "hidden_size": _number(hf_config, "hidden_size", integer=True, minimum=1), "num_layers": layers,
             "num_attention_heads": _number(hf_config, "num_attention_heads", integer=True, minimum=1),
             "ffn_hidden_size": _number(hf_config, "intermediate_size", integer=True, minimum=1),
             "max_position_embeddings": _number(hf_config, "max_position_embeddings", 8192, integer=True, minimum=1),
             "layernorm_epsilon": _number(hf_config, "norm_eps", 1e-5, strict=True),
             "init_method_std": _number(hf_config, "initializer_range", 0.02, strict=True),
             "attention_dropout": _number(hf_config, "attention_dropout", 0.0),
             "hidden_dropout": max(_number(hf_config, "embedding_dropout", 0.0),
                                   _number(hf_config, "mlp_dropout", 0.0))}
    hf_io.refuse_untied_decoder(hf_config)
    # classifier_*: options of the MLM head (head.dense, head.act); a dropped or absent head sets nothing read
    head = hf_io.reads_mlm_head(hf_config)
    for key, supported in [("hidden_activation", tuple(ACTIVATIONS)), *[("classifier_activation", ("gelu",))] * head]:
        if hf_config.get(key, "gelu") not in supported:
            raise ConfigError(f"Hugging Face {key} '{hf_config[key]}' is not reproduced here",
                              f"convert a model with {key} {' or '.join(supported)}")
    biases = {key: _flag(hf_config, key, False)
              for key in ("attention_bias", "mlp_bias", "norm_bias", *["classifier_bias"] * head)}
    if len(set(biases.values())) > 1:
        raise ConfigError(f"Hugging Face {', '.join(f'{k} {v}' for k, v in biases.items())}: this model has biases "
                          "everywhere or nowhere (add_bias_linear)", "convert a model whose biases are all on or off")
    window = _number(hf_config, "local_attention", DEFAULTS["local_attention"], integer=True, minimum=2)
    every = _number(hf_config, "global_attn_every_n_layers", DEFAULTS["global_attn_every_n_layers"], integer=True,
                    minimum=1)
    every = layer_rule(hf_config["layer_types"], layers) if hf_config.get("layer_types") is not None else every
    global_theta, local_theta = rope_thetas(hf_config)
    return {**sizes, **SHAPE, "mlp_type": ACTIVATIONS[hf_config.get("hidden_activation", "gelu")],
            "add_bias_linear": next(iter(biases.values())), "rotary_base": float(global_theta),
            "local_rotary_base": float(local_theta),
            "local_attention_window": window - window % 2,  # 4.x and 5.x see local_attention // 2 keys each side
            "global_attention_every": every, "add_binary_head": False, "make_vocab_size_divisible_by": 64}


def read_hf_tensors(folder) -> dict:
    """The folder's tensors in ModernBertForMaskedLM's names (a ModernBertModel's gain `model.`)."""
    return {BASE_PREFIX + name if name.startswith(BASE_NAMES) else name: tensor
            for name, tensor in hf_io.read_hf_weights(folder).items()}


def bert_state_from_hf(tensors: dict, config: BertConfig, decoder_bias: bool = True) -> tuple[dict, list]:
    """ModernBERT tensors -> (BertModel state for `config` without the tensors the folder lacks, their
    names). A folder whose config has no decoder bias gets a zero one (the same logits); the vocab is
    padded to padded_vocab_size with zero embeddings and a decoder bias of PADDED_VOCAB_BIAS (no
    probability), as for BERT (hf_io.state_from_hf)."""
    if not decoder_bias and "decoder.bias" not in tensors and "head.dense.weight" in tensors:
        tensors = {**tensors, "decoder.bias": torch.zeros(config.vocab_size)}
    return hf_io.state_from_hf(tensors, config, [(ours, (hf,)) for ours, hf in name_map(config)], TIED)


def load_state(tensors: dict, hf_config: dict, folder, config: BertConfig,
               extend_positions: bool = True) -> tuple[dict, list]:
    """(a full BertModel state dict for `config` from the tensors of a ModernBertForMaskedLM or
    ModernBertModel folder, or a fine-tuned one (ModernBertForSequenceClassification, ...: read as a
    ModernBertModel), the BertModel names initialised): the adapter's load_state, after hf_convert's
    load_hf_weights read and checked them (`extend_positions`: unused, rope has no position table).

    A head the folder lacks as a whole (a ModernBertModel has no MLM head; no ModernBERT has a
    sentence-order head) comes from BertModel(config)'s init under the current RNG, listed in one
    warning line (which names a task head dropped); any other missing tensor (a layer's, an
    embedding, part of the head) is one DataError line naming them.
    """
    task = task_architecture(hf_config)
    dropped = sorted(name for name in tensors if not name.startswith(BASE_PREFIX)) if task else []
    state, missing = bert_state_from_hf({name: t for name, t in tensors.items() if name not in dropped}, config,
                                        _flag(hf_config, "decoder_bias", True))
    hf_names = dict(name_map(config))
    lm_head = [name for name in hf_names if name.startswith(LM_HEAD)]
    # initialised: what ModernBERT has no counterpart for (a sentence-order head, linformer projections),
    # and the MLM head when the folder has none of it
    fresh = [name for name in missing if name not in hf_names or (set(lm_head) <= set(missing) and name in lm_head)]
    note = f"a {task} folder: its task head is dropped (not a masked-LM head): {', '.join(dropped)}; " if task else ""
    return hf_io.completed(state, missing, [hf_names[name] for name in missing if name not in fresh], folder,
                           config, note)


def task_architecture(hf_config: dict) -> str | None:
    """The fine-tuned architecture (ModernBertForSequenceClassification, ...) a folder's config names, or
    None for ModernBertForMaskedLM / ModernBertModel (or none named). Its head.* is the task's own
    (pooled output -> classifier), never trained to feed the tied decoder: a run that goes on
    pretraining starts the MLM head fresh, as from a ModernBertModel, rather than half a classifier."""
    names = hf_config.get("architectures") or []
    tasks = [name for name in names if isinstance(name, str) and name not in (ARCHITECTURE, "ModernBertModel")]
    return tasks[0] if tasks else None


# ---------------------------------------------------------------- a run's start

def carried_fields(fields: dict) -> dict:
    """The fields of a modern model a run starts from (a ModernBERT folder's, or a weights-only
    checkpoint's config) that the trainer takes where its flags leave them out, beyond the shapes it
    takes for any model: the layer rule (rope thetas, the window, the global period; only those the
    model reads, the others would be refused as unused), the vocab padding and whether it has a
    sentence-order head. {} for a classic BERT. (Read from the dict: the fields alone need not make
    a valid BertConfig, e.g. an HF folder's without the run's seq_length.)"""
    return layer_rule_fields(fields) if is_modern(_model_of(fields)) else {}


def _model_of(fields: dict) -> SimpleNamespace:
    """`fields` over BertConfig's defaults, readable as a BertConfig (without its checks)."""
    return SimpleNamespace(**{field.name: fields.get(field.name, field.default)
                              for field in dataclasses.fields(BertConfig)})


def layer_rule_fields(fields: dict) -> dict:
    """carried_fields of any model, a classic BERT's too: what a resume takes from its checkpoint beyond
    the shapes (a classic BERT's are the defaults, unless it was trained with local layers or the like)."""
    model = _model_of(fields)
    carried = {"add_binary_head": model.add_binary_head,
               "make_vocab_size_divisible_by": model.make_vocab_size_divisible_by}
    rope = model.position_embedding_type == "rope"
    if rope:
        carried["rotary_base"] = model.rotary_base
    if model.local_attention_window is not None and any(BertConfig.is_local_layer(model, i)
                                                        for i in range(model.num_layers)):
        carried.update(local_attention_window=model.local_attention_window,
                       global_attention_every=model.global_attention_every)
        if rope:
            carried["local_rotary_base"] = model.local_rotary_base
    return carried


ADAPTER = hf_io.Adapter(fields_from_hf=fields_from_hf, structure=STRUCTURE, read_hf_tensors=read_hf_tensors,
                        load_state=load_state, hf_files=hf_files, hf_tokenizer_model=hf_tokenizer_model)

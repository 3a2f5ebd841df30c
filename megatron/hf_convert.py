"""Hugging Face BERT <-> BertModel: one name map used in both directions, configs, files.

Layouts: our post-LayerNorm model is HF `Bert*` (with the embedding LayerNorm), our pre-LayerNorm
model is HF `MegatronBert*` (no embedding LayerNorm, a final LayerNorm). HF keeps q, k and v in
three Linears; ours fuses them into `query_key_value`, whose output rows are [q; k; v] (each
[heads, d]), so the fusion is a row concatenation. Our vocab is padded to
`make_vocab_size_divisible_by`: padded rows are trimmed on export and re-added on import as zero
embeddings with an LM-head bias of PADDED_VOCAB_BIAS, so they take no probability and the MLM
loss equals HF's. Position tables shorter than `max_position_embeddings` are extended by
repeating the learned rows (Longformer's recipe) unless refused.

The entry points (save_hf_folder, bert_fields_from_hf, load_hf_weights) choose the adapter, this
module's BERT one or hf_modernbert's, through ADAPTERS: by a folder's model_type, or by a model's
layer options (ModernBERT: any modern one). The folder, safetensors and config-file plumbing both
adapters use is hf_io's.
"""
import dataclasses
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import torch
from tokenizers import Tokenizer

from megatron import hf_io, hf_modernbert
from megatron.checkpoint import LATEST, RUN_STATE, run_state, tag_for
from megatron.config import TrainConfig
from megatron.data.tokenizer import (BertWordPiece, HFTokenizer, check_fits, frames_as_samples, read_vocab,
                                     sample_template)
from megatron.data.tokenizer_identity import carry
from megatron.errors import ConfigError, DataError, GitLfsPointer
from megatron.hf_forms import CLASSIC_LAYER, LAYOUTS, check_bert_exportable as check_exportable, is_modern
from megatron.hf_io import (PADDED, Adapter, completed, created_folder, hf_positions, pad_vocab_rows,
                            read_hf_config, read_hf_weights, refuse_other_model_type, refuse_untied_decoder,
                            state_from_hf, tokenizer_config, torch_save, undone_on_failure, write_json,
                            write_safetensors)
from megatron.model.bert import BertConfig

MODEL_TYPES = {model_type: layout for layout, (model_type, *_) in LAYOUTS.items()}
# HF tensors with nothing to convert: a buffer, and the LM decoder tied to tensors we convert
TIED = {"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias"}
BUFFERS = {"bert.embeddings.position_ids"}
# BertConfig field <- HF config key, for the fields that fix the tensors' shapes and the math
HF_CONFIG_KEYS = {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_layers": "num_hidden_layers",
                  "num_attention_heads": "num_attention_heads", "ffn_hidden_size": "intermediate_size",
                  "type_vocab_size": "type_vocab_size", "layernorm_epsilon": "layer_norm_eps"}
HF_OTHER_KEYS = {"max_position_embeddings": "max_position_embeddings", "hidden_dropout": "hidden_dropout_prob",
                 "attention_dropout": "attention_probs_dropout_prob", "init_method_std": "initializer_range"}
STRUCTURE = (*HF_CONFIG_KEYS, "layernorm_layout", "embedding_layernorm")  # check_compatible's fields
_BERT_DEFAULTS = {"vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                  "intermediate_size": 3072, "max_position_embeddings": 512, "type_vocab_size": 2,
                  "layer_norm_eps": 1e-12, "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
                  "initializer_range": 0.02}
HF_DEFAULTS = {"bert": _BERT_DEFAULTS, "megatron-bert": {**_BERT_DEFAULTS, "vocab_size": 29056, "hidden_size": 1024,
                                                         "num_hidden_layers": 24, "num_attention_heads": 16,
                                                         "intermediate_size": 4096}}
# transformers' value of a key a config.json leaves out (its BertConfig / MegatronBertConfig defaults): what
# transformers builds from the folder, not this trainer's defaults (layernorm_epsilon 1e-5)
DECODER_KEYS = ("is_decoder", "add_cross_attention")  # a causal BERT (BertLMHeadModel), with cross-attention


def name_map(config: BertConfig) -> list[tuple[str, tuple[str, ...]]]:
    """(BertModel name, HF names in a *ForPreTraining model): the one map, read left to right on
    export and right to left on import. Three HF names (query, key, value) fuse into one of ours."""
    pre = config.layernorm_layout == "pre"
    pairs = [(f"embeddings.{table}.weight", f"bert.embeddings.{table}.weight")
             for table in ("word_embeddings", "position_embeddings", "token_type_embeddings")]
    modules = [("embeddings.layernorm", "bert.embeddings.LayerNorm")] if config.embedding_layernorm else []
    for i in range(config.num_layers):
        ours, hf = f"layers.{i}.", f"bert.encoder.layer.{i}."
        modules += [(ours + "attention.dense", hf + "attention.output.dense"),
                    (ours + "attention_layernorm", hf + ("attention.ln" if pre else "attention.output.LayerNorm")),
                    (ours + "mlp.dense_h_to_4h", hf + "intermediate.dense"),
                    (ours + "mlp.dense_4h_to_h", hf + "output.dense"),
                    (ours + "mlp_layernorm", hf + ("ln" if pre else "output.LayerNorm"))]
        pairs += [(f"{ours}attention.query_key_value.{kind}",
                   tuple(f"{hf}attention.self.{part}.{kind}" for part in ("query", "key", "value")))
                  for kind in ("weight", "bias")]
    if pre:
        modules.append(("final_layernorm", "bert.encoder.ln"))
    modules += [("lm_head.dense", "cls.predictions.transform.dense"),
                ("lm_head.layernorm", "cls.predictions.transform.LayerNorm")]
    if config.add_binary_head:
        modules += [("binary_head.pooler", "bert.pooler.dense"), ("binary_head.classifier", "cls.seq_relationship")]
    pairs += [(f"{ours}.{kind}", f"{hf}.{kind}") for ours, hf in modules for kind in ("weight", "bias")]
    pairs.append(("lm_head.bias", "cls.predictions.bias"))
    return [(ours, (hf,) if isinstance(hf, str) else hf) for ours, hf in pairs]


# ---------------------------------------------------------------- ours -> HF

def hf_state_from_bert(state: dict, config: BertConfig) -> dict:
    """BertModel state dict -> HF *ForPreTraining (or *ForMaskedLM) tensors, padded vocab trimmed."""
    check_exportable(config)
    pairs = name_map(config)
    unmapped = sorted(set(state) - {ours for ours, _ in pairs})
    if unmapped:
        raise ConfigError(f"tensors {', '.join(unmapped)} have no Hugging Face counterpart",
                          "export a model with dense-equivalent attention (linformer projections cannot be exported)")
    hf = {}
    for ours, hf_names in pairs:
        tensor = state[ours]
        if ours in PADDED:
            tensor = tensor[:config.vocab_size]
        for name, part in zip(hf_names, tensor.chunk(len(hf_names))):
            hf[name] = part.contiguous()
    return hf


def hf_config_from_bert(config: BertConfig, pad_token_id: int) -> dict:
    model_type, with_sop, without_sop = LAYOUTS[config.layernorm_layout]
    values = {hf_key: getattr(config, field) for field, hf_key in {**HF_CONFIG_KEYS, **HF_OTHER_KEYS}.items()}
    return {"architectures": [with_sop if config.add_binary_head else without_sop], "model_type": model_type,
            **values, "hidden_act": "gelu", "position_embedding_type": "absolute", "pad_token_id": pad_token_id,
            "tie_word_embeddings": True}


def bert_hf_files(state: dict, config: BertConfig, vocab: list, lower_case: bool) -> tuple[dict, dict]:
    """The BERT adapter's hf_files: config.json and tokenizer_config.json."""
    return hf_state_from_bert(state, config), {"config.json": hf_config_from_bert(config, vocab.index("[PAD]")),
                                               "tokenizer_config.json": tokenizer_config(config, lower_case)}


def bert_hf_tokenizer_model(state: dict, config: BertConfig, tokenizer) -> tuple[dict, dict]:
    """(tensors, config.json) of the export of a model trained with an HFTokenizer."""
    return hf_state_from_bert(state, config), hf_config_from_bert(config, tokenizer.pad)


def exporter(config: BertConfig) -> Adapter:
    """The adapter of the Hugging Face family of `config`: ModernBERT for any modern layer option, else BERT."""
    return ADAPTERS[hf_modernbert.MODEL_TYPE] if is_modern(config) else ADAPTERS["bert"]


def hf_files(state: dict, config: BertConfig, vocab: list, lower_case: bool) -> tuple[dict, dict]:
    """(tensors, {file name: JSON}: config.json and the tokenizer's) in the Hugging Face family of
    `config` (exporter); `vocab`: the tokens of the vocab.txt exported with them."""
    return exporter(config).hf_files(state, config, vocab, lower_case)


def hf_tokenizer_files(state: dict, config: BertConfig, tokenizer) -> tuple[dict, dict]:
    """hf_files for a model trained with a Hugging Face tokenizer (megatron.data.tokenizer.HFTokenizer):
    the special ids and names from the tokenizer, whose tokenizer.json AutoTokenizer then reads."""
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": hf_positions(config),
                **hf_special_tokens(tokenizer)}
    if not is_modern(config) and config.type_vocab_size:  # BERT's token types (ModernBERT has none, takes none)
        settings["model_input_names"] = ["input_ids", "token_type_ids", "attention_mask"]
    tensors, hf_config = exporter(config).hf_tokenizer_model(state, config, tokenizer)
    return tensors, {"config.json": hf_config, "tokenizer_config.json": settings}


def framed_tokenizer_json(tokenizer) -> tuple[dict, str] | None:
    """(the tokenizer.json to export, the note saying so) where an HFTokenizer's own post-processor frames text
    otherwise than the training samples were framed (none: a Unigram or BPE trained with `tokenizers`; RoBERTa's
    `<s> A </s></s> B </s>`, token types all 0): its settings with sample_template's post-processor instead,
    keeping offset trimming (ByteLevel parts, RobertaProcessing's trim_offsets). None where it frames them so."""
    cls, sep = ((tokenizer.special_tokens()[kind], tokenizer.ids[kind]) for kind in ("cls", "sep"))
    settings = json.loads(tokenizer.file_bytes)
    found = settings.get("post_processor") or {}
    if frames_as_samples(found, cls, sep):
        return None
    kept = [part for part in found.get("processors") or () if part.get("type") == "ByteLevel"]
    if found.get("type") == "RobertaProcessing" and found.get("trim_offsets"):
        kept = [{"type": "ByteLevel", "add_prefix_space": found.get("add_prefix_space", True), "trim_offsets": True,
                 "use_regex": True}]
    template = sample_template(cls, sep)
    settings["post_processor"] = {"type": "Sequence", "processors": [*kept, template]} if kept else template
    found_text = f"'s {found['type']} post-processor frames text otherwise" if found else " has no post-processor"
    return settings, (f"note: {tokenizer.file}{found_text}: the exported tokenizer.json frames it as the model was "
                      f"trained, {cls[0]} A {sep[0]} and {cls[0]} A {sep[0]} B {sep[0]} (token types 0, then 1 from B)")


def hf_special_tokens(tokenizer) -> dict:
    """The "<kind>_token" settings of an HFTokenizer's export: transformers takes a tokenizer.json's special
    tokens from tokenizer_config.json alone (an unk_token left out loads as None, where the trainer's model
    writes its unknown token), so each the trainer uses is named there, its unknown token included."""
    return {f"{kind}_token": token for kind, token in tokenizer.special_tokens().items()}


def save_hf_folder(output, state: dict, config: BertConfig, vocab_file=None, lower_case: bool = True,
                   hf_tokenizer=None) -> None:
    """Writes config.json, model.safetensors, vocab.txt and tokenizer_config.json (and tokenizer.json
    for ModernBERT, whose AutoTokenizer reads nothing else); with `hf_tokenizer` (vocab_file None)
    its tokenizer.json instead of the vocab.txt, framing text as the samples were (framed_tokenizer_json).
    Atomic: a temporary sibling folder renamed at the end, so a failure leaves nothing half-written, nor the
    folders made for it (undone_on_failure)."""
    output = Path(output)
    if output.exists():
        what = "a file" if Path(output).is_file() else "an existing folder"
        raise ConfigError(f"output {output} is {what}", "choose a new output folder (it is created) or remove it")
    framed = None  # (tokenizer.json, note) where a Hugging Face tokenizer's framing is replaced
    if hf_tokenizer is not None:
        check_fits(hf_tokenizer, config.vocab_size)
        tensors, files = hf_tokenizer_files(state, config, hf_tokenizer)
        framed = framed_tokenizer_json(hf_tokenizer)
        copied, texts = {} if framed else {"tokenizer.json": hf_tokenizer.file}, {}
        if framed:
            files["tokenizer.json"] = framed[0]
    else:
        vocab = list(read_vocab(vocab_file))  # as the tokenizer reads it: a byte-order mark is no part of [PAD]
        if len(vocab) > config.vocab_size:  # fewer: rows no token reaches (--vocab-size), as HF allows
            raise ConfigError(f"vocab file {vocab_file} has {len(vocab)} tokens, the model's vocab_size is "
                              f"{config.vocab_size}", "pass the vocab.txt the model was trained with")
        if "[PAD]" not in vocab:
            raise ConfigError(f"vocab file {vocab_file} has no [PAD] token", "pass a BERT vocab.txt")
        tensors, files = hf_files(state, config, vocab, lower_case)
        copied, texts = {}, {"vocab.txt": "".join(f"{token}\n" for token in vocab)}  # written as transformers reads
    with undone_on_failure(f"cannot write the Hugging Face folder {output}", "--output", output,
                           output.parent) as made:
        made.append(created_folder(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent)))
        partial = made[-1]
        for name, value in files.items():
            write_json(partial / name, value)
        write_safetensors(partial / "model.safetensors", tensors)
        for name, source in copied.items():
            shutil.copyfile(source, partial / name)
        for name, text in texts.items():
            (partial / name).write_text(text, encoding="utf-8")
        os.replace(partial, output)
    if framed:  # once written: an error stays the only line
        print(framed[1], flush=True)


# ---------------------------------------------------------------- HF -> ours

def adapter_of(hf_config: dict) -> Adapter:
    """The adapter of the model_type an HF config names; none, or another type, is refused."""
    model_type = hf_config.get("model_type")
    types = f"{', '.join(MODEL_TYPES)} or {hf_modernbert.MODEL_TYPE}"
    if model_type is None:
        raise DataError("config.json has no model_type", f"add the model's model_type ({types}) to config.json, or "
                        "download the model folder again")
    if model_type not in ADAPTERS:
        raise ConfigError(f"Hugging Face model_type '{model_type}' is not a BERT", f"convert a model of type {types}")
    return ADAPTERS[model_type]


def bert_fields_from_hf(hf_config: dict) -> dict:
    """BertConfig fields of the model an HF config describes (its adapter's); refuses math we do not reproduce."""
    return adapter_of(hf_config).fields_from_hf(hf_config)


def classic_fields_from_hf(hf_config: dict) -> dict:
    """The BERT adapter's fields_from_hf (a config of one of MODEL_TYPES)."""
    refuse_untied_decoder(hf_config)
    for key, supported in (("hidden_act", "gelu"), ("position_embedding_type", "absolute")):
        if hf_config.get(key, supported) != supported:
            raise ConfigError(f"Hugging Face {key} '{hf_config[key]}' differs from this model's '{supported}'",
                              f"convert a model with {key} '{supported}'")
    if key := next((key for key in DECODER_KEYS if hf_config.get(key)), None):
        raise ConfigError(f"the Hugging Face config.json sets {key} true: a decoder BERT (BertLMHeadModel) whose "
                          "tokens see only the tokens before them, which this trainer's bidirectional encoder does not "
                          "compute", "convert an encoder (BertForMaskedLM, BertForPreTraining, BertModel)")
    hf_config = {**HF_DEFAULTS[hf_config["model_type"]], **hf_config}
    fields = {field: hf_config[key] for field, key in {**HF_CONFIG_KEYS, **HF_OTHER_KEYS}.items() if key in hf_config}
    for field, value in fields.items():  # a string or a negative size would surface as a TypeError later
        integer = field not in ("layernorm_epsilon", "hidden_dropout", "attention_dropout", "init_method_std")
        positive = field in ("layernorm_epsilon", "init_method_std")
        number = isinstance(value, int if integer else (int, float)) and not isinstance(value, bool)
        if not number or value < 0 or (positive and value == 0):
            key = {**HF_CONFIG_KEYS, **HF_OTHER_KEYS}[field]
            what = "an integer >= 0" if integer else "a number > 0" if positive else "a number >= 0"
            raise DataError(f"{key} = {json.dumps(value)} in the Hugging Face config.json is not {what}",
                            "fix config.json in the model folder (or download it again)")
    layout = MODEL_TYPES[hf_config["model_type"]]
    # the layer options too (every layer global, learned positions, ...): a run from the folder refuses a
    # flag that contradicts them as it does a size (config.refuse_contradictions), not as a missing tensor
    return {**fields, **CLASSIC_LAYER, "layernorm_layout": layout, "embedding_layernorm": layout == "post"}


def without_refused_dropout(config: BertConfig, folder) -> BertConfig:
    """`config`, of the Hugging Face folder `folder`, with attention dropout 0 where its local layers
    refuse any (their tiles are recomputed exactly in backward), said in one warning line: a dropout
    rate shapes no weight, and --init-from-hf trains the folder without it alike."""
    if not (config.has_local_layers and config.attention_dropout):
        return config
    warnings.warn(f"{Path(folder) / 'config.json'} sets attention_dropout {config.attention_dropout}, which local "
                  "layers do not support (their tiles are recomputed exactly in backward): the checkpoint stores "
                  "attention_dropout 0 (dropout changes no weight)", stacklevel=2)
    return dataclasses.replace(config, attention_dropout=0.0)


def read_hf_tensors(folder) -> dict:
    """Tensors of an HF BERT folder renamed as in a *ForPreTraining model: `bert.` added to base-model
    names, and the old TF-era `gamma`/`beta` LayerNorm names read as `weight`/`bias`."""
    renamed = {}
    for name, tensor in read_hf_weights(folder).items():
        name = f"bert.{name}" if name.startswith(("embeddings.", "encoder.", "pooler.")) else name
        name = name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        renamed[name] = tensor
    return renamed


def bert_state_from_hf(tensors: dict, config: BertConfig, extend_positions: bool = True) -> tuple[dict, list]:
    """HF tensors -> (BertModel state for `config` without the tensors HF lacks, their names).

    Shapes are checked against the model `config` describes; a mismatch names the HF tensor; a position
    table shorter than max_position_embeddings is extended (positions_for) unless `extend_positions` is False.
    """
    def extended(ours: str, parts: list, hf_names: tuple) -> list:
        if ours != "embeddings.position_embeddings.weight":
            return parts
        return [positions_for(parts[0], config.max_position_embeddings, hf_names[0], extend_positions)]

    return state_from_hf(tensors, config, name_map(config), TIED, BUFFERS, extended)


def repadded_vocab(state: dict, config: BertConfig) -> dict:
    """Weights of a checkpoint padded to another multiple (--make-vocab-size-divisible-by) for a new run
    from them: the padding rows, which no token reaches, trimmed and added again as from a Hugging Face
    folder, so that the flag is taken as --init-from-hf takes it. Weights of the run's padding stay as they are."""
    return {name: pad_vocab_rows(name, tensor[:config.vocab_size], config.padded_vocab_size)
            if name in PADDED and len(tensor) != config.padded_vocab_size else tensor for name, tensor in state.items()}


def positions_for(table: torch.Tensor, rows: int, name: str, extend: bool) -> torch.Tensor:
    """The learned position table [n, h] for `rows` positions: repeated when n < rows
    (positions n..2n-1 start from the learned 0..n-1, as Longformer initialised its 4096)."""
    found = table.shape[0]
    if found == rows:
        return table
    if found > rows:
        raise ConfigError(f"{name} has {found} positions, max_position_embeddings is {rows}",
                          f"set --max-position-embeddings to at least {found}")
    if not extend:
        raise ConfigError(f"{name} has {found} positions, max_position_embeddings is {rows} and extension is refused",
                          f"set --max-position-embeddings {found}, or drop --no-position-extension (the table is then "
                          "extended by repeating the learned positions)")
    return table.repeat((rows + found - 1) // found, 1)[:rows]


INITIALISED = "initialised"  # run_state.json of a from-hf checkpoint: the tensors initialised at random


def untrained_warning(load_dir: str, tag: str, prefix: str = "") -> str | None:
    """The start of a warning naming the tensors (those whose names start with `prefix`) that a from-hf
    checkpoint initialised at random because its Hugging Face folder lacked them (e.g. the MLM head
    of a *Model folder); None for any other checkpoint."""
    names = [name for name in run_state(load_dir, tag).get(INITIALISED, []) if name.startswith(prefix)]
    if names:
        return (f"{load_dir} was converted from a Hugging Face folder without {', '.join(names)}: they are "
                "initialised at random, never trained")
    return None


# BertModel tensors an HF folder may lack as a whole, each group initialised: the heads a *Model or
# *ForMaskedLM folder has no use for (the MLM head, the pooler and the sentence-order classifier),
# and the parts HF has no counterpart for (linformer projections: `.attention.core.`)
HEAD_GROUPS = ("lm_head.", "binary_head.pooler.", "binary_head.classifier.")


def missing_encoder_tensors(missing: list, tensors: dict, config: BertConfig) -> list:
    """HF names, absent from `tensors`, of the tensors among `missing` (BertModel names) that no
    folder may lack: any of the embeddings, the layers (their linformer projections aside) and the
    final norm, and any tensor of a head the folder has in part (it holds a head whole or not at all)."""
    hf_names = dict(name_map(config))
    absent = set(missing)
    required = [name for name in missing if name in hf_names and not name.startswith(HEAD_GROUPS)]
    for group in HEAD_GROUPS:
        members = [name for name in hf_names if name.startswith(group)]
        if members and not set(members) <= absent:
            required += [name for name in members if name in absent]
    return [hf for name in sorted(required) for hf in hf_names[name] if hf not in tensors]


def load_hf_as_bert_state(folder, config: BertConfig, extend_positions: bool = True) -> dict:
    """A full BertModel state dict for `config` from an HF folder (the trainer's `--init-from-hf`):
    load_hf_weights' state."""
    return load_hf_weights(folder, config, extend_positions)[0]


def load_hf_weights(folder, config: BertConfig, extend_positions: bool = True) -> tuple[dict, list]:
    """(a full BertModel state dict for `config` from an HF folder, the BertModel names initialised).

    Heads a folder may lack as a whole (a BertModel folder has no MLM / SOP head; a *ForMaskedLM
    none for sentence order) and our linformer projections come from BertModel(config)'s init under
    the current RNG and are listed in one warning line. Any other tensor the folder lacks (an encoder
    layer's, an embedding, part of a head) is a DataError naming them: a damaged or truncated folder
    would otherwise train from a randomly initialised layer.
    """
    hf_config = read_hf_config(folder)
    adapter = adapter_of(hf_config)
    hf_io.check_compatible(adapter.fields_from_hf(hf_config), config, adapter.structure)
    tensors = adapter.read_hf_tensors(folder)
    refuse_other_model_type(folder, hf_config["model_type"], tensors)
    return adapter.load_state(tensors, hf_config, folder, config, extend_positions)


def load_bert_state(tensors: dict, hf_config: dict, folder, config: BertConfig,
                    extend_positions: bool) -> tuple[dict, list]:
    """The BERT adapter's load_state: load_hf_weights' result from the folder's tensors. A config.json without
    max_position_embeddings over a table of other than transformers' default rows is named: extended, the
    table would pass for one of a model trained at that default (transformers refuses such a folder)."""
    table, default = tensors.get("bert.embeddings.position_embeddings.weight"), HF_DEFAULTS[hf_config["model_type"]]
    if "max_position_embeddings" not in hf_config and table is not None and len(table) != (
            rows := default["max_position_embeddings"]):
        raise DataError(f"{Path(folder) / 'config.json'} has no max_position_embeddings (transformers reads {rows}), "
                        f"and bert.embeddings.position_embeddings.weight has {len(table)} rows",
                        f"set max_position_embeddings to {len(table)} in config.json")
    state, missing = bert_state_from_hf(tensors, config, extend_positions)
    return completed(state, missing, missing_encoder_tensors(missing, tensors, config), folder, config)


# ---------------------------------------------------------------- files

def read_hf_tokenizer(folder):
    """The tokenizer of a Hugging Face folder, for the checkpoint made from it to carry: its vocab.txt
    (WordPiece, lower-cased as its tokenizer_config.json says), else its tokenizer.json; None when it
    has neither. One that cannot be read is a DataError naming the folder and the problem (a run or
    checkpoint would otherwise go on with another tokenizer, or none)."""
    folder = Path(folder)
    settings = folder / "tokenizer_config.json"
    try:
        if (folder / "vocab.txt").is_file():
            lower_case = json.loads(settings.read_text()).get("do_lower_case", True) if settings.is_file() else True
            refuse_two_vocabularies(folder)
            return BertWordPiece(folder / "vocab.txt", lower_case=bool(lower_case))
        if (folder / "tokenizer.json").is_file():
            return HFTokenizer(folder)
    except GitLfsPointer:  # its own fix: the folder again would hold the same pointer
        raise
    except (ConfigError, json.JSONDecodeError, UnicodeDecodeError, AttributeError) as error:
        problem = error.problem if isinstance(error, ConfigError) else f"{settings} is not a JSON object"
        raise DataError(f"the tokenizer of the Hugging Face folder {folder} cannot be used: {problem}",
                        "fix it or download the model folder again") from None
    return None


def refuse_two_vocabularies(folder: Path) -> None:
    """A folder whose vocab.txt and tokenizer.json hold different tokens (a stray file beside a BPE
    export, say): transformers' AutoTokenizer reads the tokenizer.json, so carrying the vocab.txt would
    give every later tool other ids than the model learned. Equal ones (a BERT folder) are one vocab."""
    if not (folder / "tokenizer.json").is_file():
        return
    try:
        fast = Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab(with_added_tokens=True)
    except Exception:  # not a tokenizer.json the library reads: the vocab.txt is the folder's tokenizer
        return
    if fast != read_vocab(folder / "vocab.txt"):
        raise DataError(f"the Hugging Face folder {folder} holds a vocab.txt and a tokenizer.json with different "
                        "tokens (transformers reads the tokenizer.json)",
                        "remove the one the model was not trained with (a stray vocab.txt, usually)")


def refuse_save_with_checkpoint(save_dir) -> None:
    """A --save directory that holds a checkpoint already (its `latest`): from-hf names it before it reads
    any weight, and again before it writes."""
    if (Path(save_dir) / LATEST).exists():
        raise ConfigError(f"{save_dir} already holds a checkpoint", "choose a new --save directory")


def save_weights_only_checkpoint(save_dir, state: dict, config: BertConfig, tokenizer=None,
                                 initialised: list = ()) -> None:
    """A checkpoint directory with weights and config but no optimizer state, in the file layout
    of a plain-model ZeRO-0 checkpoint (`latest`, `iter_0000000/mp_rank_00_model_states.pt`, run_state.json), so
    `bert_state_from_checkpoint` and `stored_config` read it; `weights_only` marks it for a
    trainer that starts from its weights at any layout; `tokenizer` carried as a trained one is;
    `initialised`: the tensors the HF folder lacked, recorded for untrained_warning (a training run's
    own checkpoints record none). Atomic like save_hf_folder."""
    save_dir = Path(save_dir)
    refuse_save_with_checkpoint(save_dir)
    tag = tag_for(0)
    with undone_on_failure(f"cannot write the checkpoint {save_dir}", "--save", save_dir, save_dir) as made:
        made.append(created_folder(tempfile.mkdtemp(prefix=f".{tag}.", dir=save_dir)))
        partial = made[-1]
        header = {"config": TrainConfig(model=config).to_dict(), "iteration": 0, "consumed_samples": 0,
                  "weights_only": True, **({INITIALISED: list(initialised)} if initialised else {})}
        torch_save({"module": state, **header}, partial / "mp_rank_00_model_states.pt")
        # the header again as JSON, so that reading it (checkpoint.run_state) loads no weights
        (partial / RUN_STATE).write_text(json.dumps(header, allow_nan=False))
        if tokenizer is not None:
            carry(tokenizer, partial)
        os.replace(partial, save_dir / tag)
        made += [save_dir / tag, save_dir / LATEST]
        (save_dir / LATEST).write_text(tag)


BERT = Adapter(fields_from_hf=classic_fields_from_hf, structure=STRUCTURE, read_hf_tensors=read_hf_tensors,
               load_state=load_bert_state, hf_files=bert_hf_files, hf_tokenizer_model=bert_hf_tokenizer_model)
# the adapter of each Hugging Face model_type this trainer converts, both ways
ADAPTERS = {**{model_type: BERT for model_type in MODEL_TYPES}, hf_modernbert.MODEL_TYPE: hf_modernbert.ADAPTER}

"""Hugging Face BERT <-> BertModel: one name map used in both directions, configs, files.

Layouts: our post-LayerNorm model is HF `Bert*` (with the embedding LayerNorm), our pre-LayerNorm
model is HF `MegatronBert*` (no embedding LayerNorm, a final LayerNorm). HF keeps q, k and v in
three Linears; ours fuses them into `query_key_value`, whose output rows are [q; k; v] (each
[heads, d]), so the fusion is a row concatenation. Our vocab is padded to
`make_vocab_size_divisible_by`: padded rows are trimmed on export and re-added on import as zero
embeddings with an LM-head bias of PADDED_VOCAB_BIAS, so they take no probability and the MLM
loss equals HF's. Position tables shorter than `max_position_embeddings` are extended by
repeating the learned rows (Longformer's recipe) unless refused.

`transformers` is not needed here: folders are read and written as plain JSON, vocab text and
safetensors (a JSON header followed by raw little-endian tensor bytes).

ModernBERT has its own adapter (hf_modernbert: name map, shape transforms, config) on this module's
plumbing; the entry points below choose it by the folder's model_type or the model's layer options.
"""
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import pickle
import re
import shutil
import struct
import tempfile
import warnings
from pathlib import Path

import torch
from tokenizers import Tokenizer

from megatron.checkpoint import (LATEST, RUN_STATE, UNREADABLE, bert_state_from_checkpoint, refuse_log_dir,
                                 latest_tag, refuse_non_finite, run_state, stored_config, tag_for)
from megatron.config import TrainConfig, strict_json_loads
from megatron.data.tokenizer import BertWordPiece, HFTokenizer, carry, check_fits, read_vocab
from megatron.errors import ConfigError, DataError, GitLfsPointer, disk_full, refuse_lfs_pointer
from megatron.hf_forms import CLASSIC_LAYER, LAYOUTS, check_bert_exportable as check_exportable
from megatron.model.bert import BertConfig, BertModel
from megatron.paths import missing_folders, unwritable

PADDED_VOCAB_BIAS = -1.0e4  # exp(-1e4 - max logit) is 0 in fp32, bf16 and fp16
MODEL_TYPES = {model_type: layout for layout, (model_type, *_) in LAYOUTS.items()}
# HF tensors with nothing to convert: a buffer, and the LM decoder tied to tensors we convert
TIED = {"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias"}
BUFFERS = {"bert.embeddings.position_ids"}
PADDED = ("embeddings.word_embeddings.weight", "lm_head.bias")  # rows beyond vocab_size are padding
# BertConfig field <- HF config key, for the fields that fix the tensors' shapes and the math
HF_CONFIG_KEYS = {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_layers": "num_hidden_layers",
                  "num_attention_heads": "num_attention_heads", "ffn_hidden_size": "intermediate_size",
                  "type_vocab_size": "type_vocab_size", "layernorm_epsilon": "layer_norm_eps"}
HF_OTHER_KEYS = {"max_position_embeddings": "max_position_embeddings", "hidden_dropout": "hidden_dropout_prob",
                 "attention_dropout": "attention_probs_dropout_prob", "init_method_std": "initializer_range"}
SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                      "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                      "U8": torch.uint8, "BOOL": torch.bool}


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


def created_folder(path) -> Path:
    """A folder from tempfile.mkdtemp (mode 0700, private to its user) given the mode a plain
    mkdir would have (0777 less the umask): it is renamed into the user's output, which others
    sharing a model folder (a team, a serving account) must be able to read."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o777 & ~umask)
    return Path(path)


def hf_files(state: dict, config: BertConfig, vocab: list, lower_case: bool) -> tuple[dict, dict]:
    """(tensors, {file name: JSON}: config.json and the tokenizer's) in the Hugging Face family of
    `config`: BERT here, ModernBERT (any modern layer option) in hf_modernbert; `vocab`: the tokens of
    the vocab.txt exported with them."""
    from megatron import hf_modernbert  # the other adapter (it imports this module's plumbing)

    if hf_modernbert.is_modern(config):
        return hf_modernbert.hf_files(state, config, vocab, lower_case)
    return hf_state_from_bert(state, config), {"config.json": hf_config_from_bert(config, vocab.index("[PAD]")),
                                               "tokenizer_config.json": tokenizer_config(config, lower_case)}


def hf_positions(config: BertConfig) -> int:
    """The max_position_embeddings (and tokenizer model_max_length) of an export: the table's rows, or
    with rope, which has no table, the longer of the setting and the length the model trained at."""
    if config.position_embedding_type == "rope":
        return max(config.max_position_embeddings, config.seq_length)
    return config.max_position_embeddings


def tokenizer_config(config: BertConfig, lower_case: bool) -> dict:
    return {"tokenizer_class": "BertTokenizer", "do_lower_case": lower_case, "model_max_length": hf_positions(config)}


def hf_tokenizer_files(state: dict, config: BertConfig, tokenizer) -> tuple[dict, dict]:
    """hf_files for a model trained with a Hugging Face tokenizer (megatron.data.tokenizer.HFTokenizer):
    the special ids and names from the tokenizer, whose tokenizer.json AutoTokenizer then reads."""
    from megatron import hf_modernbert

    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": hf_positions(config),
                **hf_special_tokens(tokenizer)}
    if hf_modernbert.is_modern(config):
        special_ids = {"pad": tokenizer.pad, "cls": tokenizer.cls, "sep": tokenizer.sep}
        tensors, hf_config = (hf_modernbert.hf_state_from_bert(state, config),
                              hf_modernbert.hf_config_from_bert(config, special_ids))
    else:
        tensors, hf_config = hf_state_from_bert(state, config), hf_config_from_bert(config, tokenizer.pad)
    return tensors, {"config.json": hf_config, "tokenizer_config.json": settings}


def hf_special_tokens(tokenizer) -> dict:
    """The "<kind>_token" settings of an HFTokenizer's export: transformers takes a tokenizer.json's special
    tokens from tokenizer_config.json alone (an unk_token left out loads as None, where the trainer's model
    writes its unknown token), so each the trainer uses is named there, its unknown token included."""
    return {f"{kind}_token": token for kind, token in tokenizer.special_tokens().items()}


def save_hf_folder(output, state: dict, config: BertConfig, vocab_file=None, lower_case: bool = True,
                   hf_tokenizer=None) -> None:
    """Writes config.json, model.safetensors, vocab.txt and tokenizer_config.json (and tokenizer.json
    for ModernBERT, whose AutoTokenizer reads nothing else); with `hf_tokenizer` (vocab_file None)
    its tokenizer.json instead of the vocab.txt. Atomic: a temporary sibling folder renamed at the
    end, so a failure leaves nothing half-written, nor the folders made for it (undone_on_failure)."""
    output = Path(output)
    if output.exists():
        what = "a file" if Path(output).is_file() else "an existing folder"
        raise ConfigError(f"output {output} is {what}", "choose a new output folder (it is created) or remove it")
    if hf_tokenizer is not None:
        check_fits(hf_tokenizer, config.vocab_size)
        tensors, files = hf_tokenizer_files(state, config, hf_tokenizer)
        copied = {"tokenizer.json": hf_tokenizer.file}
    else:
        vocab = Path(vocab_file).read_text(encoding="utf-8").splitlines()
        if len(vocab) > config.vocab_size:  # fewer: rows no token reaches (--vocab-size), as HF allows
            raise ConfigError(f"vocab file {vocab_file} has {len(vocab)} tokens, the model's vocab_size is "
                              f"{config.vocab_size}", "pass the vocab.txt the model was trained with")
        if "[PAD]" not in vocab:
            raise ConfigError(f"vocab file {vocab_file} has no [PAD] token", "pass a BERT vocab.txt")
        tensors, files = hf_files(state, config, vocab, lower_case)
        copied = {"vocab.txt": vocab_file}
    with undone_on_failure(f"cannot write the Hugging Face folder {output}", "--output") as made:
        made += [Path(folder) for folder in reversed(missing_folders(output.parent))]
        output.parent.mkdir(parents=True, exist_ok=True)
        made.append(created_folder(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent)))
        partial = made[-1]
        for name, value in files.items():
            write_json(partial / name, value)
        write_safetensors(partial / "model.safetensors", tensors)
        for name, source in copied.items():
            shutil.copyfile(source, partial / name)
        os.replace(partial, output)


@contextlib.contextmanager
def undone_on_failure(cannot_write: str, flag: str):
    """Runs the writing of an output (the folder of `flag`): the body appends each path it makes to the
    list it is given (folders created on the way, a staging folder, a file renamed into place), which
    any failure removes, the last made first. A full disk is then one ConfigError line: the OSError of
    a write names no file, and torch's writer only says 'unexpected pos'."""
    made = []
    try:
        yield made
    except BaseException as error:
        for path in reversed(made):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    path.unlink()
        if disk_full(error):
            raise ConfigError(*unwritable(cannot_write, flag, error, "")) from None
        raise


def torch_save(value, path: Path) -> None:
    """torch.save through a Python file: a failed write is then the OSError that says why (a full disk),
    where torch's own writer raises 'unexpected pos' (the OSError of a write it passed on, or of the
    buffered bytes still to flush, is kept)."""
    with open(path, "wb") as file:
        try:
            torch.save(value, file)
        except RuntimeError as error:
            if isinstance(error.__context__, OSError):
                raise error.__context__ from None
            file.flush()  # raises the OSError of the buffered bytes, if any
            raise


# ---------------------------------------------------------------- HF -> ours

def read_hf_config(folder) -> dict:
    path = Path(folder) / "config.json"
    if Path(folder).is_file():
        raise ConfigError(f"{folder} is a file, not a Hugging Face model folder",
                          "point at the folder holding config.json and the weights")
    if not path.is_file():
        if (Path(folder) / LATEST).is_file():
            raise ConfigError(f"{folder} is a checkpoint of this trainer, not a Hugging Face model folder",
                              "pass it to --load (to-hf --load exports it)")
        raise ConfigError(f"{path} does not exist", "point at a Hugging Face model folder (config.json + weights)")
    try:
        config = strict_json_loads(path.read_text(encoding="utf-8"), path)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise DataError(f"{path} is not valid JSON ({error.__class__.__name__}: {str(error).splitlines()[0]})",
                        "copy or download the model folder again") from None
    if not isinstance(config, dict):
        raise DataError(f"{path} holds no JSON object", "copy or download the model folder again")
    return config


def bert_fields_from_hf(hf_config: dict) -> dict:
    """BertConfig fields of the model an HF config describes; refuses math we do not reproduce."""
    from megatron import hf_modernbert  # the other adapter

    model_type = hf_config.get("model_type")
    if model_type == hf_modernbert.MODEL_TYPE:
        return hf_modernbert.fields_from_hf(hf_config)
    types = f"{', '.join(MODEL_TYPES)} or {hf_modernbert.MODEL_TYPE}"
    if model_type is None:
        raise DataError("config.json has no model_type", f"add the model's model_type ({types}) to config.json, or "
                        "download the model folder again")
    if model_type not in MODEL_TYPES:
        raise ConfigError(f"Hugging Face model_type '{model_type}' is not a BERT", f"convert a model of type {types}")
    for key, supported in (("hidden_act", "gelu"), ("position_embedding_type", "absolute")):
        if hf_config.get(key, supported) != supported:
            raise ConfigError(f"Hugging Face {key} '{hf_config[key]}' differs from this model's '{supported}'",
                              f"convert a model with {key} '{supported}'")
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
    layout = MODEL_TYPES[model_type]
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


def check_compatible(hf_fields: dict, config: BertConfig) -> None:
    """The settings that shape the tensors or the math must agree (shapes alone miss the head count)."""
    for field in (*HF_CONFIG_KEYS, "layernorm_layout", "embedding_layernorm"):
        if field in hf_fields and hf_fields[field] != getattr(config, field):
            raise ConfigError(f"the Hugging Face model has {field} {hf_fields[field]}, this model "
                              f"{getattr(config, field)}", f"set {field} to {hf_fields[field]}")


HF_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")  # read_hf_weights's


def read_hf_weights(folder) -> dict:
    """Tensors of an HF folder as stored (model.safetensors, sharded safetensors or pytorch_model.bin)."""
    tensors = {}
    for path in hf_weight_files(folder):
        read = read_pytorch_bin if path.name == "pytorch_model.bin" else read_safetensors
        try:
            tensors.update(finite_tensors(read(path), path))
        except DataError:
            refuse_lfs_pointer(path)  # a clone without git-lfs: named as such, not as a truncated file
            raise
    return tensors


# a part of a tensor name that only the weights of one Hugging Face model_type have (any naming: a
# *Model folder's, old TF-era LayerNorm gamma / beta)
WEIGHT_MARKS = {"bert": ".attention.output.LayerNorm.", "megatron-bert": ".attention.ln.",
                "modernbert": ".attn.Wqkv."}


def refuse_other_model_type(folder, model_type: str, tensors: dict) -> None:
    """The weights `tensors` of `folder` are of the model_type its config.json names, as far as
    WEIGHT_MARKS tell: an edited config.json, or one from another model, is named as such rather
    than as the tensors the weights 'lack'."""
    examples = {kind: next((name for name in tensors if mark in name), None) for kind, mark in WEIGHT_MARKS.items()}
    found = {kind: name for kind, name in examples.items() if name}
    if found and model_type not in found:
        kind, example = next(iter(found.items()))
        raise DataError(f"{Path(folder) / 'config.json'} says model_type {model_type!r}, but the weights are a "
                        f"{kind} model's (e.g. {example})", f"set model_type to {kind!r} in config.json, or put the "
                        "config.json of these weights in the folder")


def check_shape(hf_name: str, tensor: torch.Tensor, want: list, vocab_rows: bool) -> None:
    """The HF tensor `hf_name` has the shape `want` that the folder's config.json gives (a run's own
    sizes were checked against it first); `vocab_rows`: a row per token (embeddings, decoder bias), whose
    count is config.json's vocab_size."""
    found = list(tensor.shape)
    if found == want:
        return
    if vocab_rows and found[1:] == want[1:]:
        raise DataError(f"the Hugging Face config.json's vocab_size {want[0]} contradicts the {found[0]} rows of "
                        f"{hf_name}", f"set vocab_size to {found[0]} in config.json")
    raise ConfigError(f"{hf_name} has shape {found}, the model expects {want}",
                      "correct the sizes in the folder's config.json to its weights', or put the model's own "
                      "config.json in the folder")


def hf_weight_files(folder) -> list:
    """The files read_hf_weights reads: model.safetensors, else the shards of model.safetensors.index.json,
    else pytorch_model.bin (a folder may hold both formats: the first found is the model)."""
    folder = Path(folder)
    if (folder / "model.safetensors").is_file():
        return [folder / "model.safetensors"]
    if (folder / "model.safetensors.index.json").is_file():
        index = folder / "model.safetensors.index.json"
        try:
            weight_map = strict_json_loads(index.read_text(encoding="utf-8"), index).get("weight_map")
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
            weight_map = None
        if not isinstance(weight_map, dict) or not all(isinstance(shard, str) for shard in weight_map.values()):
            raise DataError(f"{index} is not a safetensors index (a JSON object with a weight_map of file names)",
                            "copy or download the model folder again")
        shards = sorted(set(weight_map.values()))
        for shard in shards:
            if not (folder / shard).is_file():
                raise DataError(f"{index} names the shard {shard}, which is not in {folder}",
                                "copy or download the model folder again (every shard)")
        return [folder / shard for shard in shards]
    if (folder / "pytorch_model.bin").is_file():
        return [folder / "pytorch_model.bin"]
    if (folder / LATEST).is_file() or (folder / RUN_STATE).is_file():  # a --save folder, or one iter_* of it
        saved = folder if (folder / LATEST).is_file() else folder.parent
        raise ConfigError(f"{folder} is a checkpoint of this trainer, not a Hugging Face model folder",
                          f"pass {saved} with --load (a weights-only one, as from-hf writes, starts a run from its "
                          "weights)")
    refuse_log_dir(str(folder), "--load --finetune (a new run from its weights)")
    raise ConfigError(f"{folder} holds no model.safetensors or pytorch_model.bin",
                      "point at a Hugging Face model folder saved with save_pretrained")


def finite_tensors(tensors: dict, path) -> dict:
    """`tensors` (read from the file `path`), with one whose values are not all finite refused: NaN
    weights would train to a NaN loss at the first step, whatever the learning rate."""
    refuse_non_finite(tensors, f"{path}", "copy or download the model folder again, or export it again from a "
                      "model whose weights are finite")
    return tensors


def _unreadable_bin(path: Path, error: Exception) -> DataError:
    first = re.split(r"(?<=\.) ", (str(error).splitlines() or ["empty"])[0])[0]  # torch's first sentence
    return DataError(f"{path} cannot be read: truncated or not a PyTorch file ({type(error).__name__}: {first})",
                     "copy or download the model folder again")


def read_pytorch_bin(path: Path) -> dict:
    """The tensors of a pytorch_model.bin, loaded weights-only (unpickling anything else runs code):
    a truncated file, a pickled model or anything but a name -> tensor mapping is one DataError."""
    fix = "copy or download the model folder again (or save the model with save_pretrained)"
    try:
        tensors = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        found = re.search(r"GLOBAL (\S+)", str(error))
        what = f"a pickled {found.group(1)}" if found else "pickled Python objects"
        raise DataError(f"{path} holds {what}, not only tensors (not loaded: unpickling it could run any code)",
                        fix) from None
    except OSError as error:
        if error.filename:  # the file itself (permissions, a folder): named as any path the tool reads
            raise
        raise _unreadable_bin(path, error) from None
    except (*UNREADABLE, KeyError) as error:
        raise _unreadable_bin(path, error) from None
    if not isinstance(tensors, dict):
        raise DataError(f"{path} holds a {type(tensors).__name__}, not names mapped to tensors", fix)
    for name, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise DataError(f"{path} maps {name!r} to a {type(tensor).__name__}, not a tensor", fix)
    return tensors


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

    Shapes are checked against the model `config` describes; a mismatch names the HF tensor.
    """
    with torch.device("meta"):
        expected = BertModel(config).state_dict()
    for hf_name, ours in TIED.items():
        if hf_name in tensors and ours in tensors and not torch.equal(tensors[hf_name], tensors[ours]):
            raise ConfigError(f"{hf_name} differs from {ours}", "this model ties them; convert a tied checkpoint")
    state, used = {}, set(TIED) | BUFFERS
    for ours, hf_names in name_map(config):
        if not all(name in tensors for name in hf_names):
            used.update(hf_names)  # q and v of a missing k are not "ignored": the k is missing
            continue
        parts = [weight(name, tensors[name]) for name in hf_names]
        if ours == "embeddings.position_embeddings.weight":
            parts = [positions_for(parts[0], config.max_position_embeddings, hf_names[0], extend_positions)]
        want = list(expected[ours].shape)
        want[0] = config.vocab_size if ours in PADDED else want[0] // len(hf_names)
        for name, part in zip(hf_names, parts):
            check_shape(name, part, want, ours in PADDED)
        state[ours] = pad_vocab_rows(ours, torch.cat(parts), expected[ours].shape[0])
        used.update(hf_names)
    warn_ignored(sorted(set(tensors) - used), config)
    return state, sorted(set(expected) - set(state))


LAYER_INDEX = re.compile(r"(?:^|\.)layers?\.(\d+)\.")  # bert.encoder.layer.N.*, model.layers.N.*


def warn_ignored(ignored: list, config: BertConfig) -> None:
    """One warning naming the HF tensors this model does not use (a head it lacks, a pooler), as HF warns;
    but layers beyond the config's num_hidden_layers are refused: a config.json edited to fewer layers
    than its weights hold would drop the rest silently."""
    beyond = [int(match.group(1)) for name in ignored if (match := LAYER_INDEX.search(name))
              and int(match.group(1)) >= config.num_layers]
    if beyond:
        raise DataError(f"the Hugging Face config.json's num_hidden_layers {config.num_layers} leaves out layers of "
                        f"its weights, which hold {max(beyond) + 1}", f"set num_hidden_layers to {max(beyond) + 1} in "
                        "config.json")
    if ignored:
        warnings.warn(f"Hugging Face tensors ignored (not part of this model): {', '.join(ignored)}", stacklevel=3)


def pad_vocab_rows(ours: str, tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """Our tensor `ours` with its vocab rows (PADDED) padded to `rows`: zero embeddings and an LM-head bias of
    PADDED_VOCAB_BIAS (no probability); another tensor as it is."""
    extra = rows - tensor.shape[0]
    if ours == "embeddings.word_embeddings.weight":
        return torch.cat([tensor, tensor.new_zeros(extra, tensor.shape[1])])
    if ours == "lm_head.bias":
        return torch.cat([tensor, tensor.new_full((extra,), PADDED_VOCAB_BIAS)])
    return tensor


def repadded_vocab(state: dict, config: BertConfig) -> dict:
    """Weights of a checkpoint padded to another multiple (--make-vocab-size-divisible-by) for a new run
    from them: the padding rows, which no token reaches, trimmed and added again as from a Hugging Face
    folder, so that the flag is taken as --init-from-hf takes it. Weights of the run's padding stay as they are."""
    return {name: pad_vocab_rows(name, tensor[:config.vocab_size], config.padded_vocab_size)
            if name in PADDED and len(tensor) != config.padded_vocab_size else tensor for name, tensor in state.items()}


def weight(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """An HF weight as float32; an integer one (a damaged or quantized file) is refused, not cast."""
    if not tensor.is_floating_point():
        raise DataError(f"tensor {name} is {str(tensor.dtype).removeprefix('torch.')}, not floating point",
                        "copy or download the model folder again")
    return tensor.float()


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
    from megatron import hf_modernbert  # the other adapter

    hf_config = read_hf_config(folder)
    if hf_config.get("model_type") == hf_modernbert.MODEL_TYPE:
        return hf_modernbert.load_hf_weights(folder, config, hf_config)
    check_compatible(bert_fields_from_hf(hf_config), config)
    tensors = read_hf_tensors(folder)
    refuse_other_model_type(folder, hf_config["model_type"], tensors)
    state, missing = bert_state_from_hf(tensors, config, extend_positions)
    return completed(state, missing, missing_encoder_tensors(missing, tensors, config), folder, config)


def completed(state: dict, missing: list, lacking: list, folder, config: BertConfig,
              note: str = "") -> tuple[dict, list]:
    """(`state` with the `missing` tensors a folder may lack (whole heads) initialised as a new
    model's, in one warning line (after `note`: what else the line must say), `missing`); a folder
    that `lacking` names (HF tensor names) is one error."""
    if lacking:
        shown = ", ".join(lacking[:6]) + (f" and {len(lacking) - 6} more" if len(lacking) > 6 else "")
        raise DataError(f"the Hugging Face folder {folder} lacks {len(lacking)} tensor(s) of the model: {shown}",
                        "copy or download the model folder again (every weights file), or convert a folder whose "
                        "config.json matches its weights")
    if missing:
        fresh = BertModel(config).state_dict()
        state.update({name: fresh[name] for name in missing})
        warnings.warn(f"{note}not in the Hugging Face folder, initialised: {', '.join(missing)}", stacklevel=3)
    return state, missing


# ---------------------------------------------------------------- files

def write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True, allow_nan=False) + "\n")


def write_safetensors(path: Path, tensors: dict) -> None:
    names = {dtype: name for name, dtype in SAFETENSORS_DTYPES.items()}
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, tensor in tensors.items():
        blob = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": names[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the format aligns the data start to 8 bytes
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(encoded)) + encoded)
        for blob in blobs:
            file.write(blob)


def read_safetensors(path: Path) -> dict:
    data = bytearray(Path(path).read_bytes())
    damaged = DataError(f"{path} is not a complete safetensors file ({len(data)} bytes: truncated or overwritten)",
                        "copy or download the model folder again")
    if len(data) < 8:
        raise damaged
    (length,) = struct.unpack("<Q", data[:8])
    try:
        header = json.loads(data[8:8 + length]) if 8 + length <= len(data) else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        header = None
    if not isinstance(header, dict):
        raise damaged
    header.pop("__metadata__", None)
    tensors = {}
    for name, entry in header.items():
        dtype, shape, begin, end = header_entry(path, name, entry)
        if not 0 <= begin <= end <= len(data) - 8 - length:
            raise damaged
        raw = (torch.frombuffer(data, dtype=torch.uint8, count=end - begin, offset=8 + length + begin).clone()
               if end > begin else torch.empty(0, dtype=torch.uint8))  # the clone is aligned for the view
        tensors[name] = raw.view(dtype).reshape(shape)
    return tensors


def header_entry(path: Path, name: str, entry) -> tuple:
    """(dtype, shape, begin, end) of a safetensors header entry, checked: a damaged or hand-edited
    header is one DataError naming the tensor, not a KeyError or a failed reshape."""
    def damaged(problem: str) -> DataError:
        return DataError(f"{path} is damaged: the header entry of tensor {name} {problem}",
                         "copy or download the model folder again")

    def counts(value) -> bool:
        return isinstance(value, list) and all(type(n) is int and n >= 0 for n in value)

    if not isinstance(entry, dict):
        raise damaged(f"is {json.dumps(entry)[:60]}, not an object with dtype, shape and data_offsets")
    missing = [key for key in ("dtype", "shape", "data_offsets") if key not in entry]
    if missing:
        raise damaged(f"has no {' and no '.join(missing)}")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in SAFETENSORS_DTYPES:
        raise DataError(f"{path}: tensor {name} has dtype {json.dumps(dtype)[:40]}, not one read here "
                        f"({', '.join(SAFETENSORS_DTYPES)}): a quantized or damaged file",
                        "convert a float32, bfloat16 or float16 save of the model, or copy or download the model "
                        "folder again")
    if not (counts(shape) and counts(offsets) and len(offsets) == 2):
        raise damaged(f"has shape {json.dumps(shape)[:40]} and data_offsets {json.dumps(offsets)[:40]}: "
                      "not lists of integers >= 0 (two offsets)")
    size = SAFETENSORS_DTYPES[dtype].itemsize * math.prod(shape)
    if offsets[1] - offsets[0] != size:
        raise damaged(f"is {dtype} {shape} ({size} bytes) but its data_offsets {offsets} hold "
                      f"{offsets[1] - offsets[0]} bytes")
    return SAFETENSORS_DTYPES[dtype], shape, *offsets


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


def weights_fingerprint(source, kind: str) -> str:
    """sha256 of the model of `source`: the same model copied elsewhere matches, other weights of the same
    shapes do not. `kind` "hf": the bytes of a Hugging Face folder's config.json and of the weight files
    read_hf_weights reads (a copy staged with one format of two matches); "checkpoint": the BertModel
    weights a run from it starts with (bert_state_from_checkpoint, any layout, not the optimizer states
    that a ZeRO-0 model file also holds) and its stored model config."""
    digest = hashlib.sha256()
    if kind == "hf":
        for path in [Path(source) / "config.json", *hf_weight_files(source)]:
            digest.update(f"{path.name}\0{path.stat().st_size}\0".encode())
            with open(path, "rb") as file:
                while block := file.read(2**24):
                    digest.update(block)
        return digest.hexdigest()
    tag = latest_tag(source)
    digest.update(json.dumps(stored_config(source, tag)["model"], sort_keys=True).encode())
    for name, tensor in sorted(bert_state_from_checkpoint(source, tag).items()):
        digest.update(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def save_weights_only_checkpoint(save_dir, state: dict, config: BertConfig, tokenizer=None,
                                 initialised: list = ()) -> None:
    """A checkpoint directory with weights and config but no optimizer state, in the file layout
    of a plain-model ZeRO-0 checkpoint (`latest`, `iter_0000000/mp_rank_00_model_states.pt`, run_state.json), so
    `bert_state_from_checkpoint` and `stored_config` read it; `weights_only` marks it for a
    trainer that starts from its weights at any layout; `tokenizer` carried as a trained one is;
    `initialised`: the tensors the HF folder lacked, recorded for untrained_warning (a training run's
    own checkpoints record none). Atomic like save_hf_folder."""
    save_dir = Path(save_dir)
    if (save_dir / "latest").exists():
        raise ConfigError(f"{save_dir} already holds a checkpoint", "choose a new --save directory")
    tag = tag_for(0)
    with undone_on_failure(f"cannot write the checkpoint {save_dir}", "--save") as made:
        made += [Path(folder) for folder in reversed(missing_folders(save_dir))]
        save_dir.mkdir(parents=True, exist_ok=True)
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

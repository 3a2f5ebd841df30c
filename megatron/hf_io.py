"""The plumbing the Hugging Face adapters share (hf_convert's BERT one, hf_modernbert's): model
folders (config.json, safetensors, sharded safetensors, pytorch_model.bin) read and written, the
undo of a failed write, fingerprints, and the one loop that turns a folder's tensors into a
BertModel state through an adapter's name map (shapes checked, vocab rows padded, the unused
tensors named). An adapter supplies its name map, its config fields and its transforms (Adapter);
hf_modernbert imports this module and no other adapter, hf_convert (the BERT adapter and the
dispatch table, ADAPTERS) imports both, at the top: no import cycle.

`transformers` is not needed here: folders are read and written as plain JSON, vocab text and
safetensors (a JSON header followed by raw little-endian tensor bytes).
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
import warnings
from pathlib import Path
from typing import Callable

import torch

from megatron.checkpoint import (LATEST, RUN_STATE, UNREADABLE, latest_tag, read_failure, refuse_log_dir,
                                 refuse_non_finite, stored_config)
from megatron.checkpoint_weights import bert_state_from_checkpoint
from megatron.config import strict_json_loads
from megatron.errors import ConfigError, DataError, disk_full, refuse_lfs_pointer
from megatron.model.bert import BertConfig, BertModel
from megatron.paths import file_in_the_way, missing_folders, unwritable

PADDED_VOCAB_BIAS = -1.0e4  # exp(-1e4 - max logit) is 0 in fp32, bf16 and fp16


PADDED = ("embeddings.word_embeddings.weight", "lm_head.bias")  # rows beyond vocab_size are padding


SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                      "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                      "U8": torch.uint8, "BOOL": torch.bool}


def created_folder(path) -> Path:
    """A folder from tempfile.mkdtemp (mode 0700, private to its user) given the mode a plain
    mkdir would have (0777 less the umask): it is renamed into the user's output, which others
    sharing a model folder (a team, a serving account) must be able to read."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o777 & ~umask)
    return Path(path)


def hf_positions(config: BertConfig) -> int:
    """The max_position_embeddings (and tokenizer model_max_length) of an export: the table's rows, or
    with rope, which has no table, the longer of the setting and the length the model trained at."""
    if config.position_embedding_type == "rope":
        return max(config.max_position_embeddings, config.seq_length)
    return config.max_position_embeddings


def tokenizer_config(config: BertConfig, lower_case: bool) -> dict:
    return {"tokenizer_class": "BertTokenizer", "do_lower_case": lower_case, "model_max_length": hf_positions(config)}


@contextlib.contextmanager
def undone_on_failure(cannot_write: str, flag: str, output: Path, folder: Path):
    """Runs the writing of the output of `flag` (`output`, a file or folder made in `folder`, which is
    created here with the folders it needs): the body appends each path it makes to the list it is given
    (a staging folder or file, a file renamed into place), which any failure removes, the last made first,
    with the folders made for it. A file where a folder of `output` goes is named as such, before anything is
    made ('File exists' said nothing of it). A full disk is then one ConfigError line: the OSError of a write
    names no file, and torch's writer only says 'unexpected pos'; an OSError of a path beside `output` (a
    staging folder the user never named) is named as the output's."""
    if problem := file_in_the_way(flag, str(output)):
        raise ConfigError(problem, f"pass another {flag}, or move that file")
    made = [Path(path) for path in reversed(missing_folders(str(folder)))]  # innermost last: removed first
    try:
        folder.mkdir(parents=True, exist_ok=True)
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
        if isinstance(error, OSError) and error.filename and Path(os.path.abspath(error.filename)).is_relative_to(
                os.path.abspath(output.parent)):
            raise ConfigError(*unwritable(cannot_write, flag, error, f"pass a {flag} this user can write")) from None
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


def read_hf_config(folder) -> dict:
    """The config.json of a Hugging Face model folder. A run's --log-dir holds a config.json too (the resolved
    one, no model_type): refused as such, naming the run's --save folder, not as a broken model folder."""
    path = Path(folder) / "config.json"
    if Path(folder).is_file():
        raise ConfigError(f"{folder} is a file, not a Hugging Face model folder",
                          "point at the folder holding config.json and the weights")
    if not path.is_file():
        if os.path.lexists(Path(folder) / LATEST):
            raise ConfigError(f"{folder} is a checkpoint of this trainer, not a Hugging Face model folder",
                              "pass it to --load (to-hf --load exports it)")
        raise ConfigError(f"{path} does not exist", "point at a Hugging Face model folder (config.json + weights)")
    refuse_log_dir(str(folder), "--load (to-hf --load exports it)")
    try:
        config = strict_json_loads(path.read_text(encoding="utf-8"), path)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise DataError(f"{path} is not valid JSON ({error.__class__.__name__}: {str(error).splitlines()[0]})",
                        "copy or download the model folder again") from None
    if not isinstance(config, dict):
        raise DataError(f"{path} holds no JSON object", "copy or download the model folder again")
    return config


MLM_HEAD_CLASSES = ("ForMaskedLM", "ForPreTraining")  # the transformers classes whose folder holds the MLM head


def reads_mlm_head(hf_config: dict) -> bool:
    """Whether a folder's MLM head (its decoder and the dense -> act -> norm before it) is read: its
    config names a *ForMaskedLM / *ForPreTraining class, or none (read as one). A fine-tuned
    folder's head is dropped and a base model has none: options of that head configure nothing read."""
    names = [name for name in hf_config.get("architectures") or [] if isinstance(name, str)]
    return not names or any(name.endswith(MLM_HEAD_CLASSES) for name in names)


def refuse_untied_decoder(hf_config: dict) -> None:
    """At config time (a dry run says it), not once the weights are read: an untied decoder has no
    counterpart here, where the MLM decoder is the token embeddings."""
    if reads_mlm_head(hf_config) and hf_config.get("tie_word_embeddings", True) is False:
        raise ConfigError("the Hugging Face config.json sets tie_word_embeddings false (its MLM decoder has weights "
                          "of its own): this trainer ties the decoder to the token embeddings, so the model cannot be "
                          "converted without changing its outputs", "convert a model with tie_word_embeddings true")


HF_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")  # read_hf_weights's


def read_hf_weights(folder) -> dict:
    """Tensors of an HF folder as stored (model.safetensors, sharded safetensors or pytorch_model.bin)."""
    tensors = {}
    for path in hf_weight_files(folder):
        read = read_pytorch_bin if path.suffix == ".bin" else read_safetensors
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
    """The files read_hf_weights reads, the first a folder holds of: model.safetensors, the shards of
    model.safetensors.index.json, pytorch_model.bin, the shards of pytorch_model.bin.index.json (a folder may
    hold both formats: transformers reads the safetensors)."""
    folder = Path(folder)
    for weights in ("model.safetensors", "pytorch_model.bin"):
        if (folder / weights).is_file():
            return [folder / weights]
        if (index := folder / f"{weights}.index.json").is_file():
            return _index_shards(index)
    if os.path.lexists(folder / LATEST) or (folder / RUN_STATE).is_file():  # a --save folder, or one iter_* of it
        saved = folder if os.path.lexists(folder / LATEST) else folder.parent
        raise ConfigError(f"{folder} is a checkpoint of this trainer, not a Hugging Face model folder",
                          f"pass {saved} with --load (a weights-only one, as from-hf writes, starts a run from its "
                          "weights)")
    refuse_log_dir(str(folder), "--load --finetune (a new run from its weights)")
    raise ConfigError(f"{folder} holds no model.safetensors or pytorch_model.bin",
                      "point at a Hugging Face model folder saved with save_pretrained")


def _index_shards(index: Path) -> list:
    """The shard files a weight index (model.safetensors.index.json, pytorch_model.bin.index.json) names."""
    try:
        weight_map = strict_json_loads(index.read_text(encoding="utf-8"), index).get("weight_map")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        weight_map = None
    if not isinstance(weight_map, dict) or not all(isinstance(shard, str) for shard in weight_map.values()):
        raise DataError(f"{index} is not a weight index (a JSON object with a weight_map of file names)",
                        "copy or download the model folder again")
    shards = sorted(set(weight_map.values()))
    for shard in shards:
        if not (index.parent / shard).is_file():
            raise DataError(f"{index} names the shard {shard}, which is not in {index.parent}",
                            "copy or download the model folder again (every shard)")
    return [index.parent / shard for shard in shards]


def finite_tensors(tensors: dict, path) -> dict:
    """`tensors` (read from the file `path`), with one whose values are not all finite refused: NaN
    weights would train to a NaN loss at the first step, whatever the learning rate."""
    refuse_non_finite(tensors, f"{path}", "copy or download the model folder again, or export it again from a "
                      "model whose weights are finite")
    return tensors


def _unreadable_bin(path: Path, error: Exception) -> DataError:
    return DataError(f"{path} cannot be read: truncated or not a PyTorch file ({read_failure(error, 'empty')})",
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


LAYER_INDEX = re.compile(r"(?:^|\.)layers?\.(\d+)\.")  # bert.encoder.layer.N.*, model.layers.N.*


def warn_ignored(ignored: list, config: BertConfig, stacklevel: int = 3) -> None:
    """One warning naming the HF tensors this model does not use (a head it lacks, a pooler), as HF warns;
    but layers beyond the config's num_hidden_layers are refused: a config.json edited to fewer layers
    than its weights hold would drop the rest silently. `stacklevel`: the warning's, counted from here
    (state_from_hf passes 4: the caller of the adapter's function that called it)."""
    beyond = [int(match.group(1)) for name in ignored if (match := LAYER_INDEX.search(name))
              and int(match.group(1)) >= config.num_layers]
    if beyond:
        raise DataError(f"the Hugging Face config.json's num_hidden_layers {config.num_layers} leaves out layers of "
                        f"its weights, which hold {max(beyond) + 1}", f"set num_hidden_layers to {max(beyond) + 1} in "
                        "config.json")
    if ignored:
        warnings.warn(f"Hugging Face tensors ignored (not part of this model): {', '.join(ignored)}",
                      stacklevel=stacklevel)


def pad_vocab_rows(ours: str, tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """Our tensor `ours` with its vocab rows (PADDED) padded to `rows`: zero embeddings and an LM-head bias of
    PADDED_VOCAB_BIAS (no probability); another tensor as it is."""
    extra = rows - tensor.shape[0]
    if ours == "embeddings.word_embeddings.weight":
        return torch.cat([tensor, tensor.new_zeros(extra, tensor.shape[1])])
    if ours == "lm_head.bias":
        return torch.cat([tensor, tensor.new_full((extra,), PADDED_VOCAB_BIAS)])
    return tensor


def weight(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """An HF weight as float32; an integer one (a damaged or quantized file) is refused, not cast."""
    if not tensor.is_floating_point():
        raise DataError(f"tensor {name} is {str(tensor.dtype).removeprefix('torch.')}, not floating point",
                        "copy or download the model folder again")
    return tensor.float()


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
        warnings.warn(f"{note}not in the Hugging Face folder, initialised: {', '.join(missing)}",
                      stacklevel=4)  # the caller of hf_convert.load_hf_weights (through the adapter's load_state)
    return state, missing


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



# ---------------------------------------------------------------- what an adapter supplies

@dataclasses.dataclass(frozen=True)
class Adapter:
    """One Hugging Face model family, as hf_convert's dispatch table chooses it (by a folder's
    model_type on import, by a model's layer options on export)."""
    fields_from_hf: Callable  # (HF config) -> BertConfig fields; refuses math not reproduced
    structure: tuple  # the fields that shape the tensors or the math: a run may restate them, not change them
    read_hf_tensors: Callable  # (folder) -> its tensors under the names of the adapter's name map
    load_state: Callable  # (tensors, HF config, folder, config, extend_positions) -> completed's (state, missing)
    hf_files: Callable  # (state, config, vocab, lower_case) -> (tensors, {file name: JSON})
    hf_tokenizer_model: Callable  # (state, config, HFTokenizer) -> (tensors, config.json)


def check_compatible(hf_fields: dict, config: BertConfig, fields: tuple) -> None:
    """The settings among `fields` that shape the tensors or the math must agree (shapes alone miss
    the head count)."""
    for field in fields:
        if field in hf_fields and hf_fields[field] != getattr(config, field):
            raise ConfigError(f"the Hugging Face model has {field} {hf_fields[field]}, this model "
                              f"{getattr(config, field)}", f"set {field} to {hf_fields[field]}")


def state_from_hf(tensors: dict, config: BertConfig, pairs: list, tied: dict, buffers=(),
                  from_hf: Callable | None = None) -> tuple[dict, list]:
    """HF tensors -> (BertModel state for `config` without the tensors the folder lacks, their names),
    through an adapter's name map `pairs` (BertModel name, its HF names: several are fused as rows).

    `tied`: HF name -> the HF name it must equal (the model ties them; only the second is converted);
    `buffers`: HF names with nothing to convert; `from_hf(ours, parts, hf_names)`: the adapter's
    transform of the HF parts (float) before their shapes are checked against the model `config`
    describes; a mismatch names the HF tensor.
    """
    with torch.device("meta"):
        expected = BertModel(config).state_dict()
    for hf_name, source in tied.items():
        if hf_name in tensors and source not in tensors:  # stored under the tied name only: one parameter
            tensors = {**tensors, source: tensors[hf_name]}
        if hf_name in tensors and source in tensors and not torch.equal(tensors[hf_name], tensors[source]):
            raise ConfigError(f"{hf_name} differs from {source} in the Hugging Face folder: this trainer ties them, "
                              "so the model cannot be converted without changing its outputs",
                              "convert a folder whose decoder is tied to its embeddings")
    state, used = {}, set(tied) | set(buffers)
    for ours, hf_names in pairs:
        if not all(name in tensors for name in hf_names):
            used.update(hf_names)  # q and v of a missing k are not "ignored": the k is missing
            continue
        parts = [weight(name, tensors[name]) for name in hf_names]
        if from_hf is not None:
            parts = from_hf(ours, parts, hf_names)
        want = list(expected[ours].shape)
        want[0] = config.vocab_size if ours in PADDED else want[0] // len(hf_names)
        for name, part in zip(hf_names, parts):
            check_shape(name, part, want, ours in PADDED)
        state[ours] = pad_vocab_rows(ours, torch.cat(parts), expected[ours].shape[0])
        used.update(hf_names)
    warn_ignored(sorted(set(tensors) - used), config, stacklevel=4)
    return state, sorted(set(expected) - set(state))

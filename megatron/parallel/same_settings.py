"""Every rank launched with the same settings, checked once right after the rendezvous, before any other
collective. A launch per node (NODE_RANK=0..N-1, a scheduler's job per machine) may give one node other
flags or another DeepSpeed JSON, which no rank notices on its own: the ranks train at other rates and then
wait on a step the others never take (a frozen rank, says the timeout), or a collective of another size
aborts in the backend. What may differ by rank is left out (PER_RANK); the data and tokenizer files are
compared by what they hold (BY_CONTENT), not by the path a node reaches them at, as are the checkpoint a
--load other than --save names and the --init-from-hf folder; --save by whether it is given
(checkpoint_save.check_writable checks that it is one folder on every node); the code each rank runs (the trainer's
sources, the pinned packages: CODE) first, as other code may read the same flags otherwise."""
import contextlib
import hashlib
import importlib.metadata
import json
import socket
from pathlib import Path

import torch.distributed as dist

from megatron.errors import ConfigError

# what differs by rank or node and changes nothing the ranks share: the launcher's local rank, the JSON's path
# (its content is compared), rank 0's own log folders (a per-node RUN_DIR's, free_log_dir's -N), and which
# alias of a flag was given (`--swiglu` or `--mlp-type swiglu`: the value is compared), and the folders each
# node may have on its own disk: --data-cache-path (a node that does not see a map builds it there, the same
# map: bert_dataset.cached_array) and --default-data-dir (each node builds the same embedded corpus)
PER_RANK = frozenset({"local_rank", "deepspeed_config", "log_dir", "tensorboard_dir", "aliases", "data_cache_path",
                      "default_data_dir"})
FIX = "launch every node with the same command and the same DeepSpeed JSON"
# every rank writes its part of a checkpoint into --save and reads it from --load: one folder all nodes share
SHARED_FOLDER_FIX = ", with --save and --load a folder every node shares (the launch scripts: the same RUN_DIR)"
# --save may be one shared folder mounted at another path on each node: compared here by whether it is given,
# and by its lock (rank 0's, seen in every node's --save) in checkpoint_save.check_writable; a --load that is the
# rank's --save is compared as that
GIVEN, THE_SAVE_FOLDER = "given", "the --save folder"
# the code every rank must run alike: the trainer's sources and the pinned packages that compute or read
# the checkpoints (requirements.txt); {CODE + name: version}
CODE = "code:"
SOURCES = "megatron"  # CODE + SOURCES: a digest of the trainer's sources (megatron/, pretrain_bert.py)
PINNED = ("torch", "deepspeed", "numpy", "tokenizers", "transformers")
CODE_FIX = ("install the same commit of the trainer and the pinned packages (requirements.txt) on every node, "
            "then launch again")
NAMED = 4  # the further differences the line names after the first
ABSENT = object()  # a JSON key one rank's JSON lacks
# the flags that name files, compared by what the files hold: the same data mounted at /mnt/a/data on one node
# and /data on another is the same data (the fingerprint of each prefix's .idx/.bin, the index maps' own; the
# tokenizer's identity record, which checkpoints carry; a checkpoint's latest tag and run state, the weights
# files of a checkpoint without a run id and of an HF folder: checkpoint_identity, hf_identity), and other files
# at the same path are other data
BY_CONTENT = ("data_path", "vocab_file", "tokenizer_file", "load", "init_from_hf")
CONTENT = "content:"  # the key of a BY_CONTENT flag's content identity among a rank's settings
CONTENT_FIX = ("give every node the same data, tokenizer, checkpoint and Hugging Face files (a copy may sit at "
               "another path on each node)")


def launch_settings(args, ds: dict) -> dict:
    """The settings every rank must share: the parsed flags (but PER_RANK) and the resolved DeepSpeed JSON,
    flattened to {name: value} (JSON keys as `json:zero_optimization.stage`). The optimizer's torch_adam
    is left out: deepspeed_settings sets it on a node whose FusedAdam cannot be built (the same update)."""
    settings = {dest: value for dest, value in vars(args).items() if dest not in PER_RANK}

    def flatten(prefix: str, value) -> None:
        if isinstance(value, dict) and value:
            for key, item in value.items():
                flatten(f"{prefix}.{key}" if prefix else str(key), item)
        elif prefix != "optimizer.params.torch_adam":
            settings[f"json:{prefix}"] = value

    flatten("", ds)
    if settings.get("load") and settings["load"] == settings.get("save"):
        settings["load"] = THE_SAVE_FOLDER
    if settings.get("save"):
        settings["save"] = GIVEN
    return settings


def code_identity(root: Path = Path(__file__).resolve().parents[2]) -> dict:
    """{CODE + name: version} of what this rank runs: a digest of the trainer's sources (its .py and .cpp files
    under megatron/ and pretrain_bert.py: a node with another checkout, or an edited one) and the version of
    each PINNED package (`not installed`). `root`: the checkout's folder."""
    digest = hashlib.sha256()
    for path in sorted([*root.joinpath("megatron").rglob("*.py"), *root.joinpath("megatron").rglob("*.cpp"),
                        root / "pretrain_bert.py"]):
        with contextlib.suppress(OSError):
            digest.update(f"{path.relative_to(root)}\0".encode() + path.read_bytes())
    found = {CODE + SOURCES: digest.hexdigest()[:12]}
    for name in PINNED:
        try:
            found[CODE + name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[CODE + name] = "not installed"
    return found


def content_identities(settings: dict) -> dict:
    """{CONTENT + flag: what its files hold on this rank} of each BY_CONTENT flag given: the data prefixes'
    weights and fingerprints (index_maps.fingerprint: a recorded digest is read, else the files are hashed once
    per process, which the data's own checks then reuse), the tokenizer's identity record without its path. A
    flag whose files cannot be read here (missing, not a tokenizer) has none: its path is compared as text, and
    the start-up's own checks name the file. A --load checkpoint (not the --save folder: THE_SAVE_FOLDER) by
    checkpoint_identity, an --init-from-hf folder by hf_identity. The tokenizer built here is the one the run
    then uses (tokenizer.shared_tokenizer: built once per rank)."""
    from megatron.data import index_maps  # here: the data and tokenizer modules are not needed without a flag
    from megatron.data.bert_dataset import parse_data_path
    from megatron.data.tokenizer import HF_TOKENIZER, shared_tokenizer
    from megatron.errors import DataError

    found = {}
    for name in (name for name in BY_CONTENT if settings.get(name)):
        with contextlib.suppress(OSError, ConfigError, DataError, ValueError):
            if name == "load":
                if settings[name] != THE_SAVE_FOLDER:
                    found[CONTENT + name] = checkpoint_identity(settings[name])
            elif name == "init_from_hf":
                found[CONTENT + name] = hf_identity(settings[name])
            elif name == "data_path":
                weights, prefixes = parse_data_path(settings[name])
                found[CONTENT + name] = [weights, [index_maps.fingerprint(
                    prefix, cache_path=settings.get("data_cache_path"), write_record=False) for prefix in prefixes]]
            else:
                kind = HF_TOKENIZER if name == "tokenizer_file" else settings.get("tokenizer_type")
                record = shared_tokenizer(kind, **{name: settings[name]}).record()
                found[CONTENT + name] = {key: value for key, value in record.items() if key != "file"}
    return found


def checkpoint_identity(folder: str) -> list:
    """[latest tag, digest] of the checkpoint --load `folder` resumes or starts from: its run_state.json names
    its run (a run id made at its start) and iteration, so a copy matches and another run's, or another
    iteration, does not; one without a run id (a from-hf checkpoint's weights, an older version's) adds its
    weights files (index_maps.sampled_contents: 16 MiB each at most)."""
    from megatron import checkpoint

    tag = checkpoint.latest_tag(folder)
    inside = Path(checkpoint.checkpoint_folder(folder, tag))
    files = [inside / checkpoint.RUN_STATE] if (inside / checkpoint.RUN_STATE).is_file() else []
    if checkpoint.run_id(folder, tag) is None:
        files += sorted(inside.glob("*model_states.pt"))
    return [tag, _files_digest(files)]


def hf_identity(folder: str) -> str:
    """Digest of the --init-from-hf `folder`: its config.json and the weights files the run reads (their names,
    sizes and sampled bytes: index_maps.sampled_contents), wherever each node holds it."""
    from megatron.hf_io import hf_weight_files

    return _files_digest([Path(folder) / "config.json", *hf_weight_files(folder)])


def _files_digest(files: list) -> str:
    from megatron.data.index_maps import sampled_contents

    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{Path(path).name}\0".encode())
        sampled_contents(digest, path)
    return digest.hexdigest()[:16]


def flag_names(parser) -> dict:
    """{destination: the flag a user gives} from the parser: the option that takes a value, else the
    switches that set it, as {value: switch} (`--bert-no-binary-head` sets add_binary_head False)."""
    valued, switches = {}, {}
    for action in parser._actions:
        longs = [option for option in action.option_strings if option.startswith("--")]
        if not longs:
            continue
        if action.nargs != 0:
            valued.setdefault(action.dest, longs[0])
        else:
            switches.setdefault(action.dest, {}).setdefault(getattr(action, "const", None), longs[0])
    return {**switches, **valued}


def different_settings(every: list, hosts: list, names: dict) -> ConfigError | None:
    """The error naming the first setting (`names`: flag_names) whose value on a rank is not rank 0's,
    with the rank, both hosts, and the other settings that rank has otherwise; None when all agree.
    `every`: launch_settings per rank, `hosts`: each rank's host name."""
    first = every[0]
    for rank, theirs in enumerate(every[1:], start=1):
        code = [name for name in {**first, **theirs} if name.startswith(CODE) and first.get(name) != theirs.get(name)]
        if code:  # first: other code may read the same flags otherwise, or give them other defaults
            code.sort(key=lambda name: name != CODE + SOURCES)
            label = [_code_label(name) for name in code]
            also = f" (also {', '.join(label[1:])})" if code[1:] else ""
            return ConfigError(f"the ranks run other code: {label[0]} is {first.get(code[0], 'absent')} on rank 0 "
                               f"({hosts[0]}) but {theirs.get(code[0], 'absent')} on rank {rank} ({hosts[rank]}){also}",
                               CODE_FIX)
        differ = [name for name in {**first, **theirs} if first.get(name, ABSENT) != theirs.get(name, ABSENT)
                  and not name.startswith(CONTENT) and not _same_content(name, first, theirs)]
        other_files = [name for name in BY_CONTENT if CONTENT + name in first and CONTENT + name in theirs
                       and first[CONTENT + name] != theirs[CONTENT + name] and name not in differ]
        if other_files:  # the same path, other files behind it on that node
            name = other_files[0]
            return ConfigError(f"the ranks were launched with other files under the same path: "
                               f"{_label(name, names)} {_shown(first[name], name, names)} holds other contents on "
                               f"rank {rank} ({hosts[rank]}) than on rank 0 ({hosts[0]})", CONTENT_FIX)
        if not differ:
            continue
        differ.sort(key=lambda name: name.startswith("json:"))  # a flag before the JSON key it fills
        name = differ[0]
        more = [_label(other, names) for other in differ[1:]]
        also = ""
        if more:
            also = f" (also {', '.join(more[:NAMED])}{f' and {len(more) - NAMED} more' if len(more) > NAMED else ''})"
        held = " (other contents)" if CONTENT + name in first and CONTENT + name in theirs else ""
        return ConfigError(f"the ranks were launched with different settings: {_label(name, names)} is "
                           f"{_shown(first.get(name, ABSENT), name, names)} on rank 0 ({hosts[0]}) but "
                           f"{_shown(theirs.get(name, ABSENT), name, names)} on rank {rank} ({hosts[rank]}){held}"
                           f"{also}", FIX + (SHARED_FOLDER_FIX if {"save", "load"} & set(differ) else ""))
    return None


def _same_content(name: str, first: dict, theirs: dict) -> bool:
    """Whether BY_CONTENT flag `name` names files holding the same on both ranks (both identities known)."""
    key = CONTENT + name
    return name in BY_CONTENT and key in first and key in theirs and first[key] == theirs[key]


def _code_label(name: str) -> str:
    if name == CODE + SOURCES:
        return "the trainer's sources (digest of megatron/, pretrain_bert.py)"
    return name[len(CODE):]


def _label(name: str, names: dict) -> str:
    if name.startswith("json:"):
        return f"the DeepSpeed JSON's {name[5:]}"
    given = names.get(name, "--" + name.replace("_", "-"))
    return given if isinstance(given, str) else " / ".join(given.values())


def _shown(value, name: str, names: dict) -> str:
    """`value` as a user gave it: the switch that sets it (a switch's destination), `not given`, `absent`
    (a JSON key)."""
    if value is ABSENT:
        return "absent"
    switches = names.get(name)
    if isinstance(switches, dict) and isinstance(value, (bool, int, float, str)) and value in switches:
        return "given" if len(switches) == 1 else switches[value]
    if value is None and not name.startswith("json:"):
        return "not given"
    if value == "" or isinstance(value, dict):
        return json.dumps(value)
    return str(value)


def settings_digest(settings: dict) -> str:
    """sha256 of what must agree among a rank's `settings` (with its content_identities): a BY_CONTENT flag by
    its files' identity where known, not by its path."""
    compared = {name: value for name, value in settings.items()
                if not (name in BY_CONTENT and CONTENT + name in settings)}
    return hashlib.sha256(json.dumps(compared, sort_keys=True, default=repr).encode()).hexdigest()


def check_same_settings(settings: dict, names) -> None:
    """Raises different_settings' error on every rank when a rank's `settings` (launch_settings) are not
    rank 0's: a digest per rank is gathered (one small collective), the settings themselves only when the
    digests differ. `names`: a callable giving flag_names, called only then."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    settings = {**settings, **content_identities(settings), **code_identity()}
    digest = settings_digest(settings)
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (digest, socket.gethostname()))
    if len({digest for digest, _ in gathered}) == 1:
        return
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, settings)
    error = different_settings(every, [host for _, host in gathered], names())
    if error is None:  # one rank's identity unknown (a file it cannot read), its path text alike: the checks name it
        return
    error.by_rank_0 = True  # every rank raises it together: rank 0 prints it (peers.report_once)
    raise error

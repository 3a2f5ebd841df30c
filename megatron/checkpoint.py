"""Checkpoints through DeepSpeed's engine: their tags and `latest`, the run state stored beside
DeepSpeed's files, and `load`, which restores a checkpoint into an engine of this run's layout or another.

A checkpoint (megatron.checkpoint_save writes it) holds, under tag `iter_XXXXXXX`: DeepSpeed's model /
optimizer / ZeRO files, the resolved config, the iteration and consumed samples (client state, and
`run_state.json` so they can be read without unpickling), and each rank's RNG states (`rng_rank{N}.pt`;
DeepSpeed keeps only one rank's client state). `load` restores all of it into an engine of the same layout.

Safe loading: our own files (RNG states, run state, weights-only and pipeline layer files) are
read with `torch.load(weights_only=True)`; DeepSpeed unpickles its model / optimizer states in
full (`TorchCheckpointEngine.load`, weights_only=False), so load only checkpoints you trust.

Other layouts: a checkpoint also holds, per pipeline stage, `layout_free_stage{k}.pt` (optimizer_state.gather:
fp32 weights and Adam moments in BertModel names, Adam's step, the optimizer's settings and loss scale, the LR
schedule, DeepSpeed's counters). `load` reads DeepSpeed's files when the layout allows (same pipeline
degree, precision and ZeRO partitioning), else these, so a run continues at another pipeline degree,
SP/data degree or ZeRO stage 0-2.

Writing a checkpoint and the --save folder's start-up checks are megatron.checkpoint_save's (the
folder's lock megatron.locks'); reading the weights of any layout back into BertModel names is
megatron.checkpoint_weights'; whether a checkpoint's model and optimizer fit this run's is
megatron.checkpoint_compat's.
"""
import contextlib
import glob
import json
import os
import pickle
import re
import shlex
import sys
import typing
import zipfile

import torch
import torch.distributed as dist

from megatron import optimizer_state, paths
from megatron.checkpoint_compat import (NEW_RUN_FIX, check_same_grouping, check_same_model, check_same_optimizer,
                                       refuse_clipped_into_unnormed)
from megatron.config import TrainConfig, strict_json_loads
from megatron.data import tokenizer_identity
from megatron.data.bert_dataset import split_weights
from megatron.ds_schema import precision
from megatron.errors import ConfigError, DataError
from megatron.model.args import MODEL_PRESETS, BertConfig
from megatron.schedule import Schedule

LATEST = "latest"
RUN_STATE = "run_state.json"
ORIGIN = "weights_from"  # in RUN_STATE: {"from": path or None (scratch), "kind", "sha256"} of the run's start
PARENT = "parent"  # in RUN_STATE: the tag of the same folder its run continued from (checkpoint_save.lineage)
RUN_ID = "run_id"  # in ORIGIN: made when a run starts (start_plan.weights_origin), kept by its resumes
# in RUN_STATE: {"log_dir": absolute path, "tensorboard_dir": absolute path or None} of the run that saved it, which
# a resume into other folders names (run_log.split_logs_warning)
LOGS = "logs"
# in RUN_STATE of a stop's checkpoint: true when the stop cut the validation after its iteration short, which
# a resume computes before its first step (training.train_steps)
VALIDATION_CUT = "validation_cut"
# in RUN_STATE: true once the run that saved it ended there, its final validation and test losses logged
# (training.end_run): the same command again has nothing to train or evaluate (training.ended_run)
RUN_ENDED = "run_ended"
# in ORIGIN of a run from scratch: it stores its own max_position_embeddings (a flag's, or its --seq-length with
# rope: config.rope_positions), never a preset's; a checkpoint saved before that lacks it (declared_positions)
OWN_POSITIONS = "own_positions"
LAYOUT_FREE = "layout_free_stage{stage}.pt"
PARTIAL = ".partial"
REMOVING = ".removing"  # an old checkpoint being removed by --keep-last
# the folder of a save (PARTIAL) or a --keep-last removal (REMOVING) that did not finish: never a checkpoint
UNFINISHED = re.compile(rf"iter_\d+({re.escape(PARTIAL)}|{re.escape(REMOVING)})")
# what torch.load raises on a truncated or overwritten file
UNREADABLE = (EOFError, pickle.UnpicklingError, zipfile.BadZipFile, RuntimeError, ValueError, OSError)


def tag_for(iteration: int) -> str:
    return f"iter_{iteration:07d}"


def complete_tags(folder: str) -> list[str]:
    """The iter_* folders of `folder` holding DeepSpeed's model states, by iteration."""
    found = {os.path.basename(os.path.dirname(path))
             for path in glob.glob(os.path.join(glob.escape(folder), "iter_*", "*model_states.pt"))}
    return sorted((tag for tag in found if re.fullmatch(r"iter_\d+", tag)), key=tag_iteration)


def tag_iteration(tag: str) -> int:
    return int(tag[len("iter_"):])


def unfinished_tags(folder: str) -> list[str]:
    """The iter_N.partial / iter_N.removing folders of `folder`: saves or --keep-last removals that were
    killed (checkpoint_save.remove_killed_saves removes them at a run's start)."""
    with contextlib.suppress(OSError):
        return sorted(name for name in os.listdir(folder)
                      if UNFINISHED.fullmatch(name) and os.path.isdir(os.path.join(folder, name)))
    return []


def unfinished(tag: str) -> str:
    """What the folder of an unfinished tag is, for a line naming it."""
    return f"a {'--keep-last removal' if tag.endswith(REMOVING) else 'save'} that did not finish (interrupted)"


def refuse_unfinished_only(load_dir: str, flag: str = "--load", reader: bool = False) -> None:
    """Refuses a --save directory with no `latest` whose only iter_* folders are unfinished (a first save
    that was killed), naming them. The trainer (`reader` False) can start afresh; a reader (fill_mask,
    to-hf, extend_context.py) needs a run to finish a save first."""
    left = unfinished_tags(load_dir)
    if not left or complete_tags(load_dir) or os.path.isfile(os.path.join(load_dir, LATEST)):
        return
    names = ", ".join(left)
    problem = (f"no checkpoint in {load_dir}: {names} {'is' if len(left) == 1 else 'are'} "
               f"{unfinished(left[0]) if len(left) == 1 else 'the folders of saves that did not finish'}")
    if reader:
        fix = f"let the run that saves into {load_dir} finish a save (at --save-interval or its end), then rerun"
    else:
        fix = (f"start without {flag} (a run with --save {load_dir} removes {'it' if len(left) == 1 else 'them'} "
               f"at its start), or delete {os.path.join(load_dir, left[0])}{' and the others' * (len(left) > 1)}")
    raise DataError(problem, fix)


def refuse_tag_folder(folder: str, flag: str = "--load", tag_flag: str | None = None) -> None:
    """Refuses one iter_* folder of a --save directory given for the directory, naming the directory:
    `flag` (--load, extend_context.py's --from) takes the one whose `latest` names the checkpoint. A
    read-only tool with a `tag_flag` (to-hf's --tag) names that instead: editing `latest` only to read an
    older checkpoint would roll the next resume of that run back."""
    parent, tag = os.path.split(os.path.abspath(folder))  # a relative iter_* has a parent too
    parent = paths.as_written(parent, folder)  # ck for ck/iter_N, . for iter_N
    if UNFINISHED.fullmatch(tag):
        newest = complete_tags(parent)
        raise DataError(f"{folder} is {unfinished(tag)}, not a checkpoint of the --save directory {parent}",
                        _tag_folder_fix(parent, newest[-1], flag, tag_flag) if newest and tag_flag else
                        f"point {flag} at {parent}" if newest else
                        f"{parent} holds no complete checkpoint yet: let its run finish a save first")
    if re.fullmatch(r"iter_\d+", tag) and os.path.isfile(os.path.join(parent, LATEST)):
        # a tag given with each requeue would roll the run back each time: `latest` chooses
        raise ConfigError(f"{folder} is one checkpoint of the --save directory {parent}", _tag_folder_fix(
            parent, tag, flag, tag_flag))


def _tag_folder_fix(parent: str, tag: str, flag: str, tag_flag: str | None) -> str:
    """The fix refuse_tag_folder names: the tool's own tag flag; for the trainer's resume, `latest`; for a
    new run from the weights (extend_context.py --from), a folder of the checkpoint's own, since editing
    `latest` there would roll the other run's next resume back."""
    if tag_flag:
        return f"pass {flag} {parent} {tag_flag} {tag}"
    if flag == "--load":
        return f"point --load at {parent} (its '{LATEST}' names the checkpoint to read: write {tag} into it to " \
               "resume this one)"
    return (f"point {flag} at {parent} to start from the checkpoint its '{LATEST}' names; to start from {tag}, "
            f"copy {os.path.join(parent, tag)} into a folder of its own beside a '{LATEST}' file holding {tag}, "
            f"and point {flag} there (editing {parent}'s '{LATEST}' would roll that run's next resume back)")


def chosen_tag(load_dir: str, tag: str | None) -> str:
    """The checkpoint a read-only tool (to-hf, to-torch, fill_mask) reads from its --load and --tag:
    `latest`'s without a --tag. A tag is a folder name of load_dir: one with a path in it ('../other/iter_N')
    would read another run's checkpoint under this one's name."""
    refuse_tag_folder(load_dir, tag_flag="--tag")
    if tag is None:
        refuse_unfinished_only(load_dir, reader=True)
        return latest_tag(load_dir)
    if tag in ("", ".", "..") or any(sep and sep in tag for sep in ("/", os.sep, os.altsep)):
        raise ConfigError(f"--tag {tag} is not the name of a checkpoint folder of {load_dir}",
                          f"pass the name of one of its iter_* folders{newest_hint(load_dir)}, and --load the "
                          "--save directory holding it")
    if tag == LATEST:  # the file naming the tag, which a tag folder of that name would have been taken for
        raise ConfigError(f"--tag {tag} names the pointer file of {load_dir}, not a checkpoint folder",
                          f"leave --tag out to read the checkpoint '{LATEST}' names, or pass --tag iter_N (or N)"
                          f"{newest_hint(load_dir)}")
    number = re.fullmatch(r"(?:iter_)?(\d+)", tag)  # Megatron's --ckpt-step N, or iter_N unpadded
    if number and not os.path.isdir(os.path.join(load_dir, tag)):
        return tag_for(int(number.group(1)))  # read_from's line names the folder read
    if UNFINISHED.fullmatch(tag):  # its files may be half-written: never read, even where they load
        newest = newest_hint(load_dir)
        raise DataError(f"--tag {tag} is {unfinished(tag)}, never a checkpoint",
                        f"pass --tag of a complete iter_* folder of {load_dir}{newest}" if newest else
                        f"{load_dir} holds no complete checkpoint yet: let its run finish a save first")
    return tag


def refuse_log_dir(folder: str, flag: str = "--load") -> None:
    """Refuses the --log-dir of a run of this trainer given where its checkpoint belongs: that folder's
    config.json (the resolved config) would otherwise pass for a Hugging Face model's. The fix names the
    run's --save folder where the log's start records kept it, unless that is this folder (a --log-dir
    equal to --save before the run's first save: it would name itself)."""
    config = os.path.join(folder, "config.json")
    if not (os.path.isfile(os.path.join(folder, "metrics.jsonl")) or _is_resolved_config(config)):
        return
    saved = _logged_save_dir(os.path.join(folder, "metrics.jsonl"))
    if saved and os.path.realpath(saved) == os.path.realpath(folder):  # --log-dir = --save, before its first save
        raise ConfigError(f"{folder} is the --log-dir and --save folder of a run of this trainer that has saved no "
                          f"checkpoint yet (no '{LATEST}')", f"pass it with {flag} once that run has saved one (at "
                          "--save-interval and at its end)")
    raise ConfigError(f"{folder} is the --log-dir of a run of this trainer (metrics.jsonl, config.json), not its "
                      f"checkpoint", f"pass the run's --save folder{f' ({saved})' if saved else ''} with {flag}")


def _is_resolved_config(path: str) -> bool:
    """Whether `path` is the config.json a run writes into its --log-dir (run_log.RunLog.config)."""
    try:
        with open(path, encoding="utf-8") as file:
            config = json.load(file)
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and {"ds_config", "model", "micro_batch_size"} <= config.keys()


def _logged_save_dir(metrics: str) -> str | None:
    """The --save folder the newest start record of a metrics.jsonl names, if any."""
    saved = None
    with contextlib.suppress(OSError):
        with open(metrics, encoding="utf-8", errors="replace") as file:
            for line in file:
                with contextlib.suppress(ValueError):
                    record = json.loads(line)
                    if isinstance(record, dict) and record.get("kind") == "start" and record.get("save"):
                        saved = record["save"]
    return saved


def run_id(folder: str | None, tag: str | None = None) -> str | None:
    """The run id (RUN_ID) of checkpoint `tag` of `folder` (default: its latest), which tells one run's
    checkpoints and logs from another's wherever they were moved or copied; None where none can be read: no
    folder or checkpoint, one saved before runs had an id, or an unreadable one (which the start-up names)."""
    if not folder:
        return None
    with contextlib.suppress(OSError, ConfigError):  # DataError too
        found = run_state(folder, tag or latest_tag(folder)).get(ORIGIN, {}).get(RUN_ID)
        return found if isinstance(found, str) else None
    return None


def latest_tag(load_dir: str) -> str:
    path = os.path.join(load_dir, LATEST)
    if os.path.isfile(load_dir):
        raise ConfigError(f"{load_dir} is a file, not a checkpoint directory",
                          "point --load at the directory a run wrote with --save")
    refuse_odd_latest(load_dir)
    if not os.path.isfile(path):
        refuse_tag_folder(load_dir)
        refuse_unfinished_only(load_dir)
        refuse_log_dir(load_dir)
        if os.path.isfile(os.path.join(load_dir, "config.json")):  # the trainer reads it with another flag
            raise ConfigError(f"{load_dir} is a Hugging Face model folder, not a checkpoint of this trainer (it has no "
                              f"'{LATEST}')", f"pass it to pretrain_bert.py with --init-from-hf in place of --load, or "
                              f"convert it first: {paths.python_command()} "
                              f"{paths.in_repository('tools/convert_checkpoint.py')} from-hf --hf-dir {load_dir} "
                              "--save DIR")
        inside = sorted(os.path.dirname(found) for found in glob.glob(os.path.join(glob.escape(load_dir), "*", LATEST)))
        newest = newest_hint(load_dir)
        raise ConfigError(f"no checkpoint in {load_dir} (missing '{LATEST}')",
                          f"point --load at {inside[0]}, which holds one" if inside else
                          f"write the tag to resume into {path}{newest}" if newest else
                          "point --load at a directory written by --save")
    tag = read_latest(load_dir)
    if not tag:  # else it would name the directory itself, "incomplete"
        raise DataError(f"the '{LATEST}' file of {load_dir} is empty: it names no checkpoint",
                        f"write the tag of a complete iter_* folder of {load_dir} into it{newest_hint(load_dir)}")
    if tag.endswith((PARTIAL, REMOVING)):  # the start-up removes such a folder (checkpoint_save.remove_killed_saves)
        raise DataError(f"the '{LATEST}' file of {load_dir} names {tag}, the folder of a save or removal that did "
                        "not finish, never a checkpoint", f"write the tag of a complete iter_* folder of {load_dir} "
                        f"into it{newest_hint(load_dir)}")
    return tag


def read_latest(load_dir: str) -> str:
    """The tag the `latest` file of load_dir holds, stripped. Bytes that are not UTF-8 text (a disk error, a
    binary file copied over it) or a file that cannot be read are one line naming it, not a traceback."""
    path = os.path.join(load_dir, LATEST)
    try:
        return _latest_text(load_dir)
    except UnicodeDecodeError:
        problem = f"{path} is not a checkpoint tag (it is not text)"
    except OSError as error:
        problem = f"{path} cannot be read ({error.strerror or type(error).__name__})"
    raise DataError(problem, f"write the tag of a complete iter_* folder of {load_dir} into it{newest_hint(load_dir)}")


def _latest_text(load_dir: str) -> str:
    with open(os.path.join(load_dir, LATEST), "rb") as file:
        return file.read().decode("utf-8").strip()


def refuse_odd_latest(load_dir: str) -> None:
    """Refuses a `latest` of load_dir that is not a file: a link to the iter_* folder (other frameworks'
    habit), a folder, a link to nothing. It is there, so "missing 'latest'" would mislead, and writing a tag
    into it (the usual fix) fails on a link to a folder: the fix replaces it with the file that names the
    tag (the one it links to, where that is a complete checkpoint of load_dir, else the newest)."""
    path = os.path.join(load_dir, LATEST)
    if os.path.isfile(path) or not os.path.lexists(path):
        return
    linked = os.path.realpath(path)
    tags = complete_tags(load_dir)
    own = os.path.basename(linked) if os.path.dirname(linked) == os.path.realpath(load_dir) else None
    tag = own if own in tags else tags[-1] if tags else None
    if os.path.islink(path):
        target = os.readlink(path)
        what = (f"a link to the folder {target}" if os.path.isdir(path) else f"a link to {target}"
                f"{'' if os.path.exists(path) else ', which does not exist'}")
        remove = f"rm {shlex.quote(path)}"
    else:
        what = "a folder" if os.path.isdir(path) else "not a regular file"
        remove = f"mv {shlex.quote(path)} {shlex.quote(path + '.old')}"
    problem = f"{path} is {what}, not a file holding the tag of a checkpoint"
    if tag is None:
        raise DataError(problem, f"{remove} ({load_dir} holds no complete iter_* checkpoint to name)")
    raise DataError(problem, f"replace it with a file naming {tag}: {remove} && echo {tag} > {shlex.quote(path)}")


def newest_hint(load_dir: str) -> str:
    """' (the newest: iter_N)' of the complete iter_* folders in load_dir, '' without one: for a fix naming a tag.
    After a rollback (`latest` set back to an older complete one) the one `latest` names: the newer ones are of
    the run rolled back from."""
    tags = complete_tags(load_dir)
    named = rolled_back_to(load_dir, tags)
    return f" (the one '{LATEST}' names: {named})" if named else f" (the newest: {tags[-1]})" if tags else ""


def rolled_back_to(load_dir: str, tags: list[str]) -> str | None:
    """The tag `latest` names where that is a complete checkpoint older than the newest of `tags` (a rollback),
    else None (also for a `latest` that cannot be read)."""
    with contextlib.suppress(OSError, UnicodeDecodeError):  # not read_latest: its error's fix names this hint
        named = _latest_text(load_dir)
        if named in tags and named != tags[-1]:
            return named
    return None


def checkpoint_folder(load_dir: str, tag: str) -> str:
    """The tag's folder, checked to exist and to hold DeepSpeed's model states. A tag that `latest`
    does not name came from the caller (to-hf --tag): the error then does not blame `latest`."""
    folder = os.path.join(load_dir, tag)
    if os.path.isdir(folder) and glob.glob(os.path.join(folder, "*model_states.pt")):
        return folder
    latest, named = os.path.join(load_dir, LATEST), False
    if os.path.isfile(latest):
        named = read_latest(load_dir) == tag
    problem = (f"{f' named by {latest}' if named else ''} does not exist" if not os.path.isdir(folder)
               else " is incomplete (no *model_states.pt)")
    raise DataError(f"checkpoint folder {folder}{problem}",
                    (f"restore it, or write the tag of a complete iter_* folder of {load_dir} into '{LATEST}'"
                     if named else f"pass the tag of a complete iter_* folder of {load_dir}") + newest_hint(load_dir))


def safe_load(path: str):
    """torch.load of a file that holds only tensors and plain containers; one-line errors."""
    if not os.path.isfile(path):
        raise DataError(f"checkpoint file {path} is missing", "restore it or resume from a complete checkpoint")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except UNREADABLE as error:
        raise DataError(f"checkpoint file {path} cannot be read ({read_failure(error, 'truncated')})",
                        "restore it or resume from an earlier complete checkpoint") from None


def read_failure(error: Exception, empty: str) -> str:
    """'Type: first sentence' of what torch.load raised (`empty`: for a message-less one): torch's miniz
    error goes on with a paragraph of advice after 'failed finding central directory.'"""
    first = re.split(r"(?<=\.) ", (str(error).splitlines() or [empty])[0])[0]
    return f"{type(error).__name__}: {first}"


def _numbers(values) -> bool:
    return all(isinstance(value, (int, float)) and not isinstance(value, bool) for value in values)


def _data_record_problem(record) -> tuple[str, object] | None:
    """(key, value) of the first part of a run state's "data" that is not the shape resume.data_settings writes
    (None: it is): [[weight, fingerprint], ...], the paths (one prefix, or a weight and a prefix per dataset), the
    split's shares (one per weight of --split) and flag, the seed (and the masking and short-sample share, which
    older records lack: not checked)."""
    if not isinstance(record, dict):
        return "data", record
    data, split, data_path = record.get("data"), record.get("split"), record.get("data_path")
    if not isinstance(data, list) or not data or not all(
            isinstance(entry, list) and len(entry) == 2 and _numbers(entry[:1]) and isinstance(entry[1], str)
            for entry in data):
        return "data.data", data
    if not isinstance(data_path, list) or not all(isinstance(part, str) for part in data_path) or \
            len(data_path) not in {2 * len(data), 1 if len(data) == 1 else 2}:
        return "data.data_path", data_path
    if not isinstance(record.get("split_flag"), str):
        return "data.split_flag", record.get("split_flag")
    if not isinstance(split, list) or not _numbers(split) or len(split) != len(split_weights(record["split_flag"])):
        return "data.split", split
    for key in ("seed", "short_seq_prob", "mask_prob"):
        if (key in record or key == "seed") and not _numbers([record.get(key)]):
            return f"data.{key}", record.get(key)
    if not isinstance(record.get("whole_word_masking", False), bool):
        return "data.whole_word_masking", record["whole_word_masking"]
    return None


# what each field's value must be, by its type, for a line naming it
KIND_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string", dict: "an object"}


def _misshapen_field(state: dict) -> tuple[str, object, str] | None:
    """(key, value, what it must be) of the first value of a run state's config, config.model or schedule that is
    not of its field's type (TrainConfig's, BertConfig's, Schedule's; an integer passes for a float, null where
    the field takes None): a hand-edited run_state.json (a size as a list, a count as a string) stopped a
    resume with a TypeError deep in the layout or schedule arithmetic, or passed into the next checkpoint.
    Keys a field of this version lacks (an older or newer record's) are not checked."""
    for where, cls, stored in (("config", TrainConfig, state["config"]), ("config.model", BertConfig,
                                                                           state["config"]["model"]),
                               ("schedule", Schedule, state.get("schedule", {}))):
        if not isinstance(stored, dict):
            return where, stored, KIND_NAMES[dict]
        for name, hint in typing.get_type_hints(cls).items():
            if name not in stored or name == "model":
                continue
            kinds = set(typing.get_args(hint)) or {hint}
            value = stored[name]
            if value is None and type(None) in kinds:
                continue
            kind = next(kind for kind in kinds if kind is not type(None))
            fits = isinstance(value, bool) if kind is bool else _numbers([value]) and (
                kind is float or isinstance(value, int)) if kind in (int, float) else isinstance(value, kind)
            if not fits:
                return f"{where}.{name}", value, KIND_NAMES.get(kind, kind.__name__)
    return None


def run_state(load_dir: str, tag: str) -> dict:
    """{"config", "iteration", "consumed_samples"} of a checkpoint, plus "weights_only": True for
    one written by tools/convert_checkpoint.py from-hf (no optimizer, engine or RNG state)."""
    folder = checkpoint_folder(load_dir, tag)
    path = os.path.join(folder, RUN_STATE)
    if os.path.isfile(path):
        fix = "restore it or resume from an earlier complete checkpoint"
        try:
            with open(path, encoding="utf-8") as file:
                state = strict_json_loads(file.read(), f"checkpoint file {path}")
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise DataError(f"checkpoint file {path} is not valid JSON ({error.__class__.__name__}: "
                            f"{str(error).splitlines()[0]}): truncated or overwritten", fix) from None
        except ConfigError as error:  # NaN / Infinity or a repeated key: written by something else
            raise DataError(error.problem, fix) from None
        if not isinstance(state, dict):
            raise DataError(f"checkpoint file {path} holds no JSON object", fix)
        for key, kind in (("config", dict), ("iteration", int), ("consumed_samples", int)):
            value = state.get(key)
            if not isinstance(value, kind) or isinstance(value, bool) or (kind is int and value < 0):
                found = "nothing" if key not in state else json.dumps(value)[:40]
                raise DataError(f"checkpoint file {path} holds {found} as {key}, not "
                                f"{'an object' if kind is dict else 'a count'}", fix)
        if not isinstance(state["config"].get("model"), dict):  # every reader of the weights builds the model from it
            found = json.dumps(state["config"]["model"])[:40] if "model" in state["config"] else "nothing"
            raise DataError(f"checkpoint file {path} holds {found} as config.model, not the object of the model's "
                            "settings", fix)
        misshapen = _misshapen_field(state)
        if misshapen:
            key, value, kind = misshapen
            raise DataError(f"checkpoint file {path} holds {json.dumps(value)[:40]} as {key}, not {kind}", fix)
        problem = "data" in state and _data_record_problem(state["data"])
        if problem:
            raise DataError(f"checkpoint file {path} holds {json.dumps(problem[1])[:40]} as {problem[0]}, not the "
                            "record of the data it trained on", f"{fix}, or delete its \"data\" entry to resume "
                            "without comparing the data")
        logs = state.get(LOGS, {})
        if not (isinstance(logs, dict) and all(isinstance(value, (str, type(None))) for value in logs.values())):
            raise DataError(f"checkpoint file {path} holds {json.dumps(logs)[:40]} as {LOGS}, not the record of the "
                            "folders its run logged into", f"{fix}, or delete its \"{LOGS}\" entry")
        origin = state.get(ORIGIN, {"from": None})
        if not (isinstance(origin, dict) and isinstance(origin.get("from"), (str, type(None)))
                and all(isinstance(origin.get(key, ""), str) for key in ("kind", "sha256", RUN_ID))):
            raise DataError(f"checkpoint file {path} holds {json.dumps(origin)[:40]} as {ORIGIN}, not the record of "
                            "the weights its run started from", f"{fix}, or delete its \"{ORIGIN}\" entry")
        return state
    states = sorted(glob.glob(os.path.join(folder, "*mp_rank_00_model_states.pt")))
    stored = safe_load(states[0]) if states else None
    if stored and "schedule" in stored:  # recorded since after run_state.json was: a copy that lost the file
        raise DataError(f"checkpoint file {path} is missing",
                        "restore it or resume from an earlier complete checkpoint")
    if not stored or "config" not in stored or len(states) > 1 or "zero_pp" in states[0]:
        raise DataError(f"checkpoint folder {folder} has no {RUN_STATE}",
                        "point at a checkpoint written by this trainer")
    return {key: value for key, value in stored.items() if key != "module"}


def read_from(load_dir: str, tag: str) -> str:
    """'DIR/iter_N (iteration N)': the checkpoint a tool read, for its output line: `latest` moves on while a run
    saves into DIR, so the folder alone would not say which. A tag beyond the one a rollback set `latest` to is
    said to be of the run rolled back from."""
    named = rolled_back_to(load_dir, complete_tags(load_dir))
    beyond = (f"; '{LATEST}' names the older {named}: this one is of the run rolled back from"
              if named and tag_iteration(tag) > tag_iteration(named) else "")
    return f"{os.path.join(load_dir, tag)} (iteration {run_state(load_dir, tag)['iteration']}{beyond})"


def carried_tokenizer(load_dir: str, tag: str | None = None, stand_in=None):
    """The tokenizer the checkpoint carries (None: saved before checkpoints carried one); `stand_in`: the
    flags' tokenizer, used in place of a carried file that is gone if it is the one recorded."""
    return tokenizer_identity.carried_tokenizer(checkpoint_folder(load_dir, tag or latest_tag(load_dir)), stand_in)


def refuse_non_finite(tensors: dict, source: str, fix: str) -> None:
    """The first tensor of `tensors` (weights a run starts from, read from `source`) holding NaN or inf:
    one line naming it, as the first step's loss would be NaN whatever the learning rate or batch."""
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise DataError(f"tensor {name} of {source} holds {bad} of {tensor.numel()} values that are NaN or inf",
                            fix)


def stored_config(load_dir: str, tag: str) -> dict:
    """The resolved config saved with the checkpoint (TrainConfig.to_dict())."""
    return run_state(load_dir, tag)["config"]


# the presets' max_position_embeddings: what a rotary run from scratch stored before runs set the field
# to their --seq-length
_PRESET_POSITIONS = {preset["max_position_embeddings"] for preset in MODEL_PRESETS.values()}


def declared_positions(load_dir: str, tag: str) -> int:
    """The max_position_embeddings of a checkpoint's model as its Hugging Face export declares it and a
    run from its weights carries it: a position table's rows; with rope, which has no table, the longest
    length known trained: the field (a folder's, which a shorter fine-tune keeps) or --seq-length where
    longer (a run continued at a longer length than its weights'), and --seq-length alone for a run from
    scratch that stored a preset's 8192 before runs stored their length (positions it never trained; a
    later run's ORIGIN says OWN_POSITIONS: its 8192 is a --max-position-embeddings it was given)."""
    state = run_state(load_dir, tag)
    model = state["config"]["model"]
    positions, length = model["max_position_embeddings"], model["seq_length"]
    if model.get("position_embedding_type") != "rope":
        return positions
    origin = state.get(ORIGIN)
    preset_stored = isinstance(origin, dict) and origin.get("from") is None and not origin.get(OWN_POSITIONS)
    if preset_stored and positions > length and positions in _PRESET_POSITIONS:
        return length
    return max(positions, length)


@contextlib.contextmanager
def _one_line_read_errors(engine):
    """DeepSpeed's file reads, with a missing or corrupt file reported as a DataError naming it."""
    reader = engine.checkpoint_engine
    original = reader.load

    def load(path, map_location=None):
        if not os.path.isfile(path):
            raise DataError(f"checkpoint file {path} is missing", "restore it or resume from a complete checkpoint")
        try:
            return original(path, map_location=map_location)
        except UNREADABLE as error:
            raise DataError(f"checkpoint file {path} cannot be read ({type(error).__name__})",
                            "restore it or resume from an earlier complete checkpoint") from None

    reader.load = load
    try:
        yield
    finally:
        reader.load = original


def _rng_state(folder: str, stored: dict, load_rng: bool) -> dict | None:
    """This rank's RNG states: rng_rank{r}.pt, r = this rank modulo the checkpoint's world size
    (the rank itself in the same world). Read on every rank before anything is loaded; a missing or
    unreadable file on any rank stops all of them with the same line. load_rng False: none, with
    one warning (--no-load-rng)."""
    if not load_rng:
        if dist.get_rank() == 0:
            print(f"warning: --no-load-rng: the RNG states of {folder} are not restored; this run is no longer "
                  "bit-exact with an uninterrupted one (its dropout draws differ)", file=sys.stderr, flush=True)
        return None
    world = stored["pipeline_parallel_size"] * stored["data_parallel_size"] * stored["sequence_parallel_size"]
    path = os.path.join(folder, f"rng_rank{dist.get_rank() % world}.pt")
    state, problem = None, None
    try:
        state = safe_load(path)
        if not isinstance(state, dict) or getattr(state.get("cpu"), "dtype", None) != torch.uint8:
            problem = f"checkpoint file {path} holds no RNG state"
    except DataError as error:
        problem = error.problem
    problems = [None] * dist.get_world_size()
    dist.all_gather_object(problems, problem)
    found = next((text for text in problems if text), None)
    if found:
        raise DataError(found, "restore it, resume from an earlier complete checkpoint, or pass --no-load-rng to go "
                        "on without the saved RNG states (the run is then no longer bit-exact)")
    return state


def load(engine, load_dir: str, config: TrainConfig, load_rng: bool = True) -> dict:
    """Restores engine state and this rank's RNG (load_rng False: not the RNG, with a warning);
    returns the run state (iteration, ...)."""
    tag = latest_tag(load_dir)
    folder = checkpoint_folder(load_dir, tag)
    state = run_state(load_dir, tag)
    check_same_model(state["config"]["model"], config.model, folder)
    check_same_optimizer(state["config"], config.ds_config, folder)
    check_same_grouping(state["config"], config, folder)
    rng_state = _rng_state(folder, state["config"], load_rng)
    if same_layout(state["config"], config.to_dict()):
        if config.zero_stage in (1, 2):
            refuse_clipped_into_unnormed(state["config"], config.ds_config, folder)
        with _one_line_read_errors(engine), torch.no_grad():  # a pipeline's load broadcasts the tied embedding
            path, _ = engine.load_checkpoint(load_dir, tag=tag)
        if path is None:
            raise DataError(f"checkpoint {folder} could not be loaded", "check that the folder is complete")
        if hasattr(engine.optimizer, "clip_grad"):  # ZeRO 1/2's and the bf16 optimizer's load restored the
            engine.optimizer.clip_grad = engine.gradient_clipping()  # checkpoint's: the run's, as on other paths
    else:
        _load_layout_free(engine, config, folder, state["config"])
    if rng_state is not None:
        torch.set_rng_state(rng_state["cpu"])
        if "cuda" in rng_state and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng_state["cuda"])
    return state


def same_layout(stored: dict, current: dict) -> bool:
    """Whether DeepSpeed's own files load as they are: same pipeline degree and precision, and
    the same ZeRO partitioning (ZeRO 0 keeps whole states, independent of data x seq)."""
    def layout(config):
        zero = config["zero_stage"]
        shards = config["data_parallel_size"] * config["sequence_parallel_size"] if zero else 1
        return config["pipeline_parallel_size"], zero, shards, precision(config["ds_config"])
    return layout(stored) == layout(current)


def layout_free_paths(folder: str, stored: dict) -> list[str]:
    """The layout-free file of each pipeline stage of a checkpoint (`stored`: its config)."""
    return [os.path.join(folder, LAYOUT_FREE.format(stage=stage)) for stage in range(stored["pipeline_parallel_size"])]


def _load_layout_free(engine, config: TrainConfig, folder: str, stored: dict) -> None:
    """Loads a checkpoint written in another layout from its layout-free files (weights, Adam
    state, the optimizer's settings and loss scale, LR schedule, counters); DeepSpeed's own files
    are not read."""
    paths = layout_free_paths(folder, stored)
    written = (f"pipeline {stored['pipeline_parallel_size']}, ZeRO {stored['zero_stage']}, data x seq "
               f"{stored['data_parallel_size']} x {stored['sequence_parallel_size']}")
    if not all(os.path.isfile(path) for path in paths):
        raise DataError(f"checkpoint {folder} ({written}, {precision(stored['ds_config'])}) has no "
                        f"{LAYOUT_FREE.format(stage='*')} files to load in another layout",
                        "resume in the layout it was written in")
    stages = [safe_load(path) for path in paths]
    if "param_groups" not in stages[0]:
        raise DataError(f"{paths[0]} was written without the optimizer's settings (learning rate, weight decay, "
                        "loss scale) by an earlier version of this trainer",
                        f"resume in the layout it was written in ({written}, {precision(stored['ds_config'])}), or "
                        f"{NEW_RUN_FIX}")
    merged = {"step": stages[0]["step"], "params": {}, "param_groups": stages[0]["param_groups"],
              "loss_scaler": stages[0]["loss_scaler"]}
    for stage in stages:
        merged["params"].update(stage["params"])
    optimizer_state.scatter(engine, config.model, merged, written)
    if engine.lr_scheduler is not None and stages[0]["lr_scheduler"] is not None:
        engine.lr_scheduler.load_state_dict(stages[0]["lr_scheduler"])
    engine.global_steps, engine.global_samples = stages[0]["global_steps"], stages[0]["global_samples"]
    engine.skipped_steps = stages[0]["skipped_steps"]
    if dist.get_rank() == 0:
        print(f"loaded {folder} written at {written} from its layout-free files (weights, Adam state and settings, "
              "LR schedule)", flush=True)

"""Checkpoints through DeepSpeed's engine, plus what resuming exactly needs beyond it.

`save` stores, under tag `iter_XXXXXXX`: DeepSpeed's model / optimizer / ZeRO files, the
resolved config, the iteration and consumed samples (client state, and `run_state.json` so they
can be read without unpickling), and each rank's RNG states (`rng_rank{N}.pt`; DeepSpeed keeps
only one rank's client state). `load` restores all of it into an engine of the same layout.

Crash consistency: every rank writes into `<tag>.partial`; only when all have finished does
rank 0 rename it to `<tag>` and then replace `latest` (both atomic renames, fsynced), so a run
killed at any moment leaves `latest` naming a complete checkpoint.

Safe loading: our own files (RNG states, run state, weights-only and pipeline layer files) are
read with `torch.load(weights_only=True)`; DeepSpeed unpickles its model / optimizer states in
full (`TorchCheckpointEngine.load`, weights_only=False), so load only checkpoints you trust.

Other layouts: each pipeline stage also writes `layout_free_stage{k}.pt` (optimizer_state.gather:
fp32 weights and Adam moments in BertModel names, Adam's step, the optimizer's settings and loss
scale, the LR schedule, DeepSpeed's counters). `load` reads DeepSpeed's files when the layout allows (same
pipeline degree, precision and ZeRO partitioning), else these, so a run continues at another pipeline degree,
SP/data degree or ZeRO stage 0-2. `bert_state_from_checkpoint` reads the fp32 weights of any layout
back into BertModel names (from these files for a bf16 / fp16 run and at ZeRO 3, else from the plain
model's or the pipeline's layer files).

The --save folder's lock is megatron.locks'; whether a checkpoint's model and optimizer fit this run's
is megatron.checkpoint_compat's.
"""
import contextlib
import errno
import glob
import io
import json
import os
import pickle
import re
import resource
import shutil
import socket
import sys
import warnings
import zipfile

import torch
import torch.distributed as dist

from megatron import optimizer_state, paths
from megatron.checkpoint_compat import check_same_model, check_same_optimizer
from megatron.config import TrainConfig, strict_json_loads
from megatron.data import tokenizer as tokenizers
from megatron.ds_schema import precision
from megatron.errors import ConfigError, DataError, disk_full
from megatron.locks import release_lock, take_lock
from megatron.model.args import MODEL_PRESETS
from megatron.model.pipe import pipe_layer_to_bert
from megatron.parallel import peers, state as parallel_state
from megatron.parallel.launch_env import local_rank

LATEST = "latest"
RUN_STATE = "run_state.json"
ORIGIN = "weights_from"  # in RUN_STATE: {"from": path or None (scratch), "kind", "sha256"} of the run's start
# in ORIGIN of a run from scratch: it stores its own max_position_embeddings (a flag's, or its --seq-length with
# rope: config.rope_positions), never a preset's; a checkpoint saved before that lacks it (declared_positions)
OWN_POSITIONS = "own_positions"
LAYOUT_FREE = "layout_free_stage{stage}.pt"
PARTIAL = ".partial"
FULL_BYTES = 16 * 2**20  # less free space than this after a failed write: the disk is full
REMOVING = ".removing"  # an old checkpoint being removed by --keep-last
# what torch.load raises on a truncated or overwritten file
UNREADABLE = (EOFError, pickle.UnpicklingError, zipfile.BadZipFile, RuntimeError, ValueError, OSError)


def tag_for(iteration: int) -> str:
    return f"iter_{iteration:07d}"


def save(engine, config: TrainConfig, save_dir: str, iteration: int, consumed_samples: int,
         schedule: dict | None = None, keep_last: int | None = None, tokenizer=None, data: dict | None = None,
         origin: dict | None = None) -> str:
    """Saves on every rank; returns the tag once `latest` names it. `schedule`: the learning-rate
    settings of the run (schedule.Schedule.record), compared by a resume, as is `data` (the data it
    reads, resume.data_settings). `origin`: the weights the run started from (start_plan.weights_origin),
    compared by a requeue that names them. `keep_last`: once the
    new checkpoint is committed, rank 0 removes all but the newest that many (prune). `tokenizer`:
    copied in with its identity, so fill-mask, export and a resume need no tokenizer flag."""
    tag, rank = tag_for(iteration), dist.get_rank()
    staging = os.path.join(save_dir, tag + PARTIAL)
    if rank == 0:
        os.makedirs(save_dir, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)  # left by a save that was killed
    dist.barrier()
    run_state = {"config": config.to_dict(), "iteration": iteration, "consumed_samples": consumed_samples,
                 **({"schedule": schedule} if schedule else {}), **({"data": data} if data else {}),
                 **({ORIGIN: origin} if origin else {})}
    problem = None
    try:
        engine.save_checkpoint(save_dir, tag=tag + PARTIAL, client_state=run_state, save_latest=False)
    except (OSError, RuntimeError) as error:  # a full disk: torch.save's `basic_ios::clear: iostream error`
        if peers.lost(error):  # not the disk: another rank ended (training.lost_rank_problem)
            raise
        problem = _write_problem(save_dir, tag, error)
        dist.barrier()  # the one save_checkpoint ends with, which this rank missed

    def rank0_files():
        if rank == 0:
            with open(os.path.join(staging, RUN_STATE), "w") as file:
                json.dump(run_state, file)
            if tokenizer is not None:
                tokenizers.carry(tokenizer, staging)

    for write in (lambda: torch.save(rng_states(), os.path.join(staging, f"rng_rank{rank}.pt")),
                  lambda: _save_layout_free(engine, config, staging),  # collective: every rank calls it
                  rank0_files):
        try:
            write()
        except (OSError, RuntimeError) as error:
            if peers.lost(error):
                raise
            problem = problem or _write_problem(save_dir, tag, error)
    problems = [None] * dist.get_world_size()
    dist.all_gather_object(problems, problem)  # every rank's files are written, or why not
    found = next((found for found in problems if found), None)
    if found:
        if rank == 0:
            shutil.rmtree(staging, ignore_errors=True)  # it would fill the disk further
        dist.barrier()
        raise ConfigError(*found)
    if rank == 0:
        try:
            _commit(save_dir, tag)
        except OSError as error:  # the disk fills at an fsync or at `latest`
            problem = _write_problem(save_dir, tag, error)
        if not problem and glob.glob(os.path.join(save_dir, tag, "layer_*-model_states.pt")):
            replace_recovery_scripts(save_dir)
        if keep_last and not problem:
            removed = prune(save_dir, keep_last)
            if removed:
                print(f"removed checkpoint{'s' if len(removed) > 1 else ''} {', '.join(removed)} of {save_dir} "
                      f"(--keep-last {keep_last})", flush=True)
    committed = [problem]
    # no rank returns (and may save again) while old folders are being removed; all raise alike
    dist.broadcast_object_list(committed, src=0)
    if committed[0]:
        raise ConfigError(*committed[0])
    return tag


RECOVERY_SCRIPTS = ("zero_to_fp32.py", "zero_to_torch.py")  # copied into --save by DeepSpeed's ZeRO saves
CONVERT_TOOL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools",
                            "convert_checkpoint.py")


def replace_recovery_scripts(save_dir: str) -> None:
    """DeepSpeed's RECOVERY_SCRIPTS fail with a traceback on pipeline checkpoints (their model states
    hold no module): after a pipeline save each is replaced by a script whose one line names the
    export that reads every layout (tools/convert_checkpoint.py to-torch)."""
    for name in RECOVERY_SCRIPTS:
        path = os.path.join(save_dir, name)
        if not os.path.isfile(path):
            continue
        # read later, from any folder: the interpreter by its absolute path
        line = (f"{name}: error: {save_dir} holds pipeline checkpoints, which DeepSpeed's {name} cannot read; "
                f"export a plain state dict with {sys.executable} {CONVERT_TOOL} to-torch --load {save_dir} "
                "--output OUT.pt")
        with contextlib.suppress(OSError):  # the checkpoint is committed: a script is no reason to fail the save
            with open(path, "w") as file:
                file.write(f'"""Left by pretrain_bert.py in place of DeepSpeed\'s {name}."""\nimport sys\n\n'
                           f"sys.exit({line!r})\n")


def _write_problem(save_dir: str, tag: str, error: Exception) -> tuple[str, str]:
    """(problem, fix) of a failed checkpoint write. A full disk is named as such: an OSError says
    ENOSPC, torch's writer only `iostream error` / `file write failed`, so little space left on the
    folder's disk (under FULL_BYTES) counts as full too."""
    try:
        free = shutil.disk_usage(save_dir).free
    except OSError:
        free = None
    what = disk_full(error) or ("the disk is full" if not isinstance(error, OSError) and free is not None
                                and free < FULL_BYTES else None)
    kept = (f"'latest' still names {latest_tag(save_dir)}" if os.path.isfile(os.path.join(save_dir, LATEST))
            else "no earlier checkpoint exists")
    where = f"--save {save_dir} on {socket.gethostname()}"
    limit = _file_size_limit(error, os.path.join(save_dir, tag + PARTIAL))
    if limit:
        return (f"cannot write checkpoint {tag}: a file reached this process's file-size limit of {limit} "
                f"(File too large, EFBIG; set by ulimit -f) ({where})",
                f"raise the limit where the run starts (ulimit -f unlimited), then resume; nothing of {tag} was "
                f"kept and {kept}")
    if what:
        free_text = f", {free / 2**20:.1f} MiB free" if free is not None else ""
        return (f"cannot write checkpoint {tag}: {what} ({where}{free_text})",
                f"free space there or pass another --save, then resume; nothing of {tag} was kept and {kept}")
    reason = error.strerror if isinstance(error, OSError) and error.strerror else (
        str(error).splitlines()[0] if str(error) else type(error).__name__)
    return (f"cannot write checkpoint {tag} into {where} ({reason})",
            f"check the folder and its disk, then resume; nothing of {tag} was kept and {kept}")


def _file_size_limit(error: Exception, staging: str) -> str | None:
    """The file-size limit (RLIMIT_FSIZE, `ulimit -f`) as text when it stopped the write: an OSError
    says EFBIG, torch's writer only `enforce fail ... unexpected pos`, so a file of the staging folder
    as large as the limit tells it (its write stopped there)."""
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit == resource.RLIM_INFINITY:
        return None
    if getattr(error, "errno", None) != errno.EFBIG:
        if isinstance(error, OSError):
            return None
        sizes = [os.path.getsize(os.path.join(folder, name)) for folder, _, names in os.walk(staging)
                 for name in names]
        if not sizes or max(sizes) < limit:
            return None
    return f"{limit / 2**20:.1f} MiB"


def prune(save_dir: str, keep_last: int) -> list[str]:
    """Removes the complete `iter_*` folders of `save_dir` beyond the newest `keep_last` (by
    iteration); returns their tags, oldest first. Only the folders up to the one `latest` names
    count: newer ones are left by a rollback (`latest` set back by hand), belong to the abandoned
    run and are replaced by this run's saves at their iterations (the start-up warning names
    them), so they neither count against `keep_last` nor get removed. Never a `<tag>.partial`
    staging folder or anything else. Called by rank 0
    after a commit, between barriers, so no rank is writing. Each folder is first renamed to
    `<tag>.removing` (atomic), so a run killed mid-removal leaves no half iter_* folder that looks
    complete; leftovers of such a kill are removed too."""
    if keep_last < 1:
        raise ValueError(f"keep_last {keep_last} must be >= 1")
    latest = latest_tag(save_dir) if os.path.isfile(os.path.join(save_dir, LATEST)) else None
    tags = sorted((name for name in os.listdir(save_dir)
                   if re.fullmatch(r"iter_\d+", name) and os.path.isdir(os.path.join(save_dir, name))),
                  key=lambda name: int(name[len("iter_"):]))
    if latest in tags:
        tags = tags[:tags.index(latest) + 1]
    removed = tags[:-keep_last]
    for tag in removed:
        doomed = os.path.join(save_dir, tag + REMOVING)
        shutil.rmtree(doomed, ignore_errors=True)
        os.replace(os.path.join(save_dir, tag), doomed)
    for name in os.listdir(save_dir):
        if name.endswith(REMOVING):
            shutil.rmtree(os.path.join(save_dir, name), ignore_errors=True)
    return removed


def _save_layout_free(engine, config: TrainConfig, staging: str) -> None:
    """Per pipeline stage, one file of what another layout needs to continue the run: weights and
    Adam state in BertModel names (optimizer_state.gather), LR schedule and DeepSpeed's counters."""
    writer = parallel_state.get_data_parallel_rank() == 0 and parallel_state.get_sequence_parallel_rank() == 0
    if not optimizer_state.reshapable(engine) or not (writer or optimizer_state.collective(engine)):
        return
    stage_state = optimizer_state.gather(engine, config.model)
    if writer:
        stage_state.update(lr_scheduler=engine.lr_scheduler.state_dict() if engine.lr_scheduler else None,
                           global_steps=engine.global_steps, global_samples=engine.global_samples,
                           skipped_steps=engine.skipped_steps)
        stage = parallel_state.get_pipe_parallel_rank()
        torch.save(stage_state, os.path.join(staging, LAYOUT_FREE.format(stage=stage)))


def _fsync(path: str) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _commit(save_dir: str, tag: str) -> None:
    """`<tag>.partial` -> `<tag>`, then `latest` -> tag; data on disk before each rename. A write
    that fails (a full disk shows at an fsync or at the pointer) leaves no trace of `tag`: `latest`
    keeps naming the previous checkpoint."""
    staging, final = os.path.join(save_dir, tag + PARTIAL), os.path.join(save_dir, tag)
    pointer = os.path.join(save_dir, f".{LATEST}.tmp")
    try:
        for root, _, files in os.walk(staging):
            for name in files:
                _fsync(os.path.join(root, name))
        if os.path.isdir(final):
            # a folder of this iteration that `latest` does not name (check_save_dir refuses the other case)
            shutil.rmtree(final)
        os.replace(staging, final)
        _fsync(save_dir)
        with open(pointer, "w") as file:
            file.write(tag)
            file.flush()
            os.fsync(file.fileno())
        os.replace(pointer, os.path.join(save_dir, LATEST))
    except OSError:
        for leftover in (staging, final):
            shutil.rmtree(leftover, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.remove(pointer)
        raise
    with contextlib.suppress(OSError):  # `latest` names the new checkpoint already: it is kept
        _fsync(save_dir)


def check_writable(save_dir: str) -> None:
    """Before the first step, not at the first save after hours of training: the first local rank
    of every node (all of a node's ranks write into the checkpoint) creates and removes a probe
    file in `save_dir`. Folders created for it are removed again (the first save makes them for
    good), so a run that fails later at start-up leaves nothing. Global rank 0 then takes the
    folder's lock (take_lock), which release_lock gives back. All ranks raise the same error."""
    problem, created = None, []
    fix = "pass a --save directory this user can write on every node"
    if local_rank() == 0:
        try:
            problem = paths.file_in_the_way("--save", save_dir)
            if problem is None:
                created = paths.missing_folders(save_dir)
                paths.write_probe(save_dir)
        except OSError as error:
            problem, fix = paths.unwritable(f"--save {save_dir} is not writable on {socket.gethostname()}", "--save",
                                            error, fix)
    problem = problem and (problem, fix)
    if problem is None and dist.get_rank() == 0:
        try:
            problem = take_lock(save_dir, created)
            if problem is None:
                remove_killed_saves(save_dir)
        except OSError as error:
            problem = paths.unwritable(f"--save {save_dir}: cannot write its lock on {socket.gethostname()}", "--save",
                                       error, fix)
    problems = [None] * dist.get_world_size()
    dist.all_gather_object(problems, problem)  # also: no probe is removed while another node writes one
    found = next((text for text in problems if text), None)
    if found:
        release_lock()  # a run that does not start holds none
        dist.barrier()  # gone before another node, which may have made the folders, removes them
    for folder in created:  # innermost first; a folder another node's probe still needs is not empty
        with contextlib.suppress(OSError):
            os.rmdir(folder)
    dist.barrier()  # removed on every node when any rank returns
    if found:
        raise ConfigError(*found)


def remove_killed_saves(save_dir: str) -> list[str]:
    """Removes the `<tag>.partial` folders of saves that were killed (a SIGKILL, a node lost) and the
    `<tag>.removing` ones of a --keep-last removal that was, with one line naming them; returns their
    names. Called by the lock's holder only: no other run writes into `save_dir`, and this run has
    not saved yet. Such folders are full checkpoints' size, and a stop's iteration is seldom saved
    again (which would replace its `.partial`)."""
    pattern = rf"iter_\d+({re.escape(PARTIAL)}|{re.escape(REMOVING)})"
    names = sorted(name for name in os.listdir(save_dir)
                   if re.fullmatch(pattern, name) and os.path.isdir(os.path.join(save_dir, name)))
    for name in names:
        shutil.rmtree(os.path.join(save_dir, name), ignore_errors=True)
    removed = [name for name in names if not os.path.exists(os.path.join(save_dir, name))]
    if removed:
        print(f"--save {save_dir}: removed {', '.join(removed)}, left by killed saves", flush=True)
    return removed


def refuse_unnamed_checkpoints(save_dir: str) -> None:
    """Refuses a --save directory holding complete iter_* checkpoints but no `latest` (a copy that
    missed it, one deleted by hand): the run would start from scratch and overwrite them. A folder
    with none (or only `.partial` ones) stays a first run's, as `--load X --save X` relies on."""
    tags = complete_tags(save_dir)
    if tags and not os.path.isfile(os.path.join(save_dir, LATEST)):
        raise ConfigError(f"--save {save_dir} holds checkpoint{'s' * (len(tags) > 1)} {tag_list(tags)} but no "
                          f"'{LATEST}' naming the one to resume", f"write the tag to resume into "
                          f"{os.path.join(save_dir, LATEST)} (the newest: {tags[-1]}) and resume with --load "
                          f"{save_dir}, or choose another --save directory to start afresh")


def check_save_dir(save_dir: str, start_iteration: int) -> list[str]:
    """Refuses a --save directory whose `latest` checkpoint is ahead of this run's start: the
    run would overwrite it (or leave `latest` going backwards). Returns the complete checkpoints
    beyond the start that `latest` does not name (a rollback: `latest` edited to an older tag),
    which the run's saves at their iterations replace."""
    if not os.path.isfile(os.path.join(save_dir, LATEST)):
        return []
    tag = latest_tag(save_dir)
    match = re.fullmatch(r"iter_(\d+)", tag)
    if match and int(match.group(1)) > start_iteration:
        raise ConfigError(f"--save {save_dir} holds checkpoint {tag}, ahead of this run's start at iteration "
                          f"{start_iteration}", f"pass --load {save_dir} to continue it, or choose another --save "
                          "directory")
    return [tag for tag in complete_tags(save_dir) if tag_iteration(tag) > start_iteration]


def overwrite_warning(save_dir: str, newer: list[str], start_iteration: int) -> str:
    """The warning of a run that starts behind checkpoints of its --save directory (check_save_dir)."""
    them = "them" if len(newer) > 1 else "it"
    return (f"warning: --save {save_dir} holds {tag_list(newer)}, beyond iteration {start_iteration} where this run "
            f"starts: a save of this run at the same iteration overwrites {them}; move {them} out of {save_dir} to "
            f"keep {them}")


def complete_tags(folder: str) -> list[str]:
    """The iter_* folders of `folder` holding DeepSpeed's model states, by iteration."""
    found = {os.path.basename(os.path.dirname(path))
             for path in glob.glob(os.path.join(glob.escape(folder), "iter_*", "*model_states.pt"))}
    return sorted((tag for tag in found if re.fullmatch(r"iter_\d+", tag)), key=tag_iteration)


def tag_iteration(tag: str) -> int:
    return int(tag[len("iter_"):])


def tag_list(tags: list[str]) -> str:
    """A few tags by name, more as their range."""
    return ", ".join(tags) if len(tags) <= 3 else f"{tags[0]} .. {tags[-1]} ({len(tags)} checkpoints)"


def rng_states() -> dict:
    states = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state()
    return states


def refuse_tag_folder(folder: str, flag: str = "--load", tag_flag: str | None = None) -> None:
    """Refuses one iter_* folder of a --save directory given for the directory, naming the directory:
    `flag` (--load, extend_context.py's --from) takes the one whose `latest` names the checkpoint. A
    read-only tool with a `tag_flag` (to-hf's --tag) names that instead: editing `latest` only to read an
    older checkpoint would roll the next resume of that run back."""
    parent, tag = os.path.split(os.path.abspath(folder))  # a relative iter_* has a parent too
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
        return latest_tag(load_dir)
    if tag in ("", ".", "..") or any(sep and sep in tag for sep in ("/", os.sep, os.altsep)):
        raise ConfigError(f"--tag {tag} is not the name of a checkpoint folder of {load_dir}",
                          f"pass the name of one of its iter_* folders{newest_hint(load_dir)}, and --load the "
                          "--save directory holding it")
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


def latest_tag(load_dir: str) -> str:
    path = os.path.join(load_dir, LATEST)
    if os.path.isfile(load_dir):
        raise ConfigError(f"{load_dir} is a file, not a checkpoint directory",
                          "point --load at the directory a run wrote with --save")
    if not os.path.isfile(path):
        refuse_tag_folder(load_dir)
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
    with open(path) as file:
        tag = file.read().strip()
    if not tag:  # else it would name the directory itself, "incomplete"
        raise DataError(f"the '{LATEST}' file of {load_dir} is empty: it names no checkpoint",
                        f"write the tag of a complete iter_* folder of {load_dir} into it{newest_hint(load_dir)}")
    if tag.endswith((PARTIAL, REMOVING)):  # the start-up removes such a folder (remove_killed_saves)
        raise DataError(f"the '{LATEST}' file of {load_dir} names {tag}, the folder of a save or removal that did "
                        "not finish, never a checkpoint", f"write the tag of a complete iter_* folder of {load_dir} "
                        f"into it{newest_hint(load_dir)}")
    return tag


def newest_hint(load_dir: str) -> str:
    """' (the newest: iter_N)' of the complete iter_* folders in load_dir, '' without one: for a fix naming a tag."""
    tags = complete_tags(load_dir)
    return f" (the newest: {tags[-1]})" if tags else ""


def checkpoint_folder(load_dir: str, tag: str) -> str:
    """The tag's folder, checked to exist and to hold DeepSpeed's model states. A tag that `latest`
    does not name came from the caller (to-hf --tag): the error then does not blame `latest`."""
    folder = os.path.join(load_dir, tag)
    if os.path.isdir(folder) and glob.glob(os.path.join(folder, "*model_states.pt")):
        return folder
    latest, named = os.path.join(load_dir, LATEST), False
    if os.path.isfile(latest):
        with open(latest) as file:
            named = file.read().strip() == tag
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
        raise DataError(f"checkpoint file {path} cannot be read ({type(error).__name__}: "
                        f"{str(error).splitlines()[0] if str(error) else 'truncated'})",
                        "restore it or resume from an earlier complete checkpoint") from None


def _is_data_record(record) -> bool:
    """The shape resume.data_settings writes: [[weight, fingerprint], ...], the paths, the split's
    shares and flag, the seed (and the masking, which older records lack: not checked)."""
    def numbers(values):
        return all(isinstance(value, (int, float)) and not isinstance(value, bool) for value in values)
    return (isinstance(record, dict) and isinstance(record.get("data"), list) and isinstance(record.get("split"), list)
            and all(isinstance(entry, list) and len(entry) == 2 and numbers(entry[:1]) and isinstance(entry[1], str)
                    for entry in record["data"])
            and numbers(record["split"]) and isinstance(record.get("data_path"), list)
            and isinstance(record.get("split_flag"), str) and numbers([record.get("seed")]))


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
        if "data" in state and not _is_data_record(state["data"]):
            raise DataError(f"checkpoint file {path} holds {json.dumps(state['data'])[:40]} as data, not the record "
                            "of the data it trained on", f"{fix}, or delete its \"data\" entry to resume without "
                            "comparing the data")
        origin = state.get(ORIGIN, {"from": None})
        if not (isinstance(origin, dict) and isinstance(origin.get("from"), (str, type(None)))
                and all(isinstance(origin.get(key, ""), str) for key in ("kind", "sha256"))):
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


def carried_tokenizer(load_dir: str, tag: str | None = None, stand_in=None):
    """The tokenizer the checkpoint carries (None: saved before checkpoints carried one); `stand_in`: the
    flags' tokenizer, used in place of a carried file that is gone if it is the one recorded."""
    return tokenizers.carried_tokenizer(checkpoint_folder(load_dir, tag or latest_tag(load_dir)), stand_in)


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
    rng_state = _rng_state(folder, state["config"], load_rng)
    if same_layout(state["config"], config.to_dict()):
        with _one_line_read_errors(engine), torch.no_grad():  # a pipeline's load broadcasts the tied embedding
            path, _ = engine.load_checkpoint(load_dir, tag=tag)
        if path is None:
            raise DataError(f"checkpoint {folder} could not be loaded", "check that the folder is complete")
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


def _layout_free_paths(folder: str, stored: dict) -> list[str]:
    """The layout-free file of each pipeline stage of a checkpoint (`stored`: its config)."""
    return [os.path.join(folder, LAYOUT_FREE.format(stage=stage)) for stage in range(stored["pipeline_parallel_size"])]


def _load_layout_free(engine, config: TrainConfig, folder: str, stored: dict) -> None:
    """Loads a checkpoint written in another layout from its layout-free files (weights, Adam
    state, the optimizer's settings and loss scale, LR schedule, counters); DeepSpeed's own files
    are not read."""
    paths = _layout_free_paths(folder, stored)
    written = (f"pipeline {stored['pipeline_parallel_size']}, ZeRO {stored['zero_stage']}, data x seq "
               f"{stored['data_parallel_size']} x {stored['sequence_parallel_size']}")
    if not all(os.path.isfile(path) for path in paths):
        raise DataError(f"checkpoint {folder} ({written}, {precision(stored['ds_config'])}) has no "
                        f"{LAYOUT_FREE.format(stage='*')} files to load in another layout",
                        "resume in the layout it was written in")
    stages = [safe_load(path) for path in paths]
    if "param_groups" not in stages[0]:
        raise DataError(f"{paths[0]} was written without the optimizer's settings (learning rate, weight decay, "
                        "loss scale) by an earlier version of this trainer", "resume in the layout it was written in")
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


def bert_state_from_checkpoint(load_dir: str, tag: str | None = None) -> dict:
    """BertModel state dict from a checkpoint of any pipeline / SP degree / ZeRO stage: the fp32 master
    weights, so that an export or a --finetune gets the same weights from every layout. DeepSpeed's model
    files hold them only for an fp32 run below ZeRO 3 (a bf16 / fp16 run's hold their rounded copies,
    ZeRO 3's none): otherwise the layout-free files give them, or at ZeRO 0, which writes none, the FP16
    optimizers' state (_zero0_masters; with a pipeline, each stage's: _pipeline_zero0_masters)."""
    tag = tag or latest_tag(load_dir)
    folder = checkpoint_folder(load_dir, tag)
    stored = run_state(load_dir, tag)["config"]
    masters = _layout_free_paths(folder, stored)
    exact = precision(stored["ds_config"]) == "fp32" and stored["zero_stage"] < 3
    if not exact and all(map(os.path.isfile, masters)):
        return {name: entry["fp32"] for path in masters for name, entry in safe_load(path)["params"].items()}
    # pipeline: one file per layer and seq rank, identical across seq ranks: take seq rank 0
    layer_files = sorted(glob.glob(os.path.join(folder, "layer_*-model_00-model_states.pt")))
    if layer_files:
        num_layers = stored["model"]["num_layers"]
        layers = [(int(re.search(r"layer_(\d+)-", os.path.basename(path)).group(1)), safe_load(path))
                  for path in layer_files]
        if not exact:
            layers = _pipeline_zero0_masters(folder, stored, layers) or layers
        state = {pipe_layer_to_bert(layer, key, num_layers): tensor for layer, tensors in layers
                 for key, tensor in tensors.items()}
        return state if exact or not _half_precision(state) else _rounded_copies(state, folder, stored)
    if os.path.isfile(os.path.join(folder, "zero_pp_rank_0_mp_rank_00_model_states.pt")):
        # ZeRO-3 written without layout-free files: the weights exist only as partitions in the optimizer files
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        with contextlib.redirect_stdout(io.StringIO()):  # its progress report, on the stdout fill_mask.py answers on
            return get_fp32_state_dict_from_zero_checkpoint(load_dir, tag=tag)
    model_file = os.path.join(folder, "mp_rank_00_model_states.pt")
    if not os.path.isfile(model_file):
        raise ConfigError(f"{folder} holds no pipeline layer files and no model states",
                          "point at a checkpoint written by this trainer")
    states = safe_load(model_file)
    if exact:
        return states["module"]
    masters = _zero0_masters(states)
    return masters if masters is not None else _rounded_copies(states["module"], folder, stored)


def _zero0_masters(model_states: dict) -> dict | None:
    """The fp32 masters DeepSpeed's FP16 optimizers save in a plain model's file at ZeRO 0 (a bf16 /
    fp16 run without layout-free files) beside the rounded module, in the module's order: a list per
    parameter group (FP16_UnfusedOptimizer) or one flat tensor per group (FP16_Optimizer). None where
    the file holds none, or none that can be the module's parameters in order (not guessed at)."""
    module, flat = model_states["module"], _fp32_flat(model_states)
    sizes = [tensor.numel() for tensor in module.values()]
    if flat is None or flat.numel() != sum(sizes):  # none, or not the trainer's one group in module order
        return None
    return {name: piece.view_as(tensor) for (name, tensor), piece in zip(module.items(), flat.split(sizes))}


def _fp32_flat(model_states: dict) -> torch.Tensor | None:
    """The fp32 masters an FP16 optimizer of ZeRO 0 saves in a model-states file, as one flat tensor in
    its parameters' order (None at ZeRO 1-2, whose optimizer files hold them)."""
    optimizer = model_states.get("optimizer") or {}
    groups = optimizer.get("fp32_groups") or [[flat] for flat in optimizer.get("fp32_groups_flat", [])]
    return torch.cat([tensor.flatten() for group in groups for tensor in group]) if groups else None


def _pipeline_zero0_masters(folder: str, stored: dict, layers: list) -> list | None:
    """`layers` ([(layer index, its file's tensors)], in order: the stages' half-precision copies) with
    the fp32 masters of a pipeline run at ZeRO 0, which writes no layout-free files: each stage's FP16
    optimizer saves them in its model-states file (mp_rank_{stage x sp}: DeepSpeed's model-parallel rank
    of the stage's seq rank 0) in its module's order, the tied word embedding (layer 0's) first on the
    first and last stage, then its layers' tensors. None where the counts do not match (not guessed at)."""
    pipeline, sequence = stored["pipeline_parallel_size"], stored["sequence_parallel_size"]
    tied = [(layers[0][0], key) for key in layers[0][1]] if layers and layers[0][0] == 0 else []
    queue = [(layer, key) for layer, tensors in layers for key in tensors if (layer, key) not in tied]
    copies = {(layer, key): tensor for layer, tensors in layers for key, tensor in tensors.items()}
    masters = {}
    for stage in range(pipeline):
        path = os.path.join(folder, f"mp_rank_{stage * sequence:02d}_model_states.pt")
        flat = _fp32_flat(safe_load(path)) if os.path.isfile(path) else None
        if flat is None:
            return None
        names = list(tied) if stage in (0, pipeline - 1) else []
        while sum(copies[name].numel() for name in names) < flat.numel() and queue:
            names.append(queue.pop(0))
        sizes = [copies[name].numel() for name in names]
        if sum(sizes) != flat.numel():
            return None
        for name, piece in zip(names, flat.split(sizes)):
            masters.setdefault(name, piece.view_as(copies[name]))
    if queue:
        return None
    return [(layer, {key: masters[(layer, key)] for key in tensors}) for layer, tensors in layers]


def _half_precision(state: dict) -> bool:
    return any(tensor.dtype in (torch.float16, torch.bfloat16) for tensor in state.values())


def _rounded_copies(state: dict, folder: str, stored: dict) -> dict:
    """A half-precision run's module copies where no fp32 master is read (fp16 with a pipeline at ZeRO 0,
    a checkpoint written before the layout-free files), said in one warning."""
    kind = precision(stored["ds_config"])
    warnings.warn(f"checkpoint {folder} ({kind}, pipeline {stored['pipeline_parallel_size']}, ZeRO "
                  f"{stored['zero_stage']}) holds no fp32 master weights read here: its {kind} copies are read")
    return state

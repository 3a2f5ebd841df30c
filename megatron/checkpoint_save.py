"""Writing a checkpoint (`save`) and the --save folder's checks at start-up, apart from reading one
(megatron.checkpoint), which every resume and tool does: only the trainer writes.

`save` stores, under tag `iter_XXXXXXX`, DeepSpeed's files and what megatron.checkpoint's `load` reads
beside them: the run state, each rank's RNG states and, per pipeline stage, the layout-free file that
lets another layout continue the run (_save_layout_free).

Crash consistency: every rank writes into `<tag>.partial`; only when all have finished does
rank 0 rename it to `<tag>` and then replace `latest` (both atomic renames, fsynced), so a run
killed at any moment leaves `latest` naming a complete checkpoint. A write that fails (a full disk,
the file-size limit) stops every rank with one line saying why, and nothing of the tag is kept.

The start-up checks refuse, before the first step rather than at the first save, a --save folder
that cannot be written or whose checkpoints the run would overwrite; its lock is megatron.locks'.
"""
import contextlib
import errno
import glob
import json
import os
import re
import resource
import shutil
import socket
import sys
import tempfile

import torch
import torch.distributed as dist

from megatron import optimizer_state, paths
from megatron.checkpoint import (LATEST, LAYOUT_FREE, LOGS, ORIGIN, PARENT, PARTIAL, REMOVING, RUN_ENDED,
                                 RUN_STATE, VALIDATION_CUT, complete_tags, latest_tag, refuse_odd_latest, run_id,
                                 run_state, tag_for, tag_iteration, unfinished_tags)
from megatron.config import TrainConfig
from megatron.data import tokenizer_identity
from megatron.errors import ConfigError, DataError, disk_full
from megatron.locks import held_record, holds_lock, keep_held, release_lock, take_lock
from megatron.parallel import peers, state as parallel_state
from megatron.parallel.launch_env import local_rank

FULL_BYTES = 16 * 2**20  # less free space than this after a failed write: the disk is full
# how long a node looks for rank 0's lock in its --save (a network file system may cache the name as missing
# for its attribute-cache time, 30 s by default)
SHARED_WAIT_S = 30


def save(engine, config: TrainConfig, save_dir: str, iteration: int, consumed_samples: int,
         schedule: dict | None = None, tokenizer=None, data: dict | None = None,
         origin: dict | None = None, after: str | None = None, validation_cut: bool = False,
         logs: dict | None = None) -> str:
    """Saves on every rank; returns the tag once `latest` names it. `schedule`: the learning-rate
    settings of the run (schedule.Schedule.record), compared by a resume, as is `data` (the data it
    reads, resume.data_settings). `origin`: the weights the run started from (start_plan.weights_origin),
    compared by a requeue that names them. `after`: the run's previous checkpoint (the loaded one, then
    each saved), recorded as the new one's PARENT when it is in `save_dir` (lineage); --keep-last prunes after
    the run has logged the save (keep_newest). `tokenizer`:
    copied in with its identity, so fill-mask, export and a resume need no tokenizer flag. `validation_cut`: a
    stop cut the validation after `iteration` short (VALIDATION_CUT), which a resume computes first. `logs`: the
    folders the run logs into (LOGS: run_log.logs_record), which a resume into others names."""
    tag, rank = tag_for(iteration), dist.get_rank()
    staging = os.path.join(save_dir, tag + PARTIAL)
    lost = [None]
    if rank == 0:
        os.makedirs(save_dir, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)  # left by a save that was killed
        try:
            lost = [keep_held()]  # the folder vanished meanwhile: its lock too
        except OSError as error:
            lost = [paths.unwritable(f"--save {save_dir}: cannot write its lock again on {socket.gethostname()}",
                                     "--save", error, "pass a --save directory this user can write on every node")]
    dist.broadcast_object_list(lost, src=0)
    if lost[0]:
        raise ConfigError(*lost[0])
    state = {"config": config.to_dict(), "iteration": iteration, "consumed_samples": consumed_samples,
                 **({"schedule": schedule} if schedule else {}), **({"data": data} if data else {}),
                 **({ORIGIN: origin} if origin else {}), **({VALIDATION_CUT: True} if validation_cut else {}),
                 **({LOGS: logs} if logs else {}),
                 **({PARENT: os.path.basename(after)} if after and paths.where_in(os.path.dirname(after), save_dir)
                    == "the" else {})}
    problem = None
    try:
        engine.save_checkpoint(save_dir, tag=tag + PARTIAL, client_state=state, save_latest=False)
    except (OSError, RuntimeError) as error:  # a full disk: torch.save's `basic_ios::clear: iostream error`
        if peers.lost(error):  # not the disk: another rank ended (training.lost_rank_problem)
            raise
        problem = _write_problem(save_dir, tag, error)
        dist.barrier()  # the one save_checkpoint ends with, which this rank missed

    def rank0_files():
        if rank == 0:
            with open(os.path.join(staging, RUN_STATE), "w") as file:
                json.dump(state, file)
            if tokenizer is not None:
                tokenizer_identity.carry(tokenizer, staging)

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
    committed = [problem]
    dist.broadcast_object_list(committed, src=0)  # all raise alike
    if committed[0]:
        raise ConfigError(*committed[0])
    return tag


RECOVERY_SCRIPTS = ("zero_to_fp32.py", "zero_to_torch.py")  # copied into --save by DeepSpeed's ZeRO saves
CONVERT_TOOL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools",
                            "convert_checkpoint.py")


def replace_recovery_scripts(save_dir: str) -> None:
    """DeepSpeed's RECOVERY_SCRIPTS fail with a traceback on pipeline checkpoints (their model states
    hold no module): after a pipeline save each is replaced by a script whose one line names the
    export that reads every layout (tools/convert_checkpoint.py to-torch), with the error contract's
    exit status 2 (sys.exit of a message would exit 1)."""
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
                           f"print({line!r}, file=sys.stderr)\nsys.exit(2)\n")


def _write_problem(save_dir: str, tag: str, error: Exception) -> tuple[str, str]:
    """(problem, fix) of a failed checkpoint write. A full disk is named as such: an OSError says
    ENOSPC, torch's writer only `iostream error` / `file write failed`, so little space left on the
    folder's disk (under FULL_BYTES) counts as full too."""
    if not isinstance(error, OSError):  # torch's writer: its own words for the system's error
        error = _unwritable(os.path.join(save_dir, tag + PARTIAL)) or error
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


def _unwritable(staging: str) -> OSError | None:
    """The system's error for writing into the staging folder, or None when it can be written. torch's
    writer names none: when DeepSpeed's makedirs of it failed (DeepSpeed logs that and goes on), torch
    says `Parent directory ... does not exist` for a folder that turned read-only (EPERM, EACCES, EROFS)."""
    try:
        with contextlib.suppress(FileExistsError):  # not makedirs: a --save that vanished is not made again
            os.mkdir(staging)  # removed again with the failed save's staging folder
        with tempfile.TemporaryFile(dir=staging):
            pass
    except OSError as error:
        return error
    return None


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


def mark_ended(folder: str) -> None:
    """Records in `folder`'s RUN_STATE that its run ended there (RUN_ENDED), by rank 0 once the final
    validation and test losses are logged: a new file renamed over the old one, so a reader never sees half of
    it. A folder it cannot write (remounted read-only) stays unmarked: a rerun evaluates it again."""
    path = os.path.join(folder, RUN_STATE)
    try:
        with open(path, encoding="utf-8") as file:
            state = json.load(file)
        with open(path + ".tmp", "w", encoding="utf-8") as file:
            json.dump({**state, RUN_ENDED: True}, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(path + ".tmp", path)
    except (OSError, ValueError):
        with contextlib.suppress(OSError):
            os.remove(path + ".tmp")


def keep_newest(save_dir: str, keep_last: int) -> str | None:
    """--keep-last, once a save is committed and logged: rank 0 removes all but the newest `keep_last`
    checkpoints (prune) while the other ranks wait, so none returns (and may save again) meanwhile. -> the
    line that names what was removed (rank 0, where any was), else None."""
    removed = prune(save_dir, keep_last) if dist.get_rank() == 0 else []
    dist.barrier()
    if not removed:
        return None
    return (f"removed checkpoint{'s' if len(removed) > 1 else ''} {', '.join(removed)} of {save_dir} "
            f"(--keep-last {keep_last})")


def prune(save_dir: str, keep_last: int) -> list[str]:
    """Removes the complete `iter_*` folders of `save_dir` beyond the newest `keep_last` of the lineage of
    the one `latest` names; returns their tags, oldest first. The others were left by a run rolled back
    from (`latest` set back by hand): neither counted nor removed, before this run's `latest` passes them
    and after. Never a `<tag>.partial` staging folder or anything else. Called by rank 0
    after a commit, between barriers, so no rank is writing. Each folder is first renamed to
    `<tag>.removing` (atomic), so a run killed mid-removal leaves no half iter_* folder that looks
    complete; leftovers of such a kill are removed too. Another run's checkpoints (a run id, checkpoint.RUN_ID,
    not the one of the checkpoint `latest` names: a resume of another folder into this one) are neither
    counted nor removed either: --keep-last prunes this run's saves, never another run's work."""
    if keep_last < 1:
        raise ValueError(f"keep_last {keep_last} must be >= 1")
    latest = latest_tag(save_dir) if os.path.isfile(os.path.join(save_dir, LATEST)) else None
    own = run_id(save_dir, latest) if latest else None
    tags = sorted((name for name in os.listdir(save_dir)
                   if re.fullmatch(r"iter_\d+", name) and os.path.isdir(os.path.join(save_dir, name))
                   and (own is None or run_id(save_dir, name) in (None, own))),
                  key=lambda name: int(name[len("iter_"):]))
    if latest in tags:
        tags = lineage(save_dir, tags[:tags.index(latest) + 1])
    removed = tags[:-keep_last]
    for tag in removed:
        doomed = os.path.join(save_dir, tag + REMOVING)
        shutil.rmtree(doomed, ignore_errors=True)
        os.replace(os.path.join(save_dir, tag), doomed)
    for name in os.listdir(save_dir):
        if name.endswith(REMOVING):
            shutil.rmtree(os.path.join(save_dir, name), ignore_errors=True)
    return removed


def lineage(save_dir: str, tags: list[str]) -> list[str]:
    """The tags of `tags` (by iteration) that the last one descends from: the PARENT links from it while they
    name a folder of `tags`, then every tag below the last one reached (saved before checkpoints recorded
    their parent, or below a parent that was removed). A rollback's abandoned checkpoints are above the
    checkpoint it resumed, which the links reach: they are left out."""
    def parent(tag: str) -> str | None:
        if not os.path.isfile(os.path.join(save_dir, tag, RUN_STATE)):
            return None
        with contextlib.suppress(OSError, ConfigError, DataError):
            return run_state(save_dir, tag).get(PARENT)
        return None

    linked, tag = [], tags[-1]
    while tag in tags and tag not in linked:
        linked.append(tag)
        tag = parent(tag)
    lowest = tag_iteration(linked[-1])
    return [tag for tag in tags if tag in linked or tag_iteration(tag) < lowest]


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
        except ConfigError as error:  # a link to a folder that does not exist (missing_folders)
            problem, fix = f"--save: {error.problem}", error.fix
    problem, record = problem and (problem, fix), None
    if problem is None and dist.get_rank() == 0:
        problem = take_lock(save_dir, created, fix=fix)
        if problem is None:
            remove_killed_saves(save_dir)
            record = held_record()
    gathered = [None] * dist.get_world_size()  # also: no probe is removed while another node writes one
    dist.all_gather_object(gathered, (problem, save_dir, socket.gethostname(), record))
    found = next((problem for problem, *_ in gathered if problem), None)
    if found is None:  # each other node's --save shows rank 0's lock: the same folder
        problem = not_shared(save_dir, *gathered[0][1:]) if local_rank() == 0 and dist.get_rank() else None
        problems = [None] * dist.get_world_size()
        dist.all_gather_object(problems, problem)
        found = next((problem for problem in problems if problem), None)
    if found:
        release_lock()  # a run that does not start holds none
        dist.barrier()  # gone before another node, which may have made the folders, removes them
    paths.remove_empty(created)  # a folder another node's probe still needs is not empty
    dist.barrier()  # removed on every node when any rank returns
    if found:
        raise ConfigError(*found)


def not_shared(save_dir: str, rank_0_dir: str, rank_0_host: str, lock: dict,
               wait_s: float = SHARED_WAIT_S) -> tuple[str, str] | None:
    """(problem, fix) when this node's `save_dir` does not hold rank 0's `lock` (taken in its --save `rank_0_dir`
    on `rank_0_host`): another folder, a disk of this node's own, where this node's ranks would write their part
    of each checkpoint apart from the others' (a resume then finds none whole). None: the same folder, whatever
    path each node mounts it at."""
    if holds_lock(save_dir, lock, wait_s=wait_s):
        return None
    return (f"--save {save_dir} on {socket.gethostname()} is not the folder rank 0 saves into (--save {rank_0_dir} on "
            f"{rank_0_host}): each node would hold only its own ranks' part of every checkpoint",
            "pass a --save folder every node shares (a shared file system; the launch scripts: "
            "the same RUN_DIR on every node)")


def remove_killed_saves(save_dir: str) -> list[str]:
    """Removes the `<tag>.partial` folders of saves that were killed (a SIGKILL, a node lost) and the
    `<tag>.removing` ones of a --keep-last removal that was, with one line naming them; returns their
    names. Called by the lock's holder only: no other run writes into `save_dir`, and this run has
    not saved yet. Such folders are full checkpoints' size, and a stop's iteration is seldom saved
    again (which would replace its `.partial`)."""
    names = unfinished_tags(save_dir)
    for name in names:
        shutil.rmtree(os.path.join(save_dir, name), ignore_errors=True)
    removed = [name for name in names if not os.path.exists(os.path.join(save_dir, name))]
    if removed:
        print(f"--save {save_dir}: removed {', '.join(removed)}, left by killed saves", flush=True)
    return removed


def refuse_unnamed_checkpoints(save_dir: str, resume: str | None = None) -> None:
    """Refuses a --save directory holding complete iter_* checkpoints but no `latest` (a copy that
    missed it, one deleted by hand): the run would start from scratch and overwrite them. A folder
    with none (or only `.partial` ones) stays a first run's, as `--load X --save X` relies on."""
    refuse_odd_latest(save_dir)
    tags = complete_tags(save_dir)
    if tags and not os.path.isfile(os.path.join(save_dir, LATEST)):
        raise ConfigError(f"--save {save_dir} holds checkpoint{'s' * (len(tags) > 1)} {tag_list(tags)} but no "
                          f"'{LATEST}' naming the one to resume", f"write the tag to resume into "
                          f"{os.path.join(save_dir, LATEST)} (the newest: {tags[-1]}) and "
                          f"{resume or f'resume with --load {save_dir}'}, or choose another --save directory to "
                          "start afresh")


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
    where = "one of their iterations replaces that checkpoint" if len(newer) > 1 else "its iteration replaces it"
    return (f"warning: --save {save_dir} holds {tag_list(newer)}, beyond iteration {start_iteration} where this run "
            f"starts: a save of this run at {where} (--keep-last neither counts nor removes {them}); move {them} out "
            f"of {save_dir} to keep {them}")


def foreign_tags(save_dir: str, load_dir: str, start_iteration: int) -> list[str]:
    """The complete checkpoints of --save `save_dir`, at or below the iteration where a resume of another folder
    (`load_dir`) starts, of another run: their run id (checkpoint.RUN_ID) is not --load's, so this run's saves
    would join them under one `latest` (a rollback there would resume that run; --keep-last would remove them).
    This run's own, wherever they were moved or copied, carry its id; checkpoints saved before runs had one (on
    either side) are not named."""
    own = run_id(load_dir, latest_tag(load_dir))
    if own is None:
        return []
    return [tag for tag in complete_tags(save_dir)
            if tag_iteration(tag) <= start_iteration and run_id(save_dir, tag) not in (None, own)]


def refuse_foreign_tags(save_dir: str, load_dir: str, start_iteration: int) -> None:
    """Refuses a resume of another folder into a --save folder holding another run's checkpoints (foreign_tags):
    its saves would join them under one `latest` (as check_save_dir refuses a --save whose `latest` is ahead)."""
    foreign = foreign_tags(save_dir, load_dir, start_iteration)
    if foreign:
        them = "them" if len(foreign) > 1 else "it"
        raise ConfigError(f"--save {save_dir} holds {tag_list(foreign)} of another run (run id "
                          f"{run_id(save_dir, foreign[-1])}), not of the run --load {load_dir} resumes: its saves "
                          f"would join {them} under one '{LATEST}'", f"pass another --save, or --load {save_dir} to "
                          f"continue that run, or move {them} out of {save_dir}")


def tag_list(tags: list[str]) -> str:
    """A few tags by name, more as their range."""
    return ", ".join(tags) if len(tags) <= 3 else f"{tags[0]} .. {tags[-1]} ({len(tags)} checkpoints)"


def rng_states() -> dict:
    states = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state()
    return states

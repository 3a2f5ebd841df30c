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
fp32 weights and Adam moments in BertModel names, Adam's step, the LR schedule, DeepSpeed's
counters). `load` reads DeepSpeed's files when the layout allows (same pipeline degree,
precision and ZeRO partitioning), else these, so a run continues at another pipeline degree,
SP/data degree or ZeRO stage 0-2. `bert_state_from_checkpoint` reads the weights of any layout
(plain model at any ZeRO stage, or pipeline layer files) back into BertModel names.
"""
import contextlib
import dataclasses
import glob
import json
import os
import pickle
import re
import shutil
import socket
import zipfile

import torch
import torch.distributed as dist

from megatron import optimizer_state
from megatron.config import TrainConfig, precision
from megatron.errors import ConfigError, DataError
from megatron.model.bert import BertConfig, BertModel
from megatron.model.pipe import pipe_layer_to_bert
from megatron.parallel import state as parallel_state

LATEST = "latest"
RUN_STATE = "run_state.json"
LAYOUT_FREE = "layout_free_stage{stage}.pt"
PARTIAL = ".partial"
REMOVING = ".removing"  # an old checkpoint being removed by --keep-last
# what torch.load raises on a truncated or overwritten file
UNREADABLE = (EOFError, pickle.UnpicklingError, zipfile.BadZipFile, RuntimeError, ValueError, OSError)


def tag_for(iteration: int) -> str:
    return f"iter_{iteration:07d}"


def save(engine, config: TrainConfig, save_dir: str, iteration: int, consumed_samples: int,
         schedule: dict | None = None, keep_last: int | None = None) -> str:
    """Saves on every rank; returns the tag once `latest` names it. `schedule`: the learning-rate
    settings of the run (training.schedule_settings), compared by a resume. `keep_last`: once the
    new checkpoint is committed, rank 0 removes all but the newest that many (prune)."""
    tag, rank = tag_for(iteration), dist.get_rank()
    staging = os.path.join(save_dir, tag + PARTIAL)
    if rank == 0:
        os.makedirs(save_dir, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)  # left by a save that was killed
    dist.barrier()
    run_state = {"config": config.to_dict(), "iteration": iteration, "consumed_samples": consumed_samples,
                 **({"schedule": schedule} if schedule else {})}
    engine.save_checkpoint(save_dir, tag=tag + PARTIAL, client_state=run_state, save_latest=False)
    torch.save(rng_states(), os.path.join(staging, f"rng_rank{rank}.pt"))
    _save_layout_free(engine, config, staging)
    if rank == 0:
        with open(os.path.join(staging, RUN_STATE), "w") as file:
            json.dump(run_state, file)
    dist.barrier()  # every rank's files are written
    if rank == 0:
        _commit(save_dir, tag)
        if keep_last:
            removed = prune(save_dir, keep_last)
            if removed:
                print(f"removed checkpoint{'s' if len(removed) > 1 else ''} {', '.join(removed)} of {save_dir} "
                      f"(--keep-last {keep_last})", flush=True)
    dist.barrier()  # no rank returns (and may save again) while old folders are being removed
    return tag


def prune(save_dir: str, keep_last: int) -> list[str]:
    """Removes the complete `iter_*` folders of `save_dir` beyond the newest `keep_last` (by
    iteration); returns their tags, oldest first. Never the folder `latest` names (even if older,
    e.g. written by hand), nor a `<tag>.partial` staging folder or anything else. Called by rank 0
    after a commit, between barriers, so no rank is writing. Each folder is first renamed to
    `<tag>.removing` (atomic), so a run killed mid-removal leaves no half iter_* folder that looks
    complete; leftovers of such a kill are removed too."""
    if keep_last < 1:
        raise ValueError(f"keep_last {keep_last} must be >= 1")
    latest = latest_tag(save_dir) if os.path.isfile(os.path.join(save_dir, LATEST)) else None
    tags = sorted((name for name in os.listdir(save_dir)
                   if re.fullmatch(r"iter_\d+", name) and os.path.isdir(os.path.join(save_dir, name))),
                  key=lambda name: int(name[len("iter_"):]))
    removed = [tag for tag in tags[:-keep_last] if tag != latest]
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
    """`<tag>.partial` -> `<tag>`, then `latest` -> tag; data on disk before each rename."""
    staging, final = os.path.join(save_dir, tag + PARTIAL), os.path.join(save_dir, tag)
    for root, _, files in os.walk(staging):
        for name in files:
            _fsync(os.path.join(root, name))
    if os.path.isdir(final):
        # a folder of this iteration that `latest` does not name (check_save_dir refuses the other case)
        shutil.rmtree(final)
    os.replace(staging, final)
    _fsync(save_dir)
    pointer = os.path.join(save_dir, f".{LATEST}.tmp")
    with open(pointer, "w") as file:
        file.write(tag)
        file.flush()
        os.fsync(file.fileno())
    os.replace(pointer, os.path.join(save_dir, LATEST))
    _fsync(save_dir)


def check_writable(save_dir: str) -> None:
    """Before the first step, not at the first save after hours of training: the first local rank
    of every node (all of a node's ranks write into the checkpoint) creates and removes a probe
    file in `save_dir`. Folders created for it are removed again (the first save makes them for
    good), so a run that fails later at start-up leaves nothing. All ranks raise the same error."""
    problem, created = None, []
    if int(os.environ.get("LOCAL_RANK", 0)) == 0:
        try:
            problem = _save_dir_problem(save_dir)
            if problem is None:
                folder = os.path.abspath(save_dir)
                while not os.path.exists(folder):
                    created.append(folder)
                    folder = os.path.dirname(folder)
                os.makedirs(save_dir, exist_ok=True)
                probe = os.path.join(save_dir, f".write_probe.{socket.gethostname()}.{os.getpid()}")
                with open(probe, "w") as file:
                    file.write("probe")
                os.remove(probe)
        except OSError as error:
            problem = f"--save {save_dir} is not writable on {socket.gethostname()} ({error.strerror or error})"
    problems = [None] * dist.get_world_size()
    dist.all_gather_object(problems, problem)  # also: no probe is removed while another node writes one
    for folder in created:  # innermost first; a folder another node's probe still needs is not empty
        with contextlib.suppress(OSError):
            os.rmdir(folder)
    dist.barrier()  # removed on every node when any rank returns
    found = next((text for text in problems if text), None)
    if found:
        raise ConfigError(found, "pass a --save directory this user can write on every node")


def _save_dir_problem(save_dir: str) -> str | None:
    """Why `save_dir` cannot become a checkpoint folder, when it is not a permission: a file in
    its place or on its path."""
    folder = os.path.abspath(save_dir)
    while folder and not os.path.exists(folder):
        folder = os.path.dirname(folder)
    if os.path.isdir(folder):
        return None
    where = "is a file" if folder == os.path.abspath(save_dir) else f"lies under {folder}, which is a file"
    return f"--save {save_dir} {where}, not a directory"


def check_save_dir(save_dir: str, start_iteration: int) -> None:
    """Refuses a --save directory whose `latest` checkpoint is ahead of this run's start: the
    run would overwrite it (or leave `latest` going backwards)."""
    if not os.path.isfile(os.path.join(save_dir, LATEST)):
        return
    tag = latest_tag(save_dir)
    match = re.fullmatch(r"iter_(\d+)", tag)
    if match and int(match.group(1)) > start_iteration:
        raise ConfigError(f"--save {save_dir} holds checkpoint {tag}, ahead of this run's start at iteration "
                          f"{start_iteration}", f"pass --load {save_dir} to continue it, or choose another --save "
                          "directory")


def rng_states() -> dict:
    states = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state()
    return states


def latest_tag(load_dir: str) -> str:
    path = os.path.join(load_dir, LATEST)
    if os.path.isfile(load_dir):
        raise ConfigError(f"{load_dir} is a file, not a checkpoint directory",
                          "point --load at the directory a run wrote with --save")
    if not os.path.isfile(path):
        raise ConfigError(f"no checkpoint in {load_dir} (missing '{LATEST}')", "point --load at a directory written by --save")
    with open(path) as file:
        return file.read().strip()


def checkpoint_folder(load_dir: str, tag: str) -> str:
    """The tag's folder, checked to exist and to hold DeepSpeed's model states."""
    folder = os.path.join(load_dir, tag)
    if not os.path.isdir(folder):
        raise DataError(f"checkpoint folder {folder} named by {os.path.join(load_dir, LATEST)} does not exist",
                        f"restore it, or write the tag of a complete iter_* folder of {load_dir} into 'latest'")
    if not glob.glob(os.path.join(folder, "*model_states.pt")):
        raise DataError(f"checkpoint folder {folder} is incomplete (no *model_states.pt)",
                        f"restore it, or write the tag of a complete iter_* folder of {load_dir} into 'latest'")
    return folder


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


def run_state(load_dir: str, tag: str) -> dict:
    """{"config", "iteration", "consumed_samples"} of a checkpoint, plus "weights_only": True for
    one written by tools/convert_checkpoint.py from-hf (no optimizer, engine or RNG state)."""
    folder = checkpoint_folder(load_dir, tag)
    path = os.path.join(folder, RUN_STATE)
    if os.path.isfile(path):
        try:
            with open(path, encoding="utf-8") as file:
                state = json.load(file)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise DataError(f"checkpoint file {path} is not valid JSON ({error.__class__.__name__}: "
                            f"{str(error).splitlines()[0]}): truncated or overwritten",
                            "restore it or resume from an earlier complete checkpoint") from None
        if not isinstance(state, dict) or not {"config", "iteration", "consumed_samples"} <= set(state):
            raise DataError(f"checkpoint file {path} lacks config, iteration or consumed_samples",
                            "restore it or resume from an earlier complete checkpoint")
        return state
    states = sorted(glob.glob(os.path.join(folder, "*mp_rank_00_model_states.pt")))
    stored = safe_load(states[0]) if len(states) == 1 and "zero_pp" not in states[0] else None
    if not stored or "config" not in stored:
        raise DataError(f"checkpoint folder {folder} has no {RUN_STATE}", "point at a checkpoint written by this trainer")
    return {key: value for key, value in stored.items() if key != "module"}


def stored_config(load_dir: str, tag: str) -> dict:
    """The resolved config saved with the checkpoint (TrainConfig.to_dict())."""
    return run_state(load_dir, tag)["config"]


def check_model_shapes(stored: dict, config: BertConfig, folder: str) -> None:
    """The checkpoint's model must have this run's tensors and shapes; names the first that differs."""
    fields = {f.name for f in dataclasses.fields(BertConfig)}
    with torch.device("meta"):
        found = BertModel(BertConfig(**{k: v for k, v in stored.items() if k in fields})).state_dict()
        expected = BertModel(config).state_dict()
    for name, tensor in expected.items():
        if name not in found or found[name].shape != tensor.shape:
            shape = list(found[name].shape) if name in found else "nothing"
            raise ConfigError(f"checkpoint {folder} holds {name} of shape {shape}, this model expects "
                              f"{list(tensor.shape)}", "resume with the model flags the checkpoint was trained with")
    extra = [name for name in found if name not in expected]  # e.g. biases or a position table dropped
    if extra:
        raise ConfigError(f"checkpoint {folder} holds {extra[0]}, which this model does not have",
                          "resume with the model flags the checkpoint was trained with")


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


def load(engine, load_dir: str, config: TrainConfig) -> dict:
    """Restores engine state and this rank's RNG; returns the run state (iteration, ...)."""
    tag = latest_tag(load_dir)
    folder = checkpoint_folder(load_dir, tag)
    state = run_state(load_dir, tag)
    check_model_shapes(state["config"]["model"], config.model, folder)
    if same_layout(state["config"], config.to_dict()):
        with _one_line_read_errors(engine):
            path, _ = engine.load_checkpoint(load_dir, tag=tag)
        if path is None:
            raise DataError(f"checkpoint {folder} could not be loaded", "check that the folder is complete")
    else:
        _load_layout_free(engine, config, folder, state["config"])
    rng = os.path.join(folder, f"rng_rank{dist.get_rank()}.pt")
    if os.path.isfile(rng):
        rng_state = safe_load(rng)
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


def _load_layout_free(engine, config: TrainConfig, folder: str, stored: dict) -> None:
    """Loads a checkpoint written in another layout from its layout-free files (weights, Adam
    state, LR schedule, counters); DeepSpeed's own files are not read."""
    paths = [os.path.join(folder, LAYOUT_FREE.format(stage=stage)) for stage in range(stored["pipeline_parallel_size"])]
    if not all(os.path.isfile(path) for path in paths):
        raise DataError(f"checkpoint {folder} (pipeline {stored['pipeline_parallel_size']}, ZeRO {stored['zero_stage']}, "
                        f"{stored['data_parallel_size']} x {stored['sequence_parallel_size']} data x seq, "
                        f"{precision(stored['ds_config'])}) has no {LAYOUT_FREE.format(stage='*')} files to load "
                        "in another layout", "resume in the layout it was written in")
    stages = [safe_load(path) for path in paths]
    merged = {"step": stages[0]["step"], "params": {}}
    for stage in stages:
        merged["params"].update(stage["params"])
    optimizer_state.scatter(engine, config.model, merged)
    if engine.lr_scheduler is not None and stages[0]["lr_scheduler"] is not None:
        engine.lr_scheduler.load_state_dict(stages[0]["lr_scheduler"])
    engine.global_steps, engine.global_samples = stages[0]["global_steps"], stages[0]["global_samples"]
    engine.skipped_steps = stages[0]["skipped_steps"]
    if dist.get_rank() == 0:
        print(f"loaded {folder} written at pipeline {stored['pipeline_parallel_size']}, ZeRO {stored['zero_stage']}, "
              f"data x seq {stored['data_parallel_size']} x {stored['sequence_parallel_size']} from its layout-free "
              "files (weights, Adam state, LR schedule)", flush=True)


def bert_state_from_checkpoint(load_dir: str, tag: str | None = None) -> dict:
    """BertModel state dict from a checkpoint of any pipeline / SP degree / ZeRO stage."""
    tag = tag or latest_tag(load_dir)
    folder = checkpoint_folder(load_dir, tag)
    # pipeline: one file per layer and seq rank, identical across seq ranks: take seq rank 0
    layer_files = sorted(glob.glob(os.path.join(folder, "layer_*-model_00-model_states.pt")))
    if layer_files:
        num_layers = stored_config(load_dir, tag)["model"]["num_layers"]
        state = {}
        for path in layer_files:
            layer = int(re.search(r"layer_(\d+)-", os.path.basename(path)).group(1))
            for key, tensor in safe_load(path).items():
                state[pipe_layer_to_bert(layer, key, num_layers)] = tensor
        return state
    if os.path.isfile(os.path.join(folder, "zero_pp_rank_0_mp_rank_00_model_states.pt")):
        # ZeRO-3: the weights exist only as partitions in the optimizer files
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        return get_fp32_state_dict_from_zero_checkpoint(load_dir, tag=tag)
    model_file = os.path.join(folder, "mp_rank_00_model_states.pt")
    if not os.path.isfile(model_file):
        raise ConfigError(f"{folder} holds no pipeline layer files and no model states",
                          "point at a checkpoint written by this trainer")
    return safe_load(model_file)["module"]

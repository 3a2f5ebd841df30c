"""DeepSpeed's monitors (the JSON's tensorboard, csv_monitor, wandb and comet sections) fed with the
trainer's own records.

DeepSpeed's engine writes only what it knows to them (the learning rate after each step, the fp16
loss scale, its timers, the pipeline engine's loss): a DeepSpeed user who enables wandb in the JSON
would see no loss curve. RunLog hands each record here as events named as DeepSpeed names its own
(`Train/Samples/<metric>`, `Validation/Samples/loss`, `Test/Samples/loss`) at the consumed samples,
the x-axis DeepSpeed's events use, so both sit in one chart. The packages and folders the sections
need are checked at start-up (monitor_problem), not inside deepspeed.initialize on rank 0.
"""
import csv
import importlib.util
import os
from pathlib import Path

from megatron import paths
from megatron.ds_schema import FILE_MONITORS, dict_section

# section -> the package DeepSpeed imports for it (csv_monitor: the standard library's csv)
PACKAGES = {"tensorboard": "tensorboard", "csv_monitor": None, "wandb": "wandb", "comet": "comet_ml"}
# DeepSpeed's defaults of those two (deepspeed/monitor/config.py): output_path "" is the current folder
DEFAULT_JOB_NAME = "DeepSpeedJobName"
# record fields that are no curve in any writer: the x-axis, the clock, a window's size
NOT_CURVES = ("iteration", "time", "window_steps")
# and no event here: the text fields, the consumed samples (the events' x-axis), and what DeepSpeed writes itself
# under the same name (Train/Samples/lr: the rate after the step; Train/Samples/loss_scale), which a second writer
# would interleave with its own values
NOT_EVENTS = {"kind", "run", "consumed_samples", "lr", "loss_scale", *NOT_CURVES}


def enabled(ds_config: dict) -> list[str]:
    """The monitor sections the DeepSpeed JSON enables."""
    return [name for name in PACKAGES if dict_section(ds_config, name).get("enabled") is True]


def output_folder(ds_config: dict, name: str) -> str:
    """Where a file-writing monitor writes: output_path/job_name, as DeepSpeed joins them."""
    section = ds_config[name]
    return os.path.join(section.get("output_path", ""), section.get("job_name", DEFAULT_JOB_NAME))


def monitor_problem(ds_config: dict, ds_path: str) -> tuple[str, str] | None:
    """(problem, fix) for the first enabled monitor that cannot work: its package missing (DeepSpeed's
    ImportError inside deepspeed.initialize) or its folder unwritable (DeepSpeed's makedirs there)."""
    for name in enabled(ds_config):
        package = PACKAGES[name]
        if package and importlib.util.find_spec(package) is None:
            offline = " (WANDB_MODE=offline logs without an account)" if name == "wandb" else ""
            return (f"the DeepSpeed config {ds_path} enables {name}, and the {package} package is not installed",
                    f"pip install {package}{offline}, or set {name}.enabled to false")
        if name in FILE_MONITORS and (problem := _folder_problem(ds_config, name)):
            return (f"the DeepSpeed config {ds_path}'s {problem[0]}", problem[1])
    return None


def _folder_problem(ds_config: dict, name: str) -> tuple[str, str] | None:
    """(problem, fix) of a file-writing monitor's folder: its output_path as the JSON writes it first (not
    the output_path/job_name DeepSpeed makes, a job_name the user may never have written), then that folder."""
    field, output_path = f"{name}.output_path", ds_config[name].get("output_path", "")
    fix = f"set {field} to a folder this user can write"
    if output_path and (problem := paths.folder_problem(field, output_path, fix)):
        return problem
    return paths.folder_problem(f"{name}.output_path/job_name", output_folder(ds_config, name),
                                f"{fix}, or {name}.job_name to a name no file there has")


def reused_folders_warning(tensorboard_dir: str | None, ds_config: dict) -> str | None:
    """The warning for a new run (not a resume) whose --tensorboard-dir or file-writing monitor folder
    (output_path/job_name) holds files already, another run's: TensorBoard and csv_monitor add this run's
    points to theirs (one chart zig-zags between both runs' values at the same steps; a csv file gets a second
    header mid-file). A shared JSON template's fixed job_name does this without a word."""
    folders = [("--tensorboard-dir", tensorboard_dir)] + [(f"the {name} folder (output_path/job_name)",
                                                           output_folder(ds_config, name))
                                                          for name in enabled(ds_config) if name in FILE_MONITORS]
    held = [f"{label} {folder}" for label, folder in folders if folder and os.path.isdir(folder)
            and any(Path(folder).iterdir())]
    if not held:
        return None
    return (f"warning: {' and '.join(held)} already hold{'s' * (len(held) == 1)} another run's files: this new run's "
            "points go beside them (one chart, two runs' values at the same steps); pass new folders (or another "
            "job_name) to keep the runs apart")


def events(record: dict, consumed_samples: int) -> list[tuple[str, float, int]]:
    """A metrics.jsonl record as DeepSpeed monitor events: (name, value, consumed samples)."""
    prefix = record["kind"].capitalize() + "/Samples/"
    return [(prefix + key, value, consumed_samples) for key, value in record.items()
            if key not in NOT_EVENTS and isinstance(value, (int, float)) and not isinstance(value, bool)]


def continue_csv_files(monitor, consumed: int) -> None:
    """A resumed run's csv_monitor files read as one run's. DeepSpeed's csvMonitor writes a header the first
    time a process writes a file, so each restart put another one mid-file, and the rows of steps a stopped
    run took after its last checkpoint (past `consumed` samples, which the resume redoes) stayed before the
    redone ones. Each file keeps its header and its rows up to `consumed` (rewritten through a temporary
    name) and counts as begun. Rank 0's work: DeepSpeed gives the other ranks no folder."""
    writer = getattr(monitor, "csv_monitor", None)
    if writer is None or not writer.log_dir or not os.path.isdir(writer.log_dir):
        return
    for path in sorted(Path(writer.log_dir).glob("*.csv")):
        with path.open(newline="") as file:
            rows = list(csv.reader(file))
        kept = rows[:1] + [row for row in rows[1:] if len(row) == 2 and row[0].isdigit() and int(row[0]) <= consumed]
        if kept != rows:
            partial = path.with_name(path.name + ".partial")
            try:
                with partial.open("w", newline="") as file:
                    csv.writer(file).writerows(kept)
                os.replace(partial, path)
            finally:
                partial.unlink(missing_ok=True)
        writer.filenames.append(path.stem)


def purge_from(writer, step: int) -> None:
    """Marks a restart at `step` in TensorBoard SummaryWriter `writer`'s open file: TensorBoard hides the events
    that earlier files hold at `step` and after (a SessionLog START event, what torch's purge_step writes at the
    head of a new file): a resumed run redoes the steps past its checkpoint, whose first values a stopped run had
    written. In the file the writer opened at the run's start, before it wrote any event: a resume adds one file
    (a writer closed and opened again with purge_step left an empty one each time)."""
    from tensorboard.compat.proto.event_pb2 import Event, SessionLog

    writer.file_writer.add_event(Event(step=step, session_log=SessionLog(status=SessionLog.START)))


def continue_tensorboard(monitor, consumed: int) -> None:
    """DeepSpeed's tensorboard monitor (its x-axis: consumed samples) continues a resumed run from the
    checkpoint's `consumed` samples, as purge_from says."""
    board = getattr(monitor, "tb_monitor", None)
    if board is not None and board.summary_writer is not None:
        purge_from(board.summary_writer, consumed + 1)

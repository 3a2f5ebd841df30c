"""What a run reports: log lines (or a progress bar on a terminal), metrics.jsonl, TensorBoard
scalars, and the loss / throughput plot at the end. Only global rank 0 writes.

metrics.jsonl is appended to by every run that logs into the folder (a resumed run continues
its file). Each record carries the `run` id of the run that wrote it, and each run first writes
a `start` record with the iteration it starts from; `read_metrics` drops what a later start
supersedes (the steps a resumed run redoes after its checkpoint, or all of an earlier run when
a new one starts from scratch), so a reader sees one history without repeated iterations."""
import atexit
import contextlib
import importlib
import io
import json
import math
import os
import resource
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

from megatron import locks, monitors, paths
from megatron.errors import ConfigError, cannot_use, disk_full
from megatron.flops import training_flops_per_sample


class RunLog:
    def __init__(self, args, config, train_iters: int, monitor=None):
        """`monitor`: the engine's DeepSpeed MonitorMaster, fed every record when the JSON enables one."""
        self.writer = dist.get_rank() == 0
        self.monitor = monitor if monitor is not None and monitor.enabled else None
        self.interval, self.train_iters = args.log_interval, train_iters
        self.tokens_per_step = config.global_batch_size * config.model.seq_length
        # each rank does 1/(sp * pp) of one data replica's work
        self.flops_per_rank_step = (training_flops_per_sample(config.model) * config.global_batch_size
                                    / dist.get_world_size())
        self.samples_per_rank_step = config.global_batch_size / dist.get_world_size()
        self.window, self.window_seconds = [], 0.0
        self.dir = Path(args.log_dir)
        self.moved = getattr(args.log_dir, "moved", "")  # why the default log dir was not used (free_log_dir)
        self.save = args.save and os.path.abspath(args.save)  # in each start record: a log dir names its checkpoints
        self.run_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
        self.tensorboard = self.bar = None
        self.failure = None  # (problem, fix) once metrics.jsonl cannot be written: the run stops
        self.last_save_s = None  # seconds the last checkpoint of this run took (saved)
        if not self.writer:
            return
        if self.monitor:  # DeepSpeed writes its own events inside engine.step, out of the trainer's reach
            self.monitor.write_events = self._guarded(self.monitor.write_events)
        _quiet_writer_thread_errors()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.metrics = open(self.dir / "metrics.jsonl", "a")
        self.metrics_file = _identity(self.dir / "metrics.jsonl")
        if self.metrics.tell() and not _ends_with_newline(self.dir / "metrics.jsonl"):
            self.metrics.write("\n")  # a killed run's torn last line stays a line of its own
        if args.tensorboard_dir:  # its package checked at start-up (tensorboard_problem)
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(args.tensorboard_dir)

    def start(self, iteration: int, line: str, **fields) -> None:
        """The run's first record: where it starts (0, or the checkpoint's iteration) and the
        line that says so on screen; on a terminal, the progress bar from there (a resume's from its
        checkpoint's iteration, its ETA of the steps left). `fields`: what else it records (the run id its
        checkpoints carry, checkpoint.RUN_ID, which tells its logs as its own wherever its folders were moved)."""
        if self.writer:
            self._append({"kind": "start", "run": self.run_id, "iteration": iteration, "time": time.time(),
                          "save": self.save, **fields})
            self._print(line)
            if sys.stdout.isatty():
                from tqdm import tqdm

                # drawn on stdout, the stream whose isatty() chose it; log lines go through bar.write
                self.bar = tqdm(total=self.train_iters, initial=iteration, unit="step", dynamic_ncols=True,
                                file=sys.stdout)

    def resumed(self, iteration: int, consumed: int) -> None:
        """The TensorBoard logs (--tensorboard-dir's, at iterations; DeepSpeed's monitors', at consumed
        samples) and the DeepSpeed monitors' files continue the checkpoint's run: the records of the steps a
        stopped run took past it, which this run redoes, are hidden or dropped (monitors.purge_from,
        continue_csv_files); a rewrite that fails stops the run as a failed write does."""
        if not self.writer:
            return
        if self.tensorboard:
            monitors.purge_from(self.tensorboard, iteration + 1)
        if not self.monitor:
            return
        try:
            monitors.continue_tensorboard(self.monitor, consumed)
            monitors.continue_csv_files(self.monitor, consumed)
        except OSError as error:
            self._monitor_failed(error)

    def config(self, config, **run_settings) -> None:
        """The resolved configuration as config.json in the log directory, one line on screen. `run_settings`:
        what else decides the run beside the model, layout and JSON (the schedule and data records a checkpoint
        keeps, the loader's workers), written beside them."""
        if self.writer:
            path = self.dir / "config.json"
            path.write_text(json.dumps({**config.to_dict(), **run_settings}, indent=2, sort_keys=True,
                                       allow_nan=False) + "\n")
            self._print(f"config: {config.summary()} (resolved: {path})")

    def _emit(self, record: dict, line: str) -> None:
        record["run"] = self.run_id
        self._append(finite_or_null(record))
        self._plot_in_tensorboard(record)
        self._write_monitors(record)
        self._print(line)

    def _append(self, record: dict) -> None:
        """One line of metrics.jsonl. A write that fails (a full disk) does not end the run here,
        on rank 0 alone, with a traceback: `failure` says why, the training loop's stop agreement
        (stop_signals.StopSignals) stops every rank at the next step, with a final checkpoint."""
        if self.failure:
            return
        try:
            if self._log_file_gone():
                self._reopen(record.get("iteration"))
                if self.failure:
                    return
            self.metrics.write(json.dumps(record, allow_nan=False) + "\n")
            self.metrics.flush()
        except OSError as error:
            with contextlib.suppress(OSError):
                self.metrics.close()  # closed with its unwritten buffer: no second error at exit
            self._failed("the run log", self.dir / "metrics.jsonl", error, "pass another --log-dir")

    def _log_file_gone(self) -> bool:
        """metrics.jsonl is no longer the file this run writes: its path names none, or another file while the one
        opened has no name left (an inode number alone may change on a FUSE mount)."""
        if not self.metrics_file or _identity(self.dir / "metrics.jsonl") == self.metrics_file:
            return False
        return not (self.dir / "metrics.jsonl").exists() or os.fstat(self.metrics.fileno()).st_nlink == 0

    def _reopen(self, iteration) -> None:
        """metrics.jsonl removed while the run trained (its --log-dir removed or emptied: a scratch cleaner, a
        user's rm): the records went into the removed file. A new one goes on from here, said once, with the
        folder's lock placed again first (keep_held: a run that took the folder meanwhile stops this one)."""
        with contextlib.suppress(OSError):
            self.metrics.close()
        self.dir.mkdir(parents=True, exist_ok=True)
        if taken := locks.keep_held(locks.LOG_LOCK):
            self.failure = taken
            return
        another = (self.dir / "metrics.jsonl").exists()  # a run that logged there meanwhile, and has ended
        self.metrics = open(self.dir / "metrics.jsonl", "a")
        self.metrics_file = _identity(self.dir / "metrics.jsonl")
        print(f"warning: --log-dir {self.dir} lost its metrics.jsonl while this run trained (the folder removed or "
              f"emptied{', then logged into by another run' if another else ''}): this run's records go on "
              f"{'after that run' + chr(39) + 's' if another else 'in a new one'} from iteration {iteration}; its "
              "earlier records, config.json and index_maps.json are gone", file=sys.stderr, flush=True)

    def _plot_in_tensorboard(self, record: dict) -> None:
        """The record's numbers as TensorBoard scalars, on disk at once, as metrics.jsonl's line (a
        rank ends by os._exit); a write that fails stops the run as _append's does."""
        if not self.tensorboard or self.failure:
            return
        try:
            # and an evaluation's consumed samples: the train curve's already
            skipped = monitors.NOT_CURVES + (("consumed_samples",) if record["kind"] != "train" else ())
            for key, value in record.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in skipped:
                    self.tensorboard.add_scalar(f"{record['kind']}/{key}", value, record["iteration"])
            self.tensorboard.flush()
        except OSError as error:
            self._failed("the TensorBoard log in", Path(self.tensorboard.log_dir), error,
                         "pass another --tensorboard-dir")

    def _write_monitors(self, record: dict) -> None:
        """The record as DeepSpeed monitor events (monitors.py), through the guarded writer."""
        if self.monitor:  # every record the monitors get (train, validation, test) holds its consumed samples
            self.monitor.write_events(monitors.events(record, record["consumed_samples"]))

    def _guarded(self, write):
        """The monitor's write_events with a failed file write (a full disk, a removed folder) taken as the
        run's `failure`, which stops it as _append's does, with a final checkpoint: raised out of DeepSpeed's
        own write in engine.step it was a traceback and no checkpoint. Nothing is written once the run failed."""
        def write_events(events, *rest, **options):
            if self.failure:
                return
            try:
                write(events, *rest, **options)
            except OSError as error:
                self._monitor_failed(error)
        return write_events

    def _monitor_failed(self, error: OSError) -> None:
        self._failed("a DeepSpeed monitor's file", Path(os.fsdecode(error.filename or "?")), error,
                     "set another output_path in the DeepSpeed JSON's monitor section")

    def _failed(self, what: str, path: Path, error: OSError, elsewhere: str) -> None:
        """The run's `failure`: what could not be written and why, fixed by free space or `elsewhere`."""
        if full := disk_full(error):
            folder = path if path.is_dir() else path.parent
            while not folder.exists() and folder != folder.parent:  # a log dir removed meanwhile: its disk
                folder = folder.parent
            reason = f"{full}, {shutil.disk_usage(folder).free / 2**20:.1f} MiB free"
        else:
            reason = error.strerror or str(error)
        self.failure = (f"cannot write {what} {path} ({reason})", f"free space there or {elsewhere}" if full else
                        elsewhere)

    def _print(self, line: str) -> None:
        """A whole line on stdout, above the progress bar when there is one."""
        if self.bar:
            self.bar.write(line)
        else:
            print(line, flush=True)

    def step(self, iteration: int, consumed: int, result, engine, seconds: float, lr: float) -> None:
        """One optimizer step; `lr` is the rate it used (read before it: the scheduler has moved on)."""
        self.window.append(result)
        self.window_seconds += seconds
        if self.bar and self.writer:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{result.loss:.4f}")
        if iteration % self.interval and iteration != self.train_iters:
            return
        window, elapsed = self.window, self.window_seconds
        self.window, self.window_seconds = [], 0.0
        if not self.writer:
            return
        mean = lambda values: sum(values) / len(values) if values and None not in values else None  # noqa: E731
        loss_scale = engine.optimizer.loss_scale if engine.fp16_enabled() else None  # every fp16 optimizer has it
        record = {
            "kind": "train", "iteration": iteration, "consumed_samples": consumed, "time": time.time(),
            "lr": lr, "loss": mean([r.loss for r in window]),
            "mlm_loss": mean([r.mlm for r in window]), "sop_loss": mean([r.sop for r in window]),
            "mlm_accuracy": mean([r.mlm_accuracy for r in window]),
            "grad_norm": window[-1].grad_norm, "loss_scale": loss_scale,
            "tokens_per_s": self.tokens_per_step * len(window) / elapsed,
            "real_token_share": mean([r.real_token_share for r in window]),
            "segments_per_sample": mean([r.segments_per_sample for r in window]),
            "tflops_per_rank": self.flops_per_rank_step * len(window) / elapsed / 1e12,
            "real_tflops_per_rank": (sum(r.real_flops_per_sample for r in window) * self.samples_per_rank_step
                                     / elapsed / 1e12),
            "peak_memory_mib": peak_memory_mib(),
            "window_steps": len(window),  # the steps the means are over: fewer after a resume, or at the end
        }
        partial = f" (mean of {len(window)} step{'s' * (len(window) > 1)})" if len(window) != self.interval else ""
        parts = [f"iteration {iteration}/{self.train_iters}", f"consumed samples {consumed}",
                 f"lr {record['lr']:.3e}", f"loss {record['loss']:.4f}{partial}"]
        parts += [f"{name} {record[key]:.4f}" for name, key in (("mlm", "mlm_loss"), ("mlm acc", "mlm_accuracy"),
                                                                ("sop", "sop_loss"), ("grad norm", "grad_norm"),
                                                                ("loss scale", "loss_scale"))
                  if record[key] is not None]
        record["real_tokens_per_s"] = record["tokens_per_s"] * record["real_token_share"]
        parts += [f"real tokens {record['real_token_share']:.2f}",
                  f"segments/sample {record['segments_per_sample']:.1f}",
                  f"tokens/s {record['tokens_per_s']:.0f} (real {record['real_tokens_per_s']:.0f})",
                  f"TFLOP/s/rank {record['tflops_per_rank']:.4f} (real {record['real_tflops_per_rank']:.4f})",
                  f"peak mem {record['peak_memory_mib']:.0f} MiB"]
        self._emit(record, " | ".join(parts))

    def evaluation(self, name: str, iteration: int, consumed: int, loss: float) -> None:
        if self.writer:
            self._emit({"kind": name, "iteration": iteration, "consumed_samples": consumed, "loss": loss,
                        "time": time.time()},
                       f"{name} loss at iteration {iteration}: {loss:.4f}")

    def message(self, text: str) -> None:
        if self.writer:
            self._print(text)

    def saved(self, folder: str, seconds: float) -> None:
        """A checkpoint written (every rank notes how long it took)."""
        self.last_save_s = seconds
        self.message(f"saved checkpoint {folder} in {seconds:.1f} s")

    def finish(self, save_dir) -> None:
        self.close()
        self.plot(save_dir)

    def close(self) -> None:
        """The progress bar and the files end; a write that failed at the last step (after which no
        stop agreement comes) is raised."""
        if not self.writer:
            return
        if self.bar:
            self.bar.close()
        self.metrics.close()
        if self.tensorboard:
            with contextlib.suppress(OSError):  # every record is on disk already (_plot_in_tensorboard)
                self.tensorboard.close()
        if self.failure:
            raise ConfigError(*self.failure)

    def plot(self, save_dir) -> None:
        """loss.png from metrics.jsonl (after close; seconds on a long run), and where the outputs are."""
        if not self.writer:
            return
        metrics = self.dir / "metrics.jsonl"
        plot = self._draw(metrics)
        print(f"logs: {metrics}{f' ({self.moved})' if self.moved else ''}\nloss plot: {plot}"
              + (f"\ncheckpoint: {saved_checkpoint(save_dir)}" if save_dir else ""),
              flush=True)

    def _draw(self, metrics: Path) -> str:
        """loss.png, or 'none (why)': a run that logged no step here (stopped before its first
        --log-interval, or a finished checkpoint given a new --log-dir) has no curve to draw, and a
        plot that fails (a full disk, a metrics.jsonl changed during the run) is a warning: the run
        trained and saved, and a requeue of a failed run would fail the same way forever."""
        try:
            records = read_metrics(metrics)
            if not any(r["kind"] == "train" for r in records):
                return "none (no training step was logged in this --log-dir)"
            return str(plot_metrics(metrics, self.dir / "loss.png", records))
        except (ConfigError, OSError) as error:
            problem = error.problem if isinstance(error, ConfigError) else cannot_use(error).problem
            print(f"warning: no loss plot: {problem}; once that is fixed, "
                  f"{paths.in_repository('tools/plot_run.py')} {self.dir} draws it", file=sys.stderr, flush=True)
            return "none (see the warning above)"


class MovedLogDir(str):
    """The log dir free_log_dir chose in place of the default, with why (`moved`), for the `logs:` line."""

    def __new__(cls, path: str, moved: str = ""):  # the default: pickle makes it again without, then sets moved
        chosen = super().__new__(cls, path)
        chosen.moved = moved
        return chosen


def free_log_dir(log_dir: str, save: str | None) -> str:
    """--log-dir as given; its default (paths.DEFAULT_LOG_DIR, runs/bert) unless another run's logs are there:
    every run without --log-dir appended to one metrics.jsonl and replaced its config.json and index_maps.json
    (clean_index_maps.py --keep-run runs/bert then kept the last run's maps only). A resume of a --save keeps
    the default folder (or runs/bert-N) whose start records name that --save, or the run id of its checkpoint
    (a moved or copied run folder: own_run_ids); otherwise the first free
    runs/bert-N. A run without --save never shares one, nor a folder a live run holds (its lock alone there:
    a run started a moment before, which has not logged yet)."""
    if log_dir is not paths.DEFAULT_LOG_DIR:
        return log_dir
    own = own_run_ids(save)
    save = save and os.path.abspath(save)
    candidates = [str(log_dir)] + [f"{log_dir}-{number}" for number in range(2, 10_000)]
    holder = locks.held_by_another(os.path.join(log_dir, locks.LOG_LOCK))
    why = f"{log_dir} is in use by a live run ({holder})" if holder else f"{log_dir} holds another run's logs"
    for candidate in candidates:
        if locks.held_by_another(os.path.join(candidate, locks.LOG_LOCK)):
            continue
        starts = _start_records(Path(candidate))
        if starts is None:  # free: no run's records
            break
        if (save and save in {record.get("save") for record in starts}) or own & _run_ids(starts):
            return candidate if candidate == log_dir else MovedLogDir(candidate, f"{why}; those of --save {save} are "
                                                                                  "here")
    if candidate == log_dir:
        return log_dir
    return MovedLogDir(candidate, f"{why}; --log-dir DIR picks the folder")


def logs_record(args) -> dict:
    """The folders this run logs into, absolute, for its checkpoints (checkpoint.LOGS): a resume that logs
    elsewhere names them (split_logs_warning)."""
    return {"log_dir": os.path.abspath(args.log_dir) if args.log_dir else None,
            "tensorboard_dir": os.path.abspath(args.tensorboard_dir) if args.tensorboard_dir else None}


def split_logs_warning(recorded: dict | None, now: dict) -> str | None:
    """The line of a resume whose --log-dir or --tensorboard-dir (`now`: logs_record) is another folder than
    the checkpoint's run logged into (`recorded`: its checkpoint.LOGS; None for one saved before checkpoints
    recorded it): the run goes on (a job's requeue may log per job, as Megatron and DeepSpeed allow), its
    records split between the folders, said once with the flags that keep one log. A recorded folder that is
    gone (removed, or moved with the run) splits nothing; a resume without --tensorboard-dir writes none."""
    split = []
    for key, flag, what in (("log_dir", "--log-dir", "metrics.jsonl and config.json"),
                            ("tensorboard_dir", "--tensorboard-dir", "TensorBoard curves")):
        then, here = (recorded or {}).get(key), now.get(key)
        if then and here and os.path.isdir(then) and paths.where_in(here, then) != "the":
            split.append((flag, then, here, what))
    if not split:
        return None
    return (f"warning: this resume logs into {' and '.join(f'{flag} {here}' for flag, _, here, _ in split)}, the "
            f"checkpoint's run logged into {' and '.join(then for _, then, _, _ in split)}: the run's "
            f"{' and its '.join(what for *_, what in split)} are split between the folders; pass "
            f"{' '.join(f'{flag} {then}' for flag, then, _, _ in split)} to continue them in one")


def logged_save(args) -> str | None:
    """The checkpoint folder whose logs a run continues: its --save, else the --load it resumes without saving
    (which logged into a folder of its own: the one that names that folder)."""
    return args.save or (None if args.finetune else args.load)


def _start_records(folder: Path) -> list | None:
    """The start records of the runs a log dir holds records of (their --save, None for a run without one, and
    the run id their checkpoints carry); None when it holds no run's records (missing, empty, or only its lock)."""
    metrics = folder / "metrics.jsonl"
    starts = []
    with contextlib.suppress(OSError, UnicodeDecodeError):
        for line in metrics.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(json.JSONDecodeError, AttributeError):
                record = json.loads(line)
                if record.get("kind") == "start":
                    starts.append(record)
    if starts or any((folder / name).exists() for name in ("metrics.jsonl", "config.json", "index_maps.json")):
        return starts
    return None


def own_run_ids(*folders) -> set:
    """The run ids (checkpoint.RUN_ID) of the latest checkpoints of the checkpoint `folders` (None: skipped):
    a log whose start records carry one is the log of the run they continue, wherever the run's folders
    were moved or copied since (the start records keep the --save path of their day)."""
    from megatron import checkpoint  # here: tools/plot_run.py imports this module without the model's

    return set(filter(None, (checkpoint.run_id(folder) for folder in folders)))


def _run_ids(starts: list) -> set:
    from megatron.checkpoint import RUN_ID

    return {record.get(RUN_ID) for record in starts} - {None}


def metrics_problem(log_dir: str) -> tuple[str, str] | None:
    """(problem, fix) when --log-dir holds a metrics.jsonl that is no run log of this trainer (read_metrics
    refuses it): found at start-up, before any step, not at the plot after the run trained and saved (a
    requeue then failed the same way forever). A torn last line is a killed run's, which a resume appends after."""
    metrics = Path(log_dir) / "metrics.jsonl"
    if not os.path.lexists(metrics):
        return None
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # a torn line's warning: said once, at the plot
            read_metrics(metrics)
    except ConfigError as error:
        return (f"--log-dir {log_dir} holds a metrics.jsonl that is not a run log of this trainer ({error.problem})",
                f"pass another --log-dir, or move {metrics} away")
    return None


def shared_log_dir_warning(log_dir: str, save: str | None, load: str | None, finetune: bool) -> str | None:
    """The warning for a --log-dir given on the command line that holds another run's records (a run of
    another --save, or one without --save): this run appends to its metrics.jsonl and replaces its
    config.json, index_maps.json and loss.png (free_log_dir moves the default folder aside instead; a
    folder typed is taken as given). No warning for a resume of a run logged there (its --save or --load
    is in the start records, or the run id of their checkpoint, moved or copied since), except with
    --finetune, a new run."""
    starts = _start_records(Path(log_dir))
    if not starts:
        return None
    saves = {record.get("save") for record in starts}
    folders = (save, None if finetune else load)
    if {os.path.abspath(folder) for folder in folders if folder} & saves or own_run_ids(*folders) & _run_ids(starts):
        return None
    others = ", ".join(sorted(f"--save {folder}" if folder else "one without --save" for folder in saves))
    return (f"warning: --log-dir {log_dir} holds the logs of another run ({others}): this run appends its records to "
            "that metrics.jsonl and replaces its config.json, index_maps.json and loss.png; pass another --log-dir "
            "to keep both")


def saved_checkpoint(save_dir) -> str:
    """The footer's checkpoint: --save once it holds one (its `latest`, written last by a save), else
    none: a run stopped before its first save must not name a folder that is not there."""
    from megatron.checkpoint import LATEST  # here: tools/plot_run.py imports this module without the model's

    return str(save_dir) if (Path(save_dir) / LATEST).is_file() else f"none (nothing was saved in {save_dir})"


def tensorboard_problem() -> tuple[str, str] | None:
    """(problem, fix) when --tensorboard-dir's writer cannot be imported."""
    try:
        importlib.import_module("torch.utils.tensorboard")  # fails without the tensorboard package
    except ImportError:
        return ("--tensorboard-dir needs the tensorboard package",
                "pip install -r requirements.txt (it pins tensorboard), or drop --tensorboard-dir")
    return None


def finite_or_null(record: dict) -> dict:
    """The record with NaN / inf values (a skipped step's loss, an fp16 overflow's grad norm) as null:
    metrics.jsonl stays JSON that strict readers accept; the screen line and TensorBoard keep them."""
    return {key: None if isinstance(value, float) and not math.isfinite(value) else value
            for key, value in record.items()}


def peak_memory_mib() -> float:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


METRICS_FIX = "pass the metrics.jsonl a run wrote under --log-dir"
# the fields plot_metrics reads, by record kind
PLOTTED = {"train": ("iteration", "loss", "tokens_per_s"), "validation": ("iteration", "loss"),
           "test": ("iteration", "loss")}


def _quiet_writer_thread_errors() -> None:
    """TensorBoard's writer thread keeps a failed write (a full disk, a removed folder) and raises it again
    in the thread that writes next, where the run takes it as its failure in one line; on its way out
    the thread printed its own traceback first. Installed once per process; other threads' errors print."""
    if getattr(threading.excepthook, "quiet_writer_threads", False):
        return
    previous = threading.excepthook

    def hook(args):
        if not (type(args.thread).__name__ == "_AsyncWriterThread" and issubclass(args.exc_type, OSError)):
            previous(args)
    hook.quiet_writer_threads = True
    threading.excepthook = hook


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as file:
        file.seek(-1, os.SEEK_END)
        return file.read(1) == b"\n"


def read_metrics(path) -> list:
    """The records of a metrics.jsonl; a missing file, or a line that is not a record with the
    fields its kind needs, is a ConfigError naming the line. A torn record (the start of a JSON
    object cut off by a killed run, which a resumed run appends after) is skipped with a warning."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path} is a directory", f"pass the metrics.jsonl file, e.g. {path / 'metrics.jsonl'}")
    if not path.is_file():
        raise ConfigError(f"{path} {'is not a file' if path.exists() else 'does not exist'}", METRICS_FIX)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not UTF-8 text (a binary file?)", METRICS_FIX) from None
    records, torn = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if line.startswith("{"):
                torn.append(number)
                continue
            record = None
        if not isinstance(record, dict) or not isinstance(record.get("kind"), str):
            raise ConfigError(f"{path} line {number} is not a run-log record (a JSON object with a kind)", METRICS_FIX)
        missing = [key for key in PLOTTED.get(record["kind"], ()) if not isinstance(record.get(key), (int, float))
                   and not (key == "loss" and key in record and record[key] is None)]  # null: a NaN / inf loss
        if missing:
            key = missing[0]
            found = f"whose {key} is {json.dumps(record[key])[:40]}, not a number" if key in record else \
                f"without {', '.join(missing)}"
            raise ConfigError(f"{path} line {number}: a {record['kind']} record {found}", METRICS_FIX)
        records.append(record)
    if torn:
        print(f"warning: {path}: skipped torn line(s) {', '.join(map(str, torn))} (a killed run's last write)",
              file=sys.stderr, flush=True)
    return superseded_dropped(records)


def superseded_dropped(records: list) -> list:
    """The records without those a later run's `start` supersedes: a run starting at iteration N
    redoes every step after N, so earlier records beyond N (and all earlier records when N is 0,
    a new run from scratch) belong to a history that no checkpoint continues. An evaluation at an iteration
    that a later record evaluates again (the same command rerun on a finished run: `nothing to train`, the
    final losses computed again) is the later one's."""
    kept = []
    for record in records:
        if record["kind"] == "start":
            start = record.get("iteration", 0)
            kept = [r for r in kept if start > 0 and (r["kind"] == "start" or r.get("iteration", 0) <= start)]
        elif record["kind"] in EVALUATIONS:
            kept = [r for r in kept if (r["kind"], r.get("iteration")) != (record["kind"], record.get("iteration"))]
        kept.append(record)
    return kept


EVALUATIONS = ("validation", "test")


def _identity(path: Path) -> tuple | None:
    """(device, inode) of the file at `path`; None when there is none: the run log's file was removed (or
    replaced) while the run wrote it when its path no longer names the file it opened."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_dev, status.st_ino


def _private_matplotlib_config() -> None:
    """A temporary MPLCONFIGDIR, removed at exit, where matplotlib's config or cache folder cannot be made (a
    read-only home, a root-owned ~/.cache after `sudo pip`, a container user without one): matplotlib then does
    the same after two lines of logging noise in a run's output (`mkdir -p failed ...`, `Matplotlib created a
    temporary cache directory ...`)."""
    if "matplotlib" in sys.modules or os.environ.get("MPLCONFIGDIR"):
        return
    folders = [Path(os.environ.get(variable) or Path.home() / default) / "matplotlib"
               for variable, default in (("XDG_CONFIG_HOME", ".config"), ("XDG_CACHE_HOME", ".cache"))]
    for folder in folders:
        with contextlib.suppress(OSError):
            folder.mkdir(parents=True, exist_ok=True)
    if not all(os.access(folder, os.W_OK) for folder in folders):
        os.environ["MPLCONFIGDIR"] = tempfile.mkdtemp(prefix="matplotlib-")
        atexit.register(shutil.rmtree, os.environ["MPLCONFIGDIR"], True)


def plot_metrics(metrics_path, png_path, records: list | None = None) -> Path:
    """Loss (train, validation) and throughput against iteration, as one PNG (`records`: the file's,
    where the caller has read them)."""
    _private_matplotlib_config()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(metrics_path) if records is None else records
    train = [r for r in records if r["kind"] == "train"]
    if not train:
        raise ConfigError(f"{metrics_path} has no train records",
                          f"{METRICS_FIX} after its first --log-interval steps")
    fig, (loss_ax, speed_ax) = plt.subplots(1, 2, figsize=(11, 4))
    def losses(points: list) -> list:  # a non-finite loss (null) is a gap in the curve
        return [math.nan if r["loss"] is None else r["loss"] for r in points]

    loss_ax.plot([r["iteration"] for r in train], losses(train), label="train")
    for kind in ("validation", "test"):
        points = [r for r in records if r["kind"] == kind]
        if points:
            loss_ax.plot([r["iteration"] for r in points], losses(points), "o-", label=kind)
    sop = any(r.get("sop_loss") is not None for r in train)  # no sentence-order head: MLM alone
    loss_ax.set(xlabel="iteration", ylabel="loss (MLM + SOP)" if sop else "loss (MLM)")
    loss_ax.legend()
    speed_ax.plot([r["iteration"] for r in train], [r["tokens_per_s"] for r in train])
    speed_ax.set(xlabel="iteration", ylabel="tokens / s")
    for ax in (loss_ax, speed_ax):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    png_path = Path(png_path)
    png_path = png_path if png_path.suffix else png_path.with_name(png_path.name + ".png")  # as savefig names it
    if png_path.suffix[1:].lower() not in fig.canvas.get_supported_filetypes():
        plt.close(fig)
        raise ConfigError(f"{png_path}: matplotlib cannot write {png_path.suffix} files",
                          "pass a name ending in .png (or .pdf, .svg)")
    png_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
    return png_path

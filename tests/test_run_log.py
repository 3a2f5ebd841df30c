"""The run log: plain lines when stdout is not a terminal, a progress bar when it is, and
tools/plot_run.py turning a metrics.jsonl into a PNG (or one error line)."""
import errno
import io
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from bert_fixtures import small_config
from megatron import run_log
from megatron.errors import ConfigError, LosableStream, run_tool

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import plot_run  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class Terminal(io.StringIO):
    """A stdout that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def rank_0_run_log(monkeypatch, log_dir: Path, steps: int, interval: int, tensorboard_dir=None,
                   save=None, monitor=None) -> run_log.RunLog:
    """The RunLog of global rank 0 of 1, 4 samples of 48 tokens a step (`monitor`: the engine's)."""
    monkeypatch.setattr(run_log.dist, "get_rank", lambda: 0)
    monkeypatch.setattr(run_log.dist, "get_world_size", lambda: 1)
    args = SimpleNamespace(log_interval=interval, log_dir=str(log_dir), tensorboard_dir=tensorboard_dir,
                           save=save)
    config = SimpleNamespace(global_batch_size=4, model=small_config(seq_length=48))
    return run_log.RunLog(args, config, train_iters=steps, monitor=monitor)


def write_run_log(log_dir: Path, stdout: io.StringIO, monkeypatch, steps=4, interval=2, first=None) -> Path:
    """Drives RunLog as pretrain() does: `steps` steps of 0.5 s each with loss 10 - iteration,
    a checkpoint message, a validation and a test loss, then finish(). `first`: the iteration of a start
    record first (a resume's checkpoint's: the steps after it). -> metrics.jsonl."""
    monkeypatch.setattr(sys, "stdout", stdout)
    log = rank_0_run_log(monkeypatch, log_dir, steps, interval)
    engine = SimpleNamespace(fp16_enabled=lambda: False)
    if first is not None:
        log.start(first, f"starting at iteration {first}")
    for iteration in range(1 + (first or 0), steps + 1):
        loss = 10.0 - iteration
        result = SimpleNamespace(loss=loss, mlm=loss - 0.75, sop=0.75, grad_norm=1.5, mlm_accuracy=0.125 * iteration,
                                 real_token_share=0.25 * (iteration % 2 + 1), segments_per_sample=iteration,
                                 real_flops_per_sample=1e9 * iteration)
        log.step(iteration, 4 * iteration, result, engine, seconds=0.5, lr=1e-3)
    log.message("saved checkpoint ckpt/iter_0000004")
    log.evaluation("validation", steps, 0, 6.5)
    log.evaluation("test", steps, 0, 6.25)
    log.finish(None)
    return log_dir / "metrics.jsonl"


def test_plain_lines_when_stdout_is_not_a_terminal(tmp_path, monkeypatch):
    stdout = io.StringIO()
    metrics = write_run_log(tmp_path / "log", stdout, monkeypatch)
    text = stdout.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    # 2 steps of 4 samples x 48 tokens in 1 s: 384 tokens/s, of which a mean 0.375 are real
    assert lines[0].startswith("iteration 2/4 | consumed samples 8 | lr 1.000e-03 | loss 8.5000 | mlm 7.7500 | "
                               "mlm acc 0.1875 | sop 0.7500 | grad norm 1.5000 | real tokens 0.38 | segments/sample 1.5 | "
                               "tokens/s 384 (real 144) | TFLOP/s/rank "), lines[0]
    # real: (1 + 2) GFLOP a sample x 4 samples a step, in 1 s
    assert re.search(r" \| TFLOP/s/rank \d\.\d{4} \(real 0\.0120\) \| ", lines[0]), lines[0]
    assert lines[1].startswith("iteration 4/4 | consumed samples 16 | lr 1.000e-03 | loss 6.5000 | "), lines[1]
    assert " MiB" in lines[0] and "loss scale" not in lines[0]  # fp32: no loss scale
    assert lines[2:5] == ["saved checkpoint ckpt/iter_0000004", "validation loss at iteration 4: 6.5000",
                          "test loss at iteration 4: 6.2500"]
    assert lines[5:] == [f"logs: {metrics}", f"loss plot: {metrics.with_name('loss.png')}"]
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [(r["kind"], r["iteration"], r["loss"]) for r in records] == [
        ("train", 2, 8.5), ("train", 4, 6.5), ("validation", 4, 6.5), ("test", 4, 6.25)]
    assert set(records[0]) == {"kind", "run", "iteration", "consumed_samples", "time", "lr", "loss", "mlm_loss", "sop_loss",
                               "grad_norm", "loss_scale", "tokens_per_s", "tflops_per_rank", "real_tflops_per_rank", "peak_memory_mib",
                               "real_token_share", "segments_per_sample", "real_tokens_per_s", "mlm_accuracy",
                               "window_steps"}
    assert [r["window_steps"] for r in records if r["kind"] == "train"] == [2, 2]


def test_a_window_shorter_than_the_log_interval_says_so(tmp_path, monkeypatch):
    """A resume from a checkpoint between two log lines, or a run whose --train-iters is no multiple of
    --log-interval, logs means over fewer steps than the others: the line and the record say how many (the
    resumed run's first line read as the uninterrupted run's, with another value)."""
    stdout = io.StringIO()
    metrics = write_run_log(tmp_path / "log", stdout, monkeypatch, steps=7, interval=3, first=2)
    lines = [line for line in stdout.getvalue().splitlines() if line.startswith("iteration")]
    assert [line.split(" | ")[3] for line in lines] == ["loss 7.0000 (mean of 1 step)", "loss 5.0000",
                                                        "loss 3.0000 (mean of 1 step)"], lines
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [(r["iteration"], r["window_steps"]) for r in records if r["kind"] == "train"] == [(3, 1), (6, 3), (7, 1)]


def test_progress_bar_when_stdout_is_a_terminal(tmp_path, monkeypatch):
    """The bar counts the run's steps from where it starts: a resume's from its checkpoint's iteration (it
    showed 0/4 there, and ended at 2/4 with an ETA of four steps)."""
    stdout = Terminal()
    write_run_log(tmp_path / "log", stdout, monkeypatch, first=0)
    text = stdout.getvalue()
    assert "\r" in text and "0/4 [" in text and "4/4 [" in text  # tqdm redraws its "n/total [..." line in place
    resumed = Terminal()
    write_run_log(tmp_path / "resumed", resumed, monkeypatch, first=2)
    assert "2/4 [" in resumed.getvalue() and "4/4 [" in resumed.getvalue() and "0/4" not in resumed.getvalue()
    # log lines are written whole above the bar (after tqdm clears it with \r)
    shown = [segment.split("\r")[-1] for segment in text.split("\n")]
    assert any(line.startswith("iteration 2/4 | consumed samples 8 | ") for line in shown), text
    assert "saved checkpoint ckpt/iter_0000004" in shown and "test loss at iteration 4: 6.2500" in shown


class ClosingTerminal(Terminal):
    """A terminal that closes after `room` characters (its window closed, an SSH session dropped):
    every write and flush from then on fails with EIO."""

    def __init__(self, room: int):
        super().__init__()
        self.room = room

    def write(self, text: str) -> int:
        if self.tell() + len(text) > self.room:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return super().write(text)

    def flush(self) -> None:
        if self.tell() >= self.room:
            raise OSError(errno.EIO, os.strerror(errno.EIO))


def test_a_closed_terminal_ends_the_screen_output_not_the_run(tmp_path, monkeypatch):
    """pretrain_bert.py's stdout (errors.survive_lost_terminal) on a terminal that closes mid-run: the
    progress bar and the log lines stop, every record still reaches metrics.jsonl (a rank used to die
    at its next log line, in tqdm's write)."""
    stdout = LosableStream(ClosingTerminal(room=300))
    stdout.name, stdout.other = "stdout", LosableStream(Terminal(), "stderr")
    metrics = write_run_log(tmp_path / "log", stdout, monkeypatch, steps=6, interval=1)
    assert stdout.lost  # a stream without a file descriptor: its writes are dropped
    assert stdout.other.getvalue() == ("stdout's terminal is gone: its output is dropped from now on; metrics.jsonl "
                                       "keeps every record\n")  # once
    assert [(r["kind"], r["iteration"]) for r in run_log.read_metrics(metrics)] == [
        *(("train", iteration) for iteration in range(1, 7)), ("validation", 6), ("test", 6)]


def test_a_stream_whose_reader_is_gone_writes_into_dev_null():
    """EPIPE (`| head`, a dead tee): the stream's descriptor then points to /dev/null, so that its
    buffered text and later writes, a C library's included, go nowhere without an error, nor a word on
    the other stream (a reader ending is how `| head` works; a closed terminal is told there)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    stderr = LosableStream(Terminal(), "stderr")
    with open(write_end, "w") as pipe:
        stream = LosableStream(pipe, "stdout", other=stderr)
        print("a line the reader never sees", file=stream, flush=True)
        print("nor this", file=stream, flush=True)
        assert not stream.lost and os.path.samestat(os.fstat(write_end), os.stat(os.devnull))
    assert stderr.getvalue() == ""


class FailingDisk:
    """stdout redirected to a regular file (`> run.log`) whose file system fails (NFS, Lustre): EIO."""

    def __init__(self, file):
        self.file = file

    def fileno(self) -> int:
        return self.file.fileno()

    def write(self, text: str) -> int:
        raise OSError(errno.EIO, os.strerror(errno.EIO))


def test_an_io_error_of_a_regular_file_stays_an_error(tmp_path):
    """Only a terminal, pipe or socket is lost silently: a file's EIO is the disk's, not a closed
    window (was: the run's log went to /dev/null without a word)."""
    with open(tmp_path / "run.log", "w") as log:
        stream = LosableStream(FailingDisk(log), "stdout", other=LosableStream(Terminal(), "stderr"))
        with pytest.raises(OSError) as failed:
            stream.write("a line")
        assert failed.value.errno == errno.EIO and not stream.lost and not stream.other.getvalue()


def test_tensorboard_records_are_on_disk_before_finish(tmp_path, monkeypatch):
    """A rank ends by os._exit (training.exit_rank), and a run that fails mid-way never calls
    finish(): each record reaches TensorBoard's event file when it is logged, as metrics.jsonl's line."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setattr(sys, "stdout", io.StringIO())
    log = rank_0_run_log(monkeypatch, tmp_path / "log", steps=10, interval=1, tensorboard_dir=str(tmp_path / "tb"))
    log.evaluation("validation", 3, 0, 6.5)
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("validation/loss")] == [(3, 6.5)]


def test_a_resume_hides_the_tensorboard_events_of_the_steps_it_redoes(tmp_path, monkeypatch):
    """A run stopped at step 5 after its checkpoint at 3 had written steps 4 and 5; the resume redoes them.
    TensorBoard shows one curve: the resumed run's values from step 4 (a restart event, as torch's purge_step
    writes), for --tensorboard-dir's events (at iterations) and DeepSpeed's tensorboard monitor's (at consumed
    samples). The resume adds one events file to each folder (a writer closed and opened again left an empty one)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    def scalars(folder, tag):
        events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
        events.Reload()
        return [(event.step, event.value) for event in events.Scalars(tag)]

    monkeypatch.setattr(sys, "stdout", io.StringIO())
    stopped = rank_0_run_log(monkeypatch, tmp_path / "log", steps=10, interval=1, tensorboard_dir=str(tmp_path / "tb"))
    board = SimpleNamespace(summary_writer=SummaryWriter(str(tmp_path / "ds_tb")))
    stopped.monitor = SimpleNamespace(tb_monitor=board, write_events=lambda events: [
        board.summary_writer.add_scalar(*event) for event in events])
    for iteration in (1, 2, 3, 4, 5):
        stopped.evaluation("validation", iteration, 4 * iteration, 10.0 - iteration)
    resumed = rank_0_run_log(monkeypatch, tmp_path / "log", steps=10, interval=1, tensorboard_dir=str(tmp_path / "tb"))
    resumed.monitor = SimpleNamespace(tb_monitor=SimpleNamespace(summary_writer=SummaryWriter(str(tmp_path / "ds_tb"))))
    resumed.resumed(iteration=3, consumed=12)
    board = resumed.monitor.tb_monitor
    resumed.monitor.write_events = lambda events: [board.summary_writer.add_scalar(*event) for event in events]
    for iteration in (4, 5, 6):
        resumed.evaluation("validation", iteration, 4 * iteration, 0.5 * iteration)
    board.summary_writer.flush()
    expected = [(1, 9.0), (2, 8.0), (3, 7.0), (4, 2.0), (5, 2.5), (6, 3.0)]
    assert scalars(tmp_path / "tb", "validation/loss") == expected
    assert scalars(tmp_path / "ds_tb", "Validation/Samples/loss") == [(4 * step, value) for step, value in expected]
    for folder in ("tb", "ds_tb"):  # the stopped run's and the resume's
        assert len(list((tmp_path / folder).glob("events.out.tfevents.*"))) == 2, folder


def test_a_tensorboard_write_that_fails_stops_the_run_as_the_run_logs_does(tmp_path, monkeypatch):
    """A full disk under --tensorboard-dir: no traceback on rank 0 alone, a `failure` that the stop
    agreement turns into a stop of every rank with one line; the run log and the screen go on."""
    import errno

    monkeypatch.setattr(sys, "stdout", io.StringIO())
    log = rank_0_run_log(monkeypatch, tmp_path / "log", steps=10, interval=1, tensorboard_dir=str(tmp_path / "tb"))

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(log.tensorboard, "flush", full)
    log.evaluation("validation", 3, 0, 6.5)
    assert log.failure[0].startswith(f"cannot write the TensorBoard log in {tmp_path / 'tb'} (the disk is full, ")
    assert log.failure[1] == "free space there or pass another --tensorboard-dir"
    assert run_log.read_metrics(tmp_path / "log" / "metrics.jsonl")[-1]["loss"] == 6.5
    with pytest.raises(ConfigError, match="cannot write the TensorBoard log in"):  # at the last step, as metrics.jsonl's
        log.finish(None)


def test_tensorboard_dir_without_the_package_is_a_start_up_error(tmp_path, monkeypatch):
    """Checked with the log folders, before any work, rather than when rank 0 opens the log."""
    from megatron import training

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # its import now fails
    monkeypatch.setattr(training.dist, "get_rank", lambda: 0)
    monkeypatch.setattr(training.dist, "broadcast_object_list", lambda found, src: None)  # one rank
    args = SimpleNamespace(log_dir=str(tmp_path / "log"), tensorboard_dir=str(tmp_path / "tb"), deepspeed_config=None)
    with pytest.raises(ConfigError, match="--tensorboard-dir needs the tensorboard package; pip install"):
        training.check_log_dirs(args, {})
    assert list(tmp_path.iterdir()) == []


def test_plot_run_writes_a_png(tmp_path, monkeypatch):
    stdout = io.StringIO()
    metrics = write_run_log(tmp_path / "log", stdout, monkeypatch)
    metrics.with_name("loss.png").unlink()  # finish() drew one; plot_run must draw its own
    png = tmp_path / "plots" / "run.png"
    assert plot_run.main([str(metrics), "-o", str(png)]) == 0
    assert plot_run.main([str(metrics)]) == 0
    metrics.with_name("loss.png").unlink()
    assert plot_run.main([str(metrics.parent)]) == 0  # the --log-dir itself
    assert plot_run.main([str(metrics), "-o", str(tmp_path / "plain")]) == 0  # matplotlib adds .png: said so
    for path in (png, metrics.with_name("loss.png"), tmp_path / "plain.png"):
        data = path.read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 1000, path
    assert stdout.getvalue().splitlines()[-4:] == [str(png), str(metrics.with_name("loss.png")),
                                                   str(metrics.with_name("loss.png")), str(tmp_path / "plain.png")]
    with pytest.raises(ConfigError, match=r"run.v2: matplotlib cannot write .v2 files; pass a name ending in .png"):
        plot_run.main([str(metrics), "-o", str(tmp_path / "new" / "run.v2")])
    assert not (tmp_path / "new").exists()


def test_plot_run_into_a_folder_writes_its_loss_png(tmp_path, monkeypatch, capsys):
    """-o a folder (an existing one, `.`, `..`, or a name ending in /) gets loss.png in it, as a folder
    given for the metrics stands for its metrics.jsonl (was: `-o .` a ValueError traceback, `-o plots/`
    and `-o ..` a plots.png or ...png written beside the folder); an empty -o is one line."""
    stdout = io.StringIO()
    metrics = write_run_log(tmp_path / "log", stdout, monkeypatch)
    work = tmp_path / "work"
    (work / "plots").mkdir(parents=True)
    monkeypatch.chdir(work)
    for given, written in ((".", work / "loss.png"), ("plots", work / "plots" / "loss.png"),
                           ("plots/", work / "plots" / "loss.png"), ("..", tmp_path / "loss.png"),
                           ("new/", work / "new" / "loss.png")):
        assert plot_run.main([str(metrics), "-o", given]) == 0
        assert stdout.getvalue().splitlines()[-1] == str(Path(given) / "loss.png")
        assert written.read_bytes()[:8] == PNG_MAGIC
        written.unlink()
    assert sorted(path.name for path in tmp_path.rglob("*.png")) == ["loss.png"]  # the run's own, in log/
    assert run_tool("plot_run.py", lambda: plot_run.main([str(metrics), "-o", ""])) == 2
    assert capsys.readouterr().err == ("plot_run.py: error: -o '' is empty; pass a PNG file name, or a folder for its "
                                       "loss.png\n")
    # a file where the PNG's folder goes (the metrics file itself): named as such, not "(File exists)"
    assert run_tool("plot_run.py", lambda: plot_run.main([str(metrics), "-o", str(metrics / "x.png")])) == 2
    assert capsys.readouterr().err == (f"plot_run.py: error: -o {metrics} is a file, not a directory; pass -o a PNG "
                                       "path in a folder this user can write\n")



@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc and /dev/null")
def test_plot_run_names_an_output_that_is_no_file_or_a_folder_that_takes_none(tmp_path, monkeypatch, capsys):
    """-o /dev/null wrote /dev/null.png without a word; -o /proc/x.png said '/proc is not writable (No such file or
    directory)' of a folder that is there."""
    metrics = write_run_log(tmp_path / "log", io.StringIO(), monkeypatch)
    fix = "pass -o a PNG path in a folder this user can write"
    for given, problem in (("/dev/null", "-o /dev/null is not a regular file (a device, a pipe or a socket)"),
                           ("/proc/x.png", "-o /proc takes no new files (a virtual file system such as /proc or "
                                           "/sys)")):
        assert run_tool("plot_run.py", lambda: plot_run.main([str(metrics), "-o", given])) == 2
        assert capsys.readouterr().err == f"plot_run.py: error: {problem}; {fix}\n"
    assert not os.path.exists("/dev/null.png")


TRAIN = {"kind": "train", "iteration": 10, "consumed_samples": 40, "loss": 9.2, "tokens_per_s": 512.0}


@pytest.mark.parametrize("content,message", [
    (None, "does not exist"),
    ("", "has no train records"),
    (json.dumps({"kind": "validation", "iteration": 10, "loss": 7.5}), "has no train records"),
    (json.dumps(TRAIN) + "\n[\"kind\", \"train\", \"iter", "line 2 is not a run-log record"),
    ("[1, 2]", "line 1 is not a run-log record"),
    (json.dumps({**TRAIN, "loss": "9.2"}), 'line 1: a train record whose loss is "9.2", not a number'),
    (json.dumps({key: value for key, value in TRAIN.items() if key != "loss"}), "line 1: a train record without loss"),
])
def test_plot_run_bad_log_is_one_line(tmp_path, capsys, content, message):
    metrics = tmp_path / "metrics.jsonl"
    if content is not None:
        metrics.write_text(content)
    code = run_tool("plot_run.py", lambda: plot_run.main([str(metrics)]))
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith(f"plot_run.py: error: {metrics}") and message in err, err
    assert not (tmp_path / "loss.png").exists()


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full (Linux has one)")
def test_a_tool_whose_write_fills_the_disk_is_one_line(tmp_path, capsys, monkeypatch):
    """A write() or flush that fails for a full disk names no file (a PNG onto /dev/full here, past plot_run's
    check of -o, which refuses a device): run_tool says the disk is full and the fix, exit 2, where it re-raised
    the OSError (a traceback)."""
    metrics, png = tmp_path / "metrics.jsonl", tmp_path / "loss.png"
    metrics.write_text(json.dumps(TRAIN) + "\n")
    png.symlink_to("/dev/full")
    monkeypatch.setattr(plot_run, "png_path", lambda output, metrics: Path(output))
    assert run_tool("plot_run.py", lambda: plot_run.main([str(metrics), "-o", str(png)])) == 2
    assert capsys.readouterr().err == ("plot_run.py: error: a write failed: the disk is full (No space left on "
                                       "device); free space on the disk the output goes to, or write it to another "
                                       "disk\n")


def test_a_tools_warnings_are_one_line_each(capsys):
    """run_tool(one_line_warnings=True), convert_checkpoint.py's and fill_mask.py's: a library's warning is
    `warning: <message>`, not Python's file:line and source line; the caller's hook is back afterwards."""
    import warnings

    before = warnings.showwarning
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert run_tool("fill_mask.py", lambda: warnings.warn("the head is untrained"), one_line_warnings=True) == 0
    assert capsys.readouterr().err == "warning: the head is untrained\n"
    assert warnings.showwarning is before


def test_resumed_run_appends_after_a_torn_line_and_still_plots(tmp_path, monkeypatch, capsys):
    """SIGKILL can cut a record in half; the resumed run's records start on a new line, and the
    plot at its end skips the torn one."""
    metrics = tmp_path / "log" / "metrics.jsonl"
    metrics.parent.mkdir()
    metrics.write_text(json.dumps(TRAIN) + "\n" + json.dumps({**TRAIN, "iteration": 20})[:25])
    write_run_log(metrics.parent, io.StringIO(), monkeypatch)  # finish() plots
    assert metrics.with_name("loss.png").read_bytes()[:8] == PNG_MAGIC
    assert "skipped torn line(s) 2" in capsys.readouterr().err
    assert [r["iteration"] for r in run_log.read_metrics(metrics)] == [10, 2, 4, 4, 4]


def test_plot_run_script_exit_code(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "plot_run.py"), str(tmp_path / "metrics.jsonl")],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr == (f"plot_run.py: error: {tmp_path / 'metrics.jsonl'} does not exist; "
                             "pass the metrics.jsonl a run wrote under --log-dir\n")


def test_a_resumed_run_supersedes_the_steps_it_redoes(tmp_path, monkeypatch):
    """Each run writes a start record and tags its records with its run id; a run resumed at
    iteration 2 redoes 3 and 4 (logged by a run killed after its checkpoint at 2): the reader
    keeps the resumed run's, and a new run from scratch hides everything before it."""
    log_dir = tmp_path / "log"
    metrics = write_run_log(log_dir, io.StringIO(), monkeypatch, steps=4, interval=1)  # a run without start record
    stdout = io.StringIO()
    monkeypatch.setattr(sys, "stdout", stdout)
    monkeypatch.setattr(run_log.os, "getpid", lambda: 424242)  # another process: another run id
    log = rank_0_run_log(monkeypatch, log_dir, steps=4, interval=1)
    log.start(2, "resuming from ckpt/iter_0000002 iteration 2, consumed samples 8", resumed_from="ckpt/iter_0000002")
    engine = SimpleNamespace(fp16_enabled=lambda: False)
    for iteration in (3, 4):
        result = SimpleNamespace(loss=1.0, mlm=0.5, sop=0.5, grad_norm=1.0, mlm_accuracy=0.5, real_token_share=1.0,
                                 segments_per_sample=1.0,
                                 real_flops_per_sample=1e9)
        log.step(iteration, 4 * iteration, result, engine, seconds=0.5, lr=1e-3)
    log.evaluation("validation", 4, 16, 6.5)  # the run's final losses, which a rerun of the same command repeats
    log.evaluation("test", 4, 16, 6.25)
    log.finish(None)
    assert stdout.getvalue().splitlines()[0] == "resuming from ckpt/iter_0000002 iteration 2, consumed samples 8"
    records = run_log.read_metrics(metrics)
    train = [(r["iteration"], r["loss"]) for r in records if r["kind"] == "train"]
    assert train == [(1, 9.0), (2, 8.0), (3, 1.0), (4, 1.0)]  # the killed run's 3 and 4 are superseded
    assert [r["run"] for r in records if r["kind"] == "train"][2:] == [log.run_id] * 2
    assert len({r["run"] for r in records if r["kind"] == "train" and r["iteration"] <= 2}) == 1
    # the same command again on the finished run: nothing to train, the final losses computed again
    log = rank_0_run_log(monkeypatch, log_dir, steps=4, interval=1)
    log.start(4, "resuming from ckpt/iter_0000004 iteration 4, consumed samples 16")
    log.evaluation("validation", 4, 16, 6.5)
    log.evaluation("test", 4, 16, 6.25)
    log.metrics.close()
    records = run_log.read_metrics(metrics)
    assert [(r["kind"], r["iteration"]) for r in records if r["kind"] in ("validation", "test")] == [
        ("validation", 4), ("test", 4)] and records[-1]["run"] == log.run_id
    log = rank_0_run_log(monkeypatch, log_dir, steps=4, interval=1)
    log.start(0, "starting from scratch")
    log.metrics.close()
    assert [r["kind"] for r in run_log.read_metrics(metrics)] == ["start"]


def test_a_non_finite_loss_is_written_as_null_and_still_plots(tmp_path, monkeypatch):
    """A skipped step's NaN loss (--skip-nan-batches) or an fp16 overflow's inf: metrics.jsonl stays JSON a
    strict reader accepts (null, not a bare NaN), the screen line keeps "nan", the plot leaves a gap."""
    stdout = io.StringIO()
    monkeypatch.setattr(sys, "stdout", stdout)
    log = rank_0_run_log(monkeypatch, tmp_path / "log", steps=2, interval=1)
    engine = SimpleNamespace(fp16_enabled=lambda: False)
    for iteration, loss in ((1, float("nan")), (2, 9.0)):
        result = SimpleNamespace(loss=loss, mlm=loss, sop=0.5, grad_norm=float("inf"), mlm_accuracy=0.0,
                                 real_token_share=1.0, segments_per_sample=1.0,
                                 real_flops_per_sample=1e9)
        log.step(iteration, 4 * iteration, result, engine, seconds=0.5, lr=1e-3)
    log.evaluation("validation", 2, 0, float("nan"))
    log.finish(None)
    text = (tmp_path / "log" / "metrics.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text
    records = [json.loads(line, parse_constant=lambda name: pytest.fail(name)) for line in text.splitlines()]
    assert [(r["iteration"], r["loss"], r.get("grad_norm")) for r in records] == [(1, None, None), (2, 9.0, None),
                                                                            (2, None, None)]
    assert "loss nan" in stdout.getvalue().splitlines()[0]
    assert (tmp_path / "log" / "loss.png").read_bytes()[:8] == PNG_MAGIC


def test_a_run_that_logged_no_step_finishes_without_a_plot(tmp_path, monkeypatch):
    """Stopped before its first --log-interval (a SIGTERM), or a finished checkpoint given a new --log-dir
    (evaluation only): finish() says there is no curve, rather than failing the run with plot_run's error."""
    stdout = io.StringIO()
    monkeypatch.setattr(sys, "stdout", stdout)
    log = rank_0_run_log(monkeypatch, tmp_path / "log", steps=100, interval=50)
    log.start(0, "starting from scratch")
    log.evaluation("test", 2, 0, 9.5)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "latest").write_text("iter_0000002")
    log.finish(tmp_path / "ckpt")
    assert stdout.getvalue().splitlines()[-3:] == [f"logs: {tmp_path / 'log' / 'metrics.jsonl'}",
                                                   "loss plot: none (no training step was logged in this --log-dir)",
                                                   f"checkpoint: {tmp_path / 'ckpt'}"]
    assert not (tmp_path / "log" / "loss.png").exists()


def test_the_footer_names_no_checkpoint_when_nothing_was_saved(tmp_path, monkeypatch):
    """A run stopped before its first save (a signal during the start of extend_context's launch) ends
    with `nothing was saved`: its footer names no --save folder, which may not even exist."""
    stdout = io.StringIO()
    monkeypatch.setattr(sys, "stdout", stdout)
    log = rank_0_run_log(monkeypatch, tmp_path / "log", steps=100, interval=50)
    log.start(0, "starting from scratch")
    log.finish(tmp_path / "ck")
    assert stdout.getvalue().splitlines()[-1] == f"checkpoint: none (nothing was saved in {tmp_path / 'ck'})"


def test_each_start_record_names_the_save_folder_a_log_dir_points_to(tmp_path, monkeypatch):
    """The start record keeps --save as an absolute path, so a --log-dir given where the checkpoint
    belongs (--load, --init-from-hf, to-hf) is refused naming the folder to pass instead."""
    from megatron import checkpoint

    monkeypatch.chdir(tmp_path)
    log = rank_0_run_log(monkeypatch, tmp_path / "log", steps=2, interval=1, save="runs/ck")
    monkeypatch.setattr(log, "_print", lambda line: None)
    log.start(0, "starting from scratch", weights_from=None)
    starts = [json.loads(line) for line in (tmp_path / "log" / "metrics.jsonl").read_text().splitlines()]
    assert starts[0]["save"] == str(tmp_path / "runs" / "ck")
    with pytest.raises(ConfigError, match=f"pass the run's --save folder \\({tmp_path / 'runs' / 'ck'}\\) with --load"):
        checkpoint.refuse_log_dir(str(tmp_path / "log"))


def test_a_log_dir_that_is_its_runs_save_folder_before_a_checkpoint_is_not_named_as_the_fix(tmp_path, monkeypatch):
    """--log-dir equal to --save (accepted) before that run's first save: given to --load, the folder is
    refused as what it is, not with the fix to pass the run's --save folder, which is itself."""
    from megatron import checkpoint

    run = tmp_path / "run"
    log = rank_0_run_log(monkeypatch, run, steps=2, interval=1, save=str(run))
    monkeypatch.setattr(log, "_print", lambda line: None)
    log.start(0, "starting from scratch", weights_from=None)
    with pytest.raises(ConfigError, match="is the --log-dir and --save folder of a run of this trainer that has "
                                          "saved no checkpoint yet") as refused:
        checkpoint.refuse_log_dir(str(run), "--from")
    assert refused.value.fix == "pass it with --from once that run has saved one (at --save-interval and at its end)"


def test_the_loss_scale_is_read_as_every_fp16_optimizer_has_it(tmp_path, monkeypatch):
    """fp16 at ZeRO 0 runs DeepSpeed's FP16_Optimizer or FP16_UnfusedOptimizer (torch's Adam), which have
    no cur_scale as ZeRO's optimizers do: the first logged step of such a run stopped every rank with an
    AttributeError. All four have loss_scale."""
    from deepspeed.runtime.fp16.fused_optimizer import FP16_Optimizer
    from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    for kind in (FP16_Optimizer, FP16_UnfusedOptimizer, DeepSpeedZeroOptimizer, DeepSpeedZeroOptimizer_Stage3):
        assert isinstance(getattr(kind, "loss_scale", None), property), kind
    log = rank_0_run_log(monkeypatch, tmp_path / "log", steps=1, interval=1)
    monkeypatch.setattr(log, "_print", lambda line: None)
    engine = SimpleNamespace(fp16_enabled=lambda: True, optimizer=SimpleNamespace(loss_scale=256.0))
    result = SimpleNamespace(loss=9.0, mlm=8.25, sop=0.75, grad_norm=1.5, mlm_accuracy=0.125, real_token_share=1.0,
                             segments_per_sample=1.0,
                             real_flops_per_sample=1e9)
    log.step(1, 4, result, engine, seconds=0.5, lr=1e-3)
    records = run_log.read_metrics(tmp_path / "log" / "metrics.jsonl")
    assert [record["loss_scale"] for record in records if record["kind"] == "train"] == [256.0]


def logged_run(folder: Path, save, run_id: str | None = None) -> None:
    """A log dir holding one run's start record, as RunLog writes it (`run_id`: its checkpoints' run id)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "metrics.jsonl", "a") as metrics:
        metrics.write(json.dumps({"kind": "start", "run": "r", "iteration": 0, "time": 0.0, "save": save,
                                  **({"run_id": run_id} if run_id else {})}) + "\n")


def test_runs_without_log_dir_do_not_share_the_default_folder(tmp_path, monkeypatch):
    """Every run without --log-dir appended to runs/bert/metrics.jsonl and replaced its config.json and
    index_maps.json: another run (another --save, or any run when neither saves) gets the next free
    runs/bert-N, named in the `logs:` line; a resume of the same --save keeps its folder."""
    from megatron.paths import DEFAULT_LOG_DIR

    monkeypatch.chdir(tmp_path)
    assert run_log.free_log_dir(DEFAULT_LOG_DIR, "ck") == "runs/bert"  # nothing there yet
    logged_run(tmp_path / "runs" / "bert", str(tmp_path / "ck"))
    assert run_log.free_log_dir(DEFAULT_LOG_DIR, "ck") == "runs/bert"  # its resume
    other = run_log.free_log_dir(DEFAULT_LOG_DIR, "other")
    assert other == "runs/bert-2" and other.moved == "runs/bert holds another run's logs; --log-dir DIR picks the folder"
    assert run_log.free_log_dir(DEFAULT_LOG_DIR, None) == "runs/bert-2"
    assert run_log.free_log_dir("runs/bert", "other") == "runs/bert"  # typed: as given
    logged_run(tmp_path / "runs" / "bert-2", str(tmp_path / "other"))
    assert run_log.free_log_dir(DEFAULT_LOG_DIR, "other") == "runs/bert-2"
    assert run_log.free_log_dir(DEFAULT_LOG_DIR, "third") == "runs/bert-3"
    (tmp_path / "runs" / "bert-3").mkdir()  # made by a run that failed before its first record
    assert run_log.free_log_dir(DEFAULT_LOG_DIR, "third") == "runs/bert-3"


def test_the_trainer_picks_its_log_dir_before_it_starts(tmp_path, monkeypatch):
    import megatron.training as training

    monkeypatch.chdir(tmp_path)
    logged_run(tmp_path / "runs" / "bert", None)
    chosen = []
    monkeypatch.setattr(training, "pretrain", lambda args, *rest: chosen.append(args.log_dir) or 0)
    assert training.main(["--train-iters", "1"]) == 0
    assert chosen == ["runs/bert-2"] and "another run's logs" in chosen[0].moved
    # a resume of that run's checkpoints without --save (it saves nothing): its logs go on in its folder
    logged_run(tmp_path / "runs" / "bert-2", str(tmp_path / "ck"))
    (tmp_path / "ck").mkdir()
    for argv, folder in ((["--load", "ck"], "runs/bert-2"), (["--load", "ck", "--finetune"], "runs/bert-3")):
        assert training.main(["--train-iters", "1", *argv]) == 0 and str(chosen[-1]) == folder, argv


def test_a_metrics_file_of_no_run_is_refused_at_start_up(tmp_path):
    """A --log-dir holding a metrics.jsonl this trainer did not write was found at the plot, after the run had
    trained and saved, and every requeue failed the same way: start-up names it, before any step. A torn last
    line (a killed run's) and a folder without the file are no problem."""
    assert run_log.metrics_problem(str(tmp_path)) is None
    (tmp_path / "metrics.jsonl").write_text("not json\n")
    problem, fix = run_log.metrics_problem(str(tmp_path))
    assert problem == (f"--log-dir {tmp_path} holds a metrics.jsonl that is not a run log of this trainer "
                       f"({tmp_path / 'metrics.jsonl'} line 1 is not a run-log record (a JSON object with a kind))")
    assert fix == f"pass another --log-dir, or move {tmp_path / 'metrics.jsonl'} away"
    logged_run(tmp_path / "torn", "ck")
    with open(tmp_path / "torn" / "metrics.jsonl", "a") as metrics:
        metrics.write('{"kind": "tr')
    assert run_log.metrics_problem(str(tmp_path / "torn")) is None


def test_a_plot_that_fails_is_a_warning_not_a_failed_run(tmp_path, monkeypatch, capsys):
    """The run trained and saved: a metrics.jsonl changed under it (or a full disk at loss.png) leaves no plot
    and one warning, never exit 2 (a requeue would then fail the same way forever)."""
    log = rank_0_run_log(monkeypatch, tmp_path / "log", steps=1, interval=1)
    log.close()
    (tmp_path / "log" / "metrics.jsonl").write_text("not json\n")
    log.plot(None)
    out, err = capsys.readouterr()
    assert out.splitlines()[-1] == "loss plot: none (see the warning above)"
    assert err.splitlines() == [f"warning: no loss plot: {tmp_path / 'log' / 'metrics.jsonl'} line 1 is not a run-log "
                                f"record (a JSON object with a kind); once that is fixed, "
                                f"{run_log.paths.in_repository('tools/plot_run.py')} {tmp_path / 'log'} draws it"]


def test_a_log_dir_given_that_holds_another_runs_logs_is_warned_of(tmp_path):
    """An explicit --log-dir of another run: its metrics.jsonl was appended to, its config.json, index_maps.json and
    loss.png replaced, without a word (the default folder moves aside: free_log_dir). A resume of a run logged
    there (its --save, or its --load going on into another --save) is that run's own log; --finetune is a new run."""
    folder = tmp_path / "logs"
    assert run_log.shared_log_dir_warning(str(folder), "ck", None, False) is None  # nothing there
    logged_run(folder, str(tmp_path / "ck"))
    line = run_log.shared_log_dir_warning(str(folder), str(tmp_path / "other"), None, False)
    assert line == (f"warning: --log-dir {folder} holds the logs of another run (--save {tmp_path / 'ck'}): this run "
                    "appends its records to that metrics.jsonl and replaces its config.json, index_maps.json and "
                    "loss.png; pass another --log-dir to keep both")
    assert "(--save " in run_log.shared_log_dir_warning(str(folder), None, None, False)
    assert run_log.shared_log_dir_warning(str(folder), str(tmp_path / "ck"), str(tmp_path / "ck"), False) is None
    assert run_log.shared_log_dir_warning(str(folder), str(tmp_path / "b"), str(tmp_path / "ck"), False) is None
    assert run_log.shared_log_dir_warning(str(folder), str(tmp_path / "b"), str(tmp_path / "ck"), True) is not None
    logged_run(tmp_path / "nosave", None)
    assert "(one without --save)" in run_log.shared_log_dir_warning(str(tmp_path / "nosave"), None, None, False)


def test_a_moved_run_folder_resumes_into_its_own_logs(tmp_path, monkeypatch):
    """A run folder moved or copied (ck/ and log/ into new/) and resumed there: its start records keep the --save
    path of their day, and the run was warned of as another run's (and its default log folder passed over). The
    run id its checkpoints carry (checkpoint.RUN_ID) is in the start records: the same run, wherever it is now;
    another run's checkpoint (another id, or none) is still warned of."""
    from test_fault_tolerance import fake_checkpoints
    from megatron.paths import DEFAULT_LOG_DIR

    logged_run(tmp_path / "new" / "log", str(tmp_path / "old" / "ck"), run_id="abc")
    fake_checkpoints(tmp_path / "new" / "ck", 3, latest=3, run_id="abc")
    ck = str(tmp_path / "new" / "ck")
    assert run_log.shared_log_dir_warning(str(tmp_path / "new" / "log"), ck, ck, False) is None
    assert run_log.shared_log_dir_warning(str(tmp_path / "new" / "log"), None, ck, False) is None  # --load alone
    assert run_log.shared_log_dir_warning(str(tmp_path / "new" / "log"), str(tmp_path / "b"), ck, True) is not None
    for other in ("xyz", None):
        fake_checkpoints(tmp_path / str(other), 3, latest=3, run_id=other)
        line = run_log.shared_log_dir_warning(str(tmp_path / "new" / "log"), str(tmp_path / str(other)),
                                              str(tmp_path / str(other)), False)
        assert line.startswith(f"warning: --log-dir {tmp_path / 'new' / 'log'} holds the logs of another run "
                               f"(--save {tmp_path / 'old' / 'ck'})"), line
    monkeypatch.chdir(tmp_path / "new")  # the default log folder moved with the run
    logged_run(tmp_path / "new" / "runs" / "bert", str(tmp_path / "old" / "ck"), run_id="abc")
    assert run_log.free_log_dir(DEFAULT_LOG_DIR, "ck") == "runs/bert"
    assert run_log.free_log_dir(DEFAULT_LOG_DIR, str(tmp_path / "xyz")) == "runs/bert-2"


def test_a_resume_into_other_log_folders_says_its_logs_are_split(tmp_path, monkeypatch):
    """A run resumed with another --log-dir (or --tensorboard-dir) than its checkpoint's run logged into went on
    writing metrics.jsonl, config.json and TensorBoard events into the new folders without a word, the curve cut
    in two. It goes on (a requeue may log per job, as Megatron and DeepSpeed allow), with one line naming both
    folders and the flags that continue one log; the checkpoint records its run's folders (checkpoint.LOGS)."""
    for folder in ("log", "tb"):
        (tmp_path / folder).mkdir()
    monkeypatch.chdir(tmp_path)
    first = run_log.logs_record(SimpleNamespace(log_dir="log", tensorboard_dir="tb"))
    assert first == {"log_dir": str(tmp_path / "log"), "tensorboard_dir": str(tmp_path / "tb")}
    same = run_log.logs_record(SimpleNamespace(log_dir=str(tmp_path / "log"), tensorboard_dir="./tb"))
    assert run_log.split_logs_warning(first, same) is None
    assert run_log.split_logs_warning(None, same) is None  # a checkpoint saved before the record
    moved = run_log.logs_record(SimpleNamespace(log_dir="job2/log", tensorboard_dir="tb"))
    assert run_log.split_logs_warning(first, moved) == (
        f"warning: this resume logs into --log-dir {tmp_path / 'job2' / 'log'}, the checkpoint's run logged into "
        f"{tmp_path / 'log'}: the run's metrics.jsonl and config.json are split between the folders; pass "
        f"--log-dir {tmp_path / 'log'} to continue them in one")
    both = run_log.split_logs_warning(first, run_log.logs_record(SimpleNamespace(log_dir="l2", tensorboard_dir="t2")))
    assert "metrics.jsonl and config.json and its TensorBoard curves are split" in both, both
    assert both.endswith(f"pass --log-dir {tmp_path / 'log'} --tensorboard-dir {tmp_path / 'tb'} to continue them "
                         "in one"), both
    no_board = run_log.logs_record(SimpleNamespace(log_dir="log", tensorboard_dir=None))
    assert run_log.split_logs_warning(first, no_board) is None  # writes no TensorBoard events: nothing split
    (tmp_path / "log").rename(tmp_path / "gone")
    assert run_log.split_logs_warning(first, moved) is None  # the first folder removed, or moved with the run


def test_a_default_log_dir_a_live_run_holds_is_passed_over_also_when_taken_after_it_was_chosen(tmp_path, monkeypatch):
    """Two runs without --log-dir started together: the second met runs/bert holding only the first's lock (no
    records yet), took it for free and then failed on that lock (`--log-dir runs/bert is in use by a live run`),
    though the user gave no --log-dir. Now a folder a live run holds is taken, and a lock lost between the choice
    and the taking moves on to the next free runs/bert-N; a --log-dir the user typed is still refused."""
    from megatron import locks, training
    from megatron.parallel.launcher_watch import start_time
    from megatron.paths import DEFAULT_LOG_DIR

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(training.dist, "get_rank", lambda: 0)
    monkeypatch.setattr(training.dist, "broadcast_object_list", lambda found, src: None)  # one rank
    other = subprocess.Popen(["sleep", "60"])
    try:
        def lock_for_other(folder):
            folder.mkdir(parents=True)
            (folder / locks.LOG_LOCK).write_text(json.dumps({"host": socket.gethostname(), "pid": other.pid,
                                                             "start": start_time(other.pid)}))

        args = SimpleNamespace(log_dir=run_log.free_log_dir(DEFAULT_LOG_DIR, None), tensorboard_dir=None,
                               deepspeed_config=None, save=None, load=None, finetune=False)
        assert args.log_dir is DEFAULT_LOG_DIR  # free when chosen, then taken by the other run
        lock_for_other(tmp_path / "runs" / "bert")
        try:
            training.check_log_dirs(args, {})
            assert args.log_dir == "runs/bert-2" and args.log_dir.moved == (
                f"runs/bert is in use by a live run (pid {other.pid} on this host ({socket.gethostname()})); "
                "--log-dir DIR picks the folder")
        finally:
            locks.release_lock(locks.LOG_LOCK)
        assert run_log.free_log_dir(DEFAULT_LOG_DIR, None) == "runs/bert-2"
        args = SimpleNamespace(log_dir=run_log.free_log_dir(DEFAULT_LOG_DIR, None), tensorboard_dir=None,
                               deepspeed_config=None, save=None, load=None, finetune=False)
        lock_for_other(tmp_path / "runs" / "bert-2")  # the other run took it after this one chose it
        try:
            training.check_log_dirs(args, {})
            assert args.log_dir == "runs/bert-3" and (tmp_path / "runs" / "bert-3" / locks.LOG_LOCK).is_file()
        finally:
            locks.release_lock(locks.LOG_LOCK)
        args.log_dir = "runs/bert"  # typed
        with pytest.raises(ConfigError, match=rf"^--log-dir runs/bert is in use by a live run: pid {other.pid} "):
            training.check_log_dirs(args, {})
    finally:
        other.kill()
        other.wait()


def test_a_home_that_cannot_be_written_adds_no_matplotlib_noise(tmp_path, monkeypatch):
    """A read-only home (a cluster's, a container user without one): matplotlib logged two lines (`mkdir -p failed
    ...`, `Matplotlib created a temporary cache directory ...`) into every run's output at the plot; now the plot
    is drawn with a private config folder, silently, and that folder is gone at exit."""
    metrics = write_run_log(tmp_path / "log", io.StringIO(), monkeypatch)
    (tmp_path / "home" / ".config").mkdir(parents=True)
    (tmp_path / "home" / ".cache").write_text("a file")  # a home whose config folder works but not its cache's
    for home in ("/etc/passwd/home", str(tmp_path / "home")):
        env = {**os.environ, "HOME": home, "TMPDIR": str(tmp_path)}
        for variable in ("MPLCONFIGDIR", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"):
            env.pop(variable, None)
        result = subprocess.run([sys.executable, str(Path(plot_run.__file__)), str(metrics), "-o",
                                 str(tmp_path / "p.png")], env=env, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0 and result.stderr == "", result.stderr
        assert (tmp_path / "p.png").read_bytes()[:8] == PNG_MAGIC
        assert not list(tmp_path.glob("matplotlib-*"))


def test_a_full_disk_under_a_removed_log_dir_is_named_with_the_disk_it_is_on(tmp_path, monkeypatch):
    """The --log-dir removed, then its mkdir failing on a full disk: the free space was asked of the missing
    folder, a FileNotFoundError that ended rank 0 in a traceback instead of the run's stop."""
    log = rank_0_run_log(monkeypatch, tmp_path / "log", 4, 2)
    log._failed("the run log", tmp_path / "gone" / "deeper" / "metrics.jsonl",
                OSError(errno.ENOSPC, "No space left on device"), "pass another --log-dir")
    assert log.failure[0].startswith(f"cannot write the run log {tmp_path / 'gone' / 'deeper' / 'metrics.jsonl'} "
                                     "(the disk is full, ")


def test_tensorboards_writer_thread_leaves_its_failed_write_to_the_run(monkeypatch):
    """TensorBoard's writer thread raises a failed write (its folder removed) again in the thread that writes
    next, which the run stops on in one line: the thread's own traceback no longer comes first. Another
    thread's error, or a writer thread's that is no OSError, still goes to the hook before (which prints it)."""
    import threading

    class _AsyncWriterThread(threading.Thread):  # tensorboard's class, by name
        pass

    printed = []
    monkeypatch.setattr(threading, "excepthook", printed.append)
    run_log._quiet_writer_thread_errors()
    run_log._quiet_writer_thread_errors()  # once per process: the hook is not stacked
    cases = [(_AsyncWriterThread(), FileNotFoundError), (_AsyncWriterThread(), ValueError),
             (threading.Thread(), FileNotFoundError)]
    for thread, error in cases:
        threading.excepthook(threading.ExceptHookArgs((error, error(), None, thread)))
    assert [(args.thread, args.exc_type) for args in printed] == cases[1:]

"""Stop requests through the real entry point, on two ranks over gloo: SIGTERM to one rank during
evaluation stops both within one evaluation step, with the final checkpoint; SIGINT or SIGTERM to
the `deepspeed` command (which ends it alone, leaving its launch.py and the ranks running) stops
every rank after a checkpoint (SIGTERM: four ranks of hybrid sequence parallelism, test_hybrid's run
through the real launcher), also when it ends while the ranks are still starting; a run log that cannot be written on rank 0 stops every rank at the
next step; SIGTERM to one rank alone during start-up is told by that rank. (The rendezvous timeout and the --save lock are rows of test_bad_inputs.py.)"""
import contextlib
import errno
import io
import json
import multiprocessing
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from megatron import checkpoint, checkpoint_save, locks, run_log, stop_signals, training
from megatron.parallel import launcher_watch
from megatron.data.default_dataset import prepare_default_dataset
from megatron.parallel.spawn import free_port, run_on_ranks

from test_bad_inputs import PYTHON, ROOT, TINY
from test_fault_tolerance import logged_iterations


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> list:
    directory = tmp_path_factory.mktemp("data")
    dataset = prepare_default_dataset(directory, max_bytes=300_000, vocab_size=2000)
    return ["--data-path", str(dataset.data_prefix), "--vocab-file", str(dataset.vocab_file)]


NO_TEST_DOCUMENTS = "warning: --split 969,30,1 leaves no test documents"  # the small corpus's start-up warning


def run_argv(tmp_path, data, *extra) -> list:
    return [*TINY, *data, "--log-interval", "1", "--save", str(tmp_path / "ckpt"), "--log-dir", str(tmp_path / "log"),
            *extra]


def records(tmp_path, kind: str) -> list:
    return [r["iteration"] for r in run_log.read_metrics(tmp_path / "log" / "metrics.jsonl") if r["kind"] == kind]


def main_signalled_in_evaluation(argv, signalled_rank: int) -> tuple:
    """`main`, with SIGTERM sent to rank `signalled_rank` inside its first evaluation step, and rank
    0's loss plot made slow and hit by a second SIGINT and SIGTERM; returns (exit code, evaluation steps
    this rank ran, stderr, when its run log was closed, when main returned, {"lock": the --save lock
    held, "said": stderr so far} when rank 0's plot began) (times: the machine's monotonic clock)."""
    steps, closed, at_plot = [], [], {}
    evaluate_step, plot = training.eval_step, run_log.RunLog.plot
    err = io.StringIO()

    def slow_plot(log, save_dir):
        if dist.get_rank() == 0:
            at_plot.update(lock=dict(locks._held_locks.get(locks.LOCK, {})), said=err.getvalue())
            for second in (signal.SIGINT, signal.SIGTERM):  # a second Ctrl-C, the launcher's SIGTERM
                os.kill(os.getpid(), second)
            time.sleep(1.0)
        plot(log, save_dir)
        closed.append(time.monotonic())
    run_log.RunLog.plot = slow_plot

    def eval_step(engine, micro_batches):
        steps.append(1)
        if len(steps) == 1 and dist.get_rank() == signalled_rank:
            os.kill(os.getpid(), signal.SIGTERM)
        return evaluate_step(engine, micro_batches)

    training.eval_step = eval_step
    with contextlib.redirect_stderr(err):
        code = training.main(argv)
    return code, len(steps), err.getvalue(), closed[0], time.monotonic(), at_plot


def test_sigterm_in_evaluation_stops_every_rank_within_one_step(tmp_path, data):
    """Validation of 50 steps at iteration 2; rank 1 gets SIGTERM in the first: both ranks run that
    one step only, log no validation loss, save iteration 2 and exit 128 + 15. No rank returns
    before rank 0 has closed its log and printed the line: the deepspeed launcher kills every rank
    once one exits non-zero, and 143 is non-zero. Rank 0 says at once that it stops and saves; its
    stop line comes before the plot, the --save lock is free by then, and signals during the plot
    are noted, not met by Python's default handlers (a traceback, or death with the lock left).
    The checkpoint records the validation cut short; the resume computes it before its first step, with the
    checkpoint's weights and the slice the validation at 2 reads, as the uninterrupted run does (it was never
    computed again: the resume logged validations at 4, 6, ... only)."""
    argv = run_argv(tmp_path, data, "--train-iters", "3", "--eval-interval", "2", "--eval-iters", "50")
    outcomes = run_on_ranks(main_signalled_in_evaluation, 2, argv, 1, timeout=240)
    assert [(code, steps) for code, steps, *_ in outcomes] == [(143, 1), (143, 1)], outcomes[0][2][-3000:]
    assert outcomes[1][4] > outcomes[0][3]
    folder = tmp_path / 'ckpt' / 'iter_0000002'
    said = [f"pretrain_bert.py: stopping after iteration 2 (SIGTERM): saving checkpoint {folder} (the first save of "
            "this run); further signals are ignored until it is written",
            f"pretrain_bert.py: stopped by SIGTERM after iteration 2, before its validation loss; checkpoint {folder} "
            f"holds it: resume with --load {tmp_path / 'ckpt'}, which computes that validation loss first"]
    # the small corpus leaves no test documents, and 50 evaluation steps read its validation split 8 times over
    no_test, warning, *lines = outcomes[0][2].splitlines()
    assert no_test.startswith("warning: --split 969,30,1 leaves no test documents")
    assert warning.startswith("warning: each evaluation reads 200 samples") and lines == said
    assert outcomes[0][5] == {"lock": {}, "said": outcomes[0][2]}
    assert checkpoint.latest_tag(str(tmp_path / "ckpt")) == checkpoint.tag_for(2)
    assert records(tmp_path, "train") == [1, 2] and records(tmp_path, "validation") == []
    assert checkpoint.run_state(str(tmp_path / "ckpt"), checkpoint.tag_for(2))[checkpoint.VALIDATION_CUT] is True
    outcomes = run_on_ranks(main_to_stderr, 2, [*argv, "--load", str(tmp_path / "ckpt")], timeout=240)
    assert [code for code, _ in outcomes] == [0, 0], outcomes[0][1][-3000:]
    logged = [(r["kind"], r["iteration"]) for r in run_log.read_metrics(tmp_path / "log" / "metrics.jsonl")]
    assert logged[-4:] == [("start", 2), ("validation", 2), ("train", 3), ("validation", 3)], logged


def main_whose_launcher_ends_on_rank_1(argv, after: int) -> tuple:
    """`main`, where rank 1 alone sees its launcher end after its step `after` (0: before the first);
    returns (exit code, stderr)."""
    watching, steps, train_step = [], [], training.train_step

    def watch(on_gone):
        watching.append(on_gone)
        if after == 0 and dist.get_rank() == 1:
            on_gone("the deepspeed command (pid 4242)")
        return threading.Event()

    def step(engine, micro_batches):
        steps.append(train_step(engine, micro_batches))
        if len(steps) == after and dist.get_rank() == 1:
            watching[0]("the deepspeed command (pid 4242)")
        return steps[-1]
    launcher_watch.watch, training.train_step = watch, step
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = training.main(argv)
    return code, err.getvalue()


@pytest.mark.parametrize("after", [0, 2])
def test_the_stop_line_names_the_launchers_end_seen_by_another_rank(tmp_path, data, after):
    """Rank 0 prints the stop line; what stopped the run may have been seen by another rank only. A
    stop before the first step with --save says that nothing was saved (not: pass --save)."""
    argv = run_argv(tmp_path, data, "--train-iters", "6", "--eval-interval", "1000", "--eval-iters", "1")
    outcomes = run_on_ranks(main_whose_launcher_ends_on_rank_1, 2, argv, after, timeout=240)
    assert [code for code, _ in outcomes] == [143, 143], outcomes[0][1][-3000:]
    said = "pretrain_bert.py: stopped by the end of the deepspeed command (pid 4242) "
    said += (f"after iteration 2; checkpoint {tmp_path / 'ckpt' / 'iter_0000002'} holds it" if after
             else "before the first step of this run (iteration 0); nothing was saved")
    assert said in outcomes[0][1], outcomes[0][1][-3000:]


def main_whose_plot_fails_at_a_stop(argv) -> tuple:
    """`main` stopped after its second step, rank 0's loss plot failing (a full disk)."""
    def plot(log, save_dir):
        if dist.get_rank() == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(log.dir / "loss.png"))
    run_log.RunLog.plot = plot
    return main_whose_launcher_ends_on_rank_1(argv, 2)


def test_a_stop_whose_log_fails_to_close_ends_every_rank_alike(tmp_path, data):
    """Rank 0 cannot draw its plot at a stop: the stop line (printed before the plot) and the error
    line, every rank leaving with exit 2, none with 143 before the line is printed (the launcher
    would end rank 0 and the line with it)."""
    argv = run_argv(tmp_path, data, "--train-iters", "6", "--eval-interval", "1000", "--eval-iters", "1")
    outcomes = run_on_ranks(main_whose_plot_fails_at_a_stop, 2, argv, timeout=240)
    assert [code for code, _ in outcomes] == [2, 2], outcomes[0][1][-3000:]
    lines = [line for _, err in outcomes for line in err.splitlines() if not line.startswith(NO_TEST_DOCUMENTS)]
    assert lines[1:] == [f"pretrain_bert.py: stopped by the end of the deepspeed command (pid 4242) after iteration 2; "
                         f"checkpoint {tmp_path / 'ckpt' / 'iter_0000002'} holds it: resume with --load {tmp_path / 'ckpt'}",
                         f"pretrain_bert.py: error: cannot use {tmp_path / 'log' / 'loss.png'} (No space left on "
                         "device); check the path, its permissions and free space (--debug shows where)"], lines
    assert lines[0].startswith("pretrain_bert.py: stopping after iteration 2 (the end of the deepspeed command")


class FullDisk(io.StringIO):
    """metrics.jsonl on a disk that fills after `room` characters: writes beyond fail with ENOSPC."""

    def __init__(self, room: int):
        super().__init__()
        self.room = room

    def write(self, text: str) -> int:
        if self.tell() + len(text) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(text)


def main_with_full_log_disk(argv, room: int) -> tuple:
    """`main` with rank 0's metrics.jsonl on a disk with `room` characters free; returns (exit code, stderr)."""
    real_open = open
    run_log.open = lambda path, *args, **kwargs: FullDisk(room) if str(path).endswith("metrics.jsonl") else real_open(
        path, *args, **kwargs)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = training.main(argv)
    return code, err.getvalue()


def test_full_log_disk_on_rank_0_stops_every_rank_at_the_next_step(tmp_path, data):
    """Only rank 0 writes the log: its failed write stops both ranks at the next step boundary, with
    a checkpoint of the last step, and one line naming the log and the checkpoint (the write layer
    is replaced here: test_save_faults.py fills a real disk, on one rank)."""
    argv = run_argv(tmp_path, data, "--train-iters", "50", "--eval-interval", "1000", "--eval-iters", "1")
    outcomes = run_on_ranks(main_with_full_log_disk, 2, argv, 2000, timeout=240)
    assert [code for code, _ in outcomes] == [2, 2], outcomes[0][1][-3000:]
    latest = checkpoint.latest_tag(str(tmp_path / "ckpt"))
    errors = [line for _, err in outcomes for line in err.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0].startswith(
        f"pretrain_bert.py: error: cannot write the run log {tmp_path / 'log' / 'metrics.jsonl'} (the disk is full"), errors
    assert errors[0].endswith(f"checkpoint {tmp_path / 'ckpt' / latest} holds iteration {int(latest[5:])}: resume with "
                              f"--load {tmp_path / 'ckpt'}")
    assert 0 < int(latest[5:]) < 50


def default_signals():
    """The launcher as a terminal starts it: an ignored SIGINT is inherited across exec (a test
    process that ignores it, like a shell's background job, would hand that on), and a Python
    whose SIGINT is ignored at start never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


# the SIGTERM run is also hybrid sequence parallelism's run through the real launcher: 4 ranks with
# ds_configs/hybrid_sp4.json (Ulysses 2 x ring 2), 126 tokens per sample (padded to 128 for SP = 4)
HYBRID_SP4 = ["--deepspeed", "--deepspeed_config", str(ROOT / "ds_configs" / "hybrid_sp4.json"), "--seq-length", "126",
              "--max-position-embeddings", "128", "--micro-batch-size", "4"]


@pytest.mark.parametrize("signum, ranks, layout", [(signal.SIGINT, 2, []), (signal.SIGTERM, 4, HYBRID_SP4)],
                         ids=["SIGINT", "SIGTERM-hybrid_sp4"])
def test_signal_to_the_deepspeed_command_stops_every_rank_after_a_checkpoint(tmp_path, data, signum, ranks, layout):
    """`deepspeed --num_gpus N` (CPU ranks): the signal goes to the `deepspeed` command alone, which
    exits without passing it on; its launch.py and every rank must still end, after saving. The
    hybrid run must train with the layout it resolved (2 x 2, printed and in config.json)."""
    stdout = tmp_path / "output.txt"
    env = {name: value for name, value in os.environ.items()
           if name not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    command = [str(Path(PYTHON).parent / "deepspeed"), "--num_gpus", str(ranks), "--master_port", str(free_port()),
               str(ROOT / "pretrain_bert.py"), *run_argv(tmp_path, data, "--train-iters", "100000",
                                                         "--eval-interval", "100000", "--eval-iters", "1", *layout)]
    with open(stdout, "w") as output:
        launcher = subprocess.Popen(command, cwd=ROOT, env={**env, "CUDA_VISIBLE_DEVICES": ""}, stdout=output,
                                    stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=default_signals)
    try:
        deadline = time.monotonic() + 180
        while logged_iterations(tmp_path / "log" / "metrics.jsonl") < 2:
            assert launcher.poll() is None and time.monotonic() < deadline, stdout.read_text()[-3000:]
            time.sleep(0.2)
        launcher.send_signal(signum)
        launcher.wait(timeout=120)  # the deepspeed command ends at once (later on a loaded machine)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # every process it started (launch.py, the ranks) ends
            try:
                os.killpg(launcher.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"ranks still running 90 s after {signum.name} to the deepspeed command: "
                        f"{stdout.read_text()[-3000:]}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.pid, signal.SIGKILL)
    latest = checkpoint.latest_tag(str(tmp_path / "ckpt"))
    assert 2 <= int(latest[5:]) < 100000
    output = stdout.read_text()
    assert (f"pretrain_bert.py: stopped by the end of the deepspeed command (pid {launcher.pid}) after iteration "
            f"{int(latest[5:])}; checkpoint {tmp_path / 'ckpt' / latest} holds it") in output, (
        [line for line in output.splitlines() if "pretrain_bert.py:" in line or "rror" in line] or output[-3000:])
    assert records(tmp_path, "train")[-1] == int(latest[5:])
    if layout:
        assert any(line.startswith("config: ") and "hybrid (Ulysses 2 x ring 2) attention" in line
                   for line in output.splitlines()), output[-3000:]
        config = json.loads((tmp_path / "log" / "config.json").read_text())  # the resolved config, as the run used it
        assert (config["sequence_parallel_size"], config["model"]["attention"], config["model"]["ulysses_size"],
                config["model"]["seq_length"]) == (4, "hybrid", 2, 126)
        losses = [r["loss"] for r in run_log.read_metrics(tmp_path / "log" / "metrics.jsonl") if r["kind"] == "train"]
        assert all(loss == loss and loss > 0 for loss in losses)


@pytest.mark.parametrize("command, launcher", [
    ("/venv/bin/python3.11 /venv/bin/deepspeed --num_gpus 2 pretrain_bert.py", True),
    ("/venv/bin/python3.11 -u -m deepspeed.launcher.launch --world_info=e30= pretrain_bert.py", True),
    # the two as extend_context.py runs them (megatron/parallel/deepspeed_command.py)
    ("/venv/bin/python3.11 -P -m megatron.parallel.deepspeed_command --num_gpus 2 pretrain_bert.py", True),
    ("/venv/bin/python3.11 -u -P -m megatron.parallel.deepspeed_command deepspeed.launcher.launch --world_info=e30= "
     "pretrain_bert.py", True),
    ("/venv/bin/python /venv/bin/torchrun --nproc_per_node 2 pretrain_bert.py", True),
    ("python -m torch.distributed.run --nproc_per_node 2 pretrain_bert.py", True),
    ("bash examples_deepspeed/bert_distributed.sh 2 1 2 128", False),  # a path naming deepspeed is no launcher
    ("/bin/bash", False),
    ("", False),
])
def test_only_launchers_are_watched(command, launcher):
    from megatron.parallel.launcher_watch import _is_deepspeed_launch, _is_launcher
    assert _is_launcher(command) is launcher
    assert _is_deepspeed_launch(command) is ("deepspeed.launcher.launch" in command)  # the parent a rank knows


def test_a_launcher_ended_but_not_reaped_is_gone(monkeypatch):
    """A launcher killed under a wrapper that never waits stays a zombie, its /proc entry and start
    time unchanged: the rank stops all the same (it once trained on for 11 minutes)."""
    launcher = subprocess.Popen(["sleep", "60"])
    try:
        monkeypatch.setattr(launcher_watch, "_noted", [(launcher.pid, launcher_watch.start_time(launcher.pid),
                                                        "its launcher")])
        launcher.kill()
        os.waitid(os.P_PID, launcher.pid, os.WEXITED | os.WNOWAIT)  # ended, left unreaped
        ended = []
        stop = launcher_watch.watch(ended.append)
        deadline = time.monotonic() + 3 * launcher_watch.POLL_SECONDS
        while not ended and time.monotonic() < deadline:
            time.sleep(0.02)
        stop.set()
        assert ended == ["its launcher"]
    finally:
        launcher.wait()


RANK_SCRIPT = """import os, sys, time
sys.path.insert(0, {root!r})
from megatron.parallel import launcher_watch
launcher_watch.note_launchers()
print("noted", launcher_watch.under_deepspeed_launch(), flush=True)
while not os.path.exists({go!r}):  # imports, data, engine: the watch starts late
    time.sleep(0.05)
ended = []
launcher_watch.watch(ended.append)
time.sleep(1)
print(ended, flush=True)
"""


def test_a_deepspeed_command_that_ends_before_the_watch_starts_is_noticed(tmp_path):
    """The `deepspeed` command ends while the rank is still starting (its launch.py, re-parented to
    init, no longer leads to it): the rank noted it at its start and stops at once when it watches.
    A stand-in chain with the real command lines' shapes (a program named deepspeed, then
    `python -m deepspeed.launcher.launch`), no DeepSpeed or torch: seconds. The rank knows that its
    parent is DeepSpeed's launch.py (which kills it 30 s after a signal: the stop's acknowledgement)."""
    launch = tmp_path / "fake" / "deepspeed" / "launcher"
    launch.mkdir(parents=True)
    for package in (launch.parent, launch):
        (package / "__init__.py").write_text("")
    (launch / "launch.py").write_text("import subprocess, sys\nsys.exit(subprocess.call([sys.executable, sys.argv[1]]))\n")
    (tmp_path / "rank.py").write_text(RANK_SCRIPT.format(root=str(ROOT), go=str(tmp_path / "go")))
    (tmp_path / "deepspeed").write_text(
        "import subprocess, sys\nsys.exit(subprocess.call([sys.executable, '-m', 'deepspeed.launcher.launch', "
        f"{str(tmp_path / 'rank.py')!r}]))\n")
    output = tmp_path / "rank.out"
    with open(output, "w") as out:
        command = subprocess.Popen([PYTHON, str(tmp_path / "deepspeed")], stdout=out, start_new_session=True,
                                   env={**os.environ, "PYTHONPATH": str(tmp_path / "fake")})
    try:
        deadline = time.monotonic() + 60
        while "noted" not in output.read_text():
            assert command.poll() is None and time.monotonic() < deadline, output.read_text()
            time.sleep(0.05)
        command.kill()  # the deepspeed command ends alone
        command.wait()
        (tmp_path / "go").touch()
        deadline = time.monotonic() + 60
        while len(output.read_text().splitlines()) < 2:
            assert time.monotonic() < deadline, output.read_text()
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(command.pid, signal.SIGKILL)
    assert output.read_text().splitlines() == ["noted True", str([f"the deepspeed command (pid {command.pid})"])]


def main_signalled_writing_an_index_map(argv) -> tuple:
    """`main`, with SIGTERM sent to this rank once half of its first index map is written; returns (exit
    code, stderr, the --save lock held after main returned, whether SIGTERM's handler is the one from before)."""
    import numpy as np

    save = np.save

    def half_then_sigterm(file, array, **kwargs):
        save(file, array[:len(array) // 2], **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)

    np.save = half_then_sigterm
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = training.main(argv)
    return code, err.getvalue(), dict(locks._held_locks), signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_signal_during_start_up_stops_at_once_and_leaves_nothing(tmp_path, data):
    """SIGTERM (or Ctrl-C) before the first step, here while an index map is written: the clean-ups run
    (no partial map, the --save folder and its lock, made at start-up, gone again, no run log), one line,
    exit 128 + 15. Before, the process died at once and left all three (the launcher signals every rank)."""
    argv = run_argv(tmp_path, data, "--train-iters", "4", "--data-cache-path", str(tmp_path / "maps"))
    [(code, err, lock, restored)] = run_on_ranks(main_signalled_writing_an_index_map, 1, argv, timeout=240)
    assert code == 143 and err.splitlines()[-1] == ("pretrain_bert.py: stopped by SIGTERM during start-up, before the "
                                                    "first step; nothing was saved"), err[-3000:]
    assert "Traceback" not in err and lock == {} and restored
    assert [path.name for path in tmp_path.iterdir()] == ["maps"] and list((tmp_path / "maps").iterdir()) == []


def main_signalled_building_the_engine(argv, signalled_rank: int) -> tuple:
    """`main`, with SIGTERM to rank `signalled_rank` alone as it starts building the engine; returns
    (exit code, stderr)."""
    build_engine = training.build_engine

    def build(*args, **kwargs):
        if dist.get_rank() == signalled_rank:
            os.kill(os.getpid(), signal.SIGTERM)
        return build_engine(*args, **kwargs)

    training.build_engine = build
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = training.main(argv)
    return code, err.getvalue()


def test_a_signal_to_one_rank_in_start_up_is_told_by_that_rank(tmp_path, data):
    """SIGTERM to rank 1 alone while the engine is built (a user's kill, an OOM killer's): rank 1 is the
    only one that knows, and prints the start-up stop line itself (was: exit 143 without a word, rank 0
    blocked until its launcher killed it); rank 0, left in DeepSpeed's first collective, ends within a
    bound (at once here; at worst --distributed-timeout-minutes) without a second line."""
    argv = run_argv(tmp_path, data, "--train-iters", "4", "--distributed-timeout-minutes", "0.15")
    outcomes = run_on_ranks(main_signalled_building_the_engine, 2, argv, 1, timeout=240)
    assert [code for code, _ in outcomes] == [2, 143], outcomes
    lines = [line for _, err in outcomes for line in err.splitlines() if not line.startswith(NO_TEST_DOCUMENTS)]
    assert lines == ["pretrain_bert.py: stopped by SIGTERM during start-up, before the first step; "
                     "nothing was saved"], lines
    assert not (tmp_path / "ckpt").exists()


def test_each_caller_keeps_its_own_signal_handlers():
    """A tool run inside another (run_tool in run_tool), and main whose training loop ends in an
    error with StopSignals' handlers installed, each give back the handlers they found: the outer
    tool's SIGTERM clean-up survives, and an in-process caller's Ctrl-C is not swallowed."""
    from megatron import errors

    def inner():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends

    def outer():
        assert errors.run_tool("inner", inner) == 128 + signal.SIGTERM
        return 0 if signal.getsignal(signal.SIGTERM) is errors._raise_interrupted else 1

    def mine(signum, frame):
        pass

    before, int_before = signal.signal(signal.SIGTERM, mine), signal.getsignal(signal.SIGINT)  # SIG_IGN under nohup
    try:
        assert errors.run_tool("outer", outer) == 0
        assert signal.getsignal(signal.SIGTERM) is mine

        for error in (errors.ConfigError("the loop stopped", "fix it"), RuntimeError("a bug in the loop")):
            def failing_loop(args, start_up, progress):
                stop_signals.StopSignals("tokenizer.json", None, start_up).install()
                raise error

            with pytest.MonkeyPatch.context() as patch:
                for name in ("check_flags", "check_flag_combinations"):
                    patch.setattr(training, name, lambda args: None)
                patch.setattr(training, "pretrain", failing_loop)
                if isinstance(error, errors.ConfigError):
                    assert training.main(["--data-path", "x"]) == 2
                else:  # not ours to report: the traceback, the handlers given back all the same
                    with pytest.raises(RuntimeError):
                        training.main(["--data-path", "x"])
            assert signal.getsignal(signal.SIGTERM) is mine and signal.getsignal(signal.SIGINT) == int_before
    finally:
        signal.signal(signal.SIGTERM, before)


def main_signalled_in_its_final_save(argv) -> tuple:
    """`main`, with SIGTERM sent to this rank while it writes the run's last checkpoint, and SIGINT and
    SIGTERM during its plot; returns (exit code, stderr, the --save lock held when the plot began)."""
    save, plot, at_plot = checkpoint_save.save, run_log.RunLog.plot, []
    last = int(argv[argv.index("--train-iters") + 1])

    def signalled_save(engine, config, save_dir, iteration, *args, **kwargs):
        if iteration == last:
            os.kill(os.getpid(), signal.SIGTERM)
        return save(engine, config, save_dir, iteration, *args, **kwargs)

    def signalled_plot(log, save_dir):
        at_plot.append(dict(locks._held_locks.get(locks.LOCK, {})))
        for signum in (signal.SIGINT, signal.SIGTERM):
            os.kill(os.getpid(), signum)
        plot(log, save_dir)

    checkpoint_save.save, run_log.RunLog.plot = signalled_save, signalled_plot
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = training.main(argv)
    return code, err.getvalue(), at_plot


@pytest.mark.parametrize("split, interval, code, line", [
    ("949,50,0", "2", 0, "pretrain_bert.py: SIGTERM came after the last step; the run is complete: checkpoint {ckpt}/"
                         "iter_0000002 holds iteration 2"),
    ("90,5,5", "1000", 143, "pretrain_bert.py: stopped by SIGTERM after the last iteration 2, before the validation "
                            "and test losses; checkpoint {ckpt}/iter_0000002 holds it: rerun with --load {ckpt} to "
                            "compute the validation and test losses"),
], ids=["no_test_set", "test_set"])
def test_a_signal_after_the_last_step(tmp_path, data, split, interval, code, line):
    """SIGTERM during the final save. With nothing held out left to evaluate (no test set, the last step's
    validation logged) it cuts nothing: the run is complete, exit 0, one line (it used to be dropped without
    a word). Otherwise the final evaluations it cuts are a stop (128 + 15) whose line says that a rerun
    computes those losses. Signals during the plot (here a Ctrl-C and a SIGTERM) meet a noting handler, with
    the --save lock already released."""
    argv = run_argv(tmp_path, data, "--train-iters", "2", "--eval-interval", interval, "--eval-iters", "1",
                    "--split", split)
    [(got, err, at_plot)] = run_on_ranks(main_signalled_in_its_final_save, 1, argv, timeout=240)
    assert (got, err.splitlines(), at_plot) == (code, [line.format(ckpt=tmp_path / "ckpt")], [{}]), err[-3000:]
    assert checkpoint.latest_tag(str(tmp_path / "ckpt")) == checkpoint.tag_for(2)
    # ended (a rerun exits at once) only where the stop cut no held-out loss (else the rerun computes them)
    assert checkpoint.run_state(str(tmp_path / "ckpt"), "iter_0000002").get(checkpoint.RUN_ENDED) == (code == 0 or None)


def test_a_signal_in_the_last_steps_validation_cuts_it(tmp_path, data):
    """--eval-interval dividing --train-iters: SIGTERM during the validation after the last step cuts it, and
    the stop line names it with the test loss (was: `before the test loss`, as if the validation cut short
    had been logged)."""
    argv = run_argv(tmp_path, data, "--train-iters", "2", "--eval-interval", "2", "--eval-iters", "50", "--split",
                    "90,5,5")
    [(code, steps, err, *_)] = run_on_ranks(main_signalled_in_evaluation, 1, argv, 0, timeout=240)
    ckpt = tmp_path / "ckpt"
    assert (code, steps, err.splitlines()[-1]) == (143, 1, (
        f"pretrain_bert.py: stopped by SIGTERM after the last iteration 2, before the validation and test losses; "
        f"checkpoint {ckpt / 'iter_0000002'} holds it: rerun with --load {ckpt} to compute the validation and test "
        "losses")), err[-3000:]
    assert records(tmp_path, "validation") == []


def test_the_stop_acknowledgement_names_the_last_save_and_deepspeeds_grace():
    """Rank 0's line when the final save of a stop begins; DeepSpeed's launch.py, when the signal
    reached it too, kills the ranks 30 s after: named when the last save took longer than what is left."""
    said = ("pretrain_bert.py: stopping after iteration 12 (SIGINT): saving checkpoint ckpt/iter_0000012 (the last "
            "save took 12 s); further signals are ignored until it is written")
    acknowledgement = stop_signals.stop_acknowledgement
    assert acknowledgement("SIGINT", 12, "ckpt/iter_0000012", 12.4, None) == said
    assert acknowledgement("SIGINT", 12, "ckpt/iter_0000012", 12.4, 27.5) == said
    assert acknowledgement("SIGINT", 12, "ckpt/iter_0000012", 42.0, 27.5) == said.replace("12 s", "42 s") + (
        "; if the signal reached DeepSpeed's launch.py too (Ctrl-C in its terminal, a signal to the whole job), it "
        "kills the ranks in 28 s, before such a save ends: see docs/resuming.md")
    assert "(the first save of this run)" in acknowledgement("SIGTERM", 3, "c/iter_0000003", None, 1.0)


def test_a_signal_after_the_launchers_end_names_the_stop(monkeypatch):
    """SIGTERM to the whole job while rank 0 writes a save: the `deepspeed` command ends at once and the watch
    sees it before the rank's handler runs (its main thread inside torch.save). Until the ranks agree, the
    signal names the stop, and launch.py's grace counts from the launcher's end (was: `stopped by the end of
    the deepspeed command`, without the warning that launch.py kills the ranks); after, it changes nothing."""
    monkeypatch.setattr(launcher_watch, "under_deepspeed_launch", lambda: True)
    gone = "the deepspeed command (pid 4242)"
    stop = stop_signals.StopSignals("tokenizer.json")
    stop._launcher_ended(gone)
    stop._note(signal.SIGTERM, None)
    assert stop._name(stop.received, stop.launcher_gone) == "SIGTERM"
    assert launcher_watch.DEEPSPEED_KILL_S - 5 < stop._grace_left() <= launcher_watch.DEEPSPEED_KILL_S
    agreed = stop_signals.StopSignals("tokenizer.json")  # the command signalled alone: the ranks stopped on it
    agreed._launcher_ended(gone)
    agreed.agreed = signal.SIGTERM
    agreed._note(signal.SIGINT, None)
    assert (agreed._name(agreed.received, agreed.launcher_gone), agreed._grace_left()) == (f"the end of {gone}", None)


def test_sighup_stops_like_sigterm_unless_nohup_ignores_it():
    """A closed terminal or a dropped SSH session sends SIGHUP: a tool stops with its clean-up and one
    line (exit 129), the training loop notes it as a stop. Under nohup (SIGHUP ignored) both leave it
    ignored: such a run was asked to outlive its terminal."""
    from megatron import errors

    def hung_up():
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(5)  # the handler raises before this ends

    def mine(signum, frame):  # SIGHUP's default would end pytest
        pass

    before = {signum: signal.signal(signum, mine) for signum in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)}
    try:
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            assert errors.run_tool("tool", hung_up) == 128 + signal.SIGHUP
        assert err.getvalue() == ("tool: error: interrupted by SIGHUP, partial output removed; rerun the same command "
                                  "to start over\n")
        stop = stop_signals.StopSignals("tokenizer.json")
        stop.install()
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(0.1)
        stop.stop_watching()
        assert stop.received == signal.SIGHUP

        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nohup
        assert signal.SIGHUP not in errors.raise_on_signals()
        nohup = stop_signals.StopSignals("tokenizer.json")
        nohup.install()
        nohup.stop_watching()  # its launcher watch, a thread that would outlive the test
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        errors.restore_signals(before)


LOADER_LEFT_OPEN = """
import time
import torch
from megatron.errors import ignore_stop_signals_in_child, stop_signals_blocked_for_children

class Hanging(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, idx):
        if idx == 2:  # the second worker's first batch
            time.sleep(600)  # a read that hangs
        return torch.zeros(2)

with stop_signals_blocked_for_children():
    loader = iter(torch.utils.data.DataLoader(Hanging(), batch_size=2, num_workers=2,
                                              worker_init_fn=lambda worker: ignore_stop_signals_in_child()))
next(loader)
print(*[worker.pid for worker in loader._workers])
"""


def test_workers_left_running_do_not_hold_the_exit():
    """multiprocessing's exit hook terminate()s daemonic workers (SIGTERM, which they ignore) and then
    waits on them without a limit: a worker left stuck (here by a loader never closed) would hold the
    exit for ever. They are killed first, and torch's loader says nothing of it."""
    result = subprocess.run([PYTHON, "-c", LOADER_LEFT_OPEN], cwd=ROOT, capture_output=True, text=True, timeout=90)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    for pid in map(int, result.stdout.split()):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_workers_die_with_a_rank_killed_by_sigkill():
    """A rank killed by SIGKILL (the out-of-memory killer) runs no exit hook, and its workers ignore SIGTERM:
    the kernel's parent-death signal ends them (docs/data.md), rather than leaving them holding the rank's
    sockets and memory."""
    killed = subprocess.run([PYTHON, "-c", LOADER_LEFT_OPEN + "import os, signal, sys\nsys.stdout.flush()\n"
                             "os.kill(os.getpid(), signal.SIGKILL)\n"], cwd=ROOT, capture_output=True, text=True,
                            timeout=90)
    assert killed.returncode == -signal.SIGKILL
    pids = [int(pid) for pid in killed.stdout.split()]
    assert len(pids) == 2
    for _ in range(300):  # the kernel signals at once; a worker being reaped by init may take a moment
        alive = [pid for pid in pids if _running(pid)]
        if not alive:
            break
        time.sleep(0.1)
    assert alive == [], f"workers {alive} outlived their SIGKILLed parent"


def _running(pid: int) -> bool:
    """The process exists and is not a zombie waiting for its reaper."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_worker_whose_parent_ended_before_it_asked_to_die_with_it_ends(monkeypatch):
    """The kernel's parent-death signal acts only on a parent that ends after the worker asked for it: a
    worker whose parent ended before (its parent is then another process) ends itself, or it would
    ignore SIGTERM and wait on its parent's queue for ever."""
    from megatron import errors

    monkeypatch.setattr(errors, "_forking_parent", (os.getpid() + 1, True))  # not this worker's parent: it ended
    worker = multiprocessing.get_context("fork").Process(target=lambda: errors.ignore_stop_signals_in_child()
                                                         or time.sleep(600), daemon=True)
    worker.start()
    worker.join(timeout=60)
    if worker.is_alive():  # only when it failed
        worker.kill()
    assert worker.exitcode == 1


def _ready_then_sleep(ready):
    from megatron import errors

    errors.ignore_stop_signals_in_child()
    ready.set()
    time.sleep(600)


def test_a_worker_forked_by_another_thread_outlives_that_thread():
    """The kernel's parent-death signal follows the thread that forked: a worker started from a thread
    that then ends (a loader built in a thread) would be killed with it, so only a main thread's workers
    ask for it; the exit hook still ends the others."""
    from megatron import errors

    context, started = multiprocessing.get_context("fork"), {}
    ready = context.Event()

    def start():
        with errors.stop_signals_blocked_for_children():
            started["worker"] = context.Process(target=_ready_then_sleep, args=(ready,), daemon=True)
            started["worker"].start()
        assert ready.wait(60)  # it asked (or not) while this thread lived

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    worker = started["worker"]
    worker.join(timeout=2)  # killed at once, had it asked
    alive = worker.is_alive()
    worker.kill()
    worker.join()
    assert alive


def test_the_entry_point_survives_a_closed_stdout():
    """stdout's reader is gone (`| head`; a closed terminal fails with EIO alike): pretrain_bert.py stops
    writing there, not running; here --help exits 0 with nothing on stderr (it was a BrokenPipeError
    traceback; a closed terminal ended ranks at their next log line)."""
    help_ = subprocess.Popen([PYTHON, str(ROOT / "pretrain_bert.py"), "--help"], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    help_.stdout.close()
    _, err = help_.communicate(timeout=120)
    assert (help_.returncode, err) == (0, "")


SLOW_IMPORT = """import os, runpy, sys, time
sys.path.insert(0, {root!r})
sys.path.insert(0, os.path.dirname({script!r}))  # as `python SCRIPT` puts its folder first (tools/this_repo.py)


class SlowImport:  # an import of the entry point's start-up (torch, DeepSpeed: seconds), made longer still
    def find_spec(self, name, path=None, target=None):
        if name == {module!r}:
            open({marker!r}, "w").close()
            time.sleep({seconds})
        return None


sys.meta_path.insert(0, SlowImport())
sys.argv = [{script!r}]
runpy.run_path({script!r}, run_name="__main__")
"""


SLOW_IMPORTS = [  # (entry point, a module of its start-up's imports, the end of its stop line)
    ("pretrain_bert.py", "megatron.training", "before the first step; nothing was saved"),
    # its first import, before start_up_stops_in_one_line exists: Ctrl-C as the launcher spawns the ranks
    ("pretrain_bert.py", "megatron.parallel.launch_env", "before the first step; nothing was saved"),
    ("tools/preprocess_data.py", "megatron.data.preprocess", "before it read or wrote anything"),
    ("tools/convert_checkpoint.py", "megatron.hf_convert", "before it read or wrote anything"),
    ("tools/fill_mask.py", "megatron.checkpoint", "before it read or wrote anything"),
    ("tools/plot_run.py", "megatron.run_log", "before it read or wrote anything"),
    ("tools/extend_context.py", "megatron.hf_convert", "before it read or wrote anything"),
    ("benchmarks/train_step.py", "torch", "before it read or wrote anything"),  # the benchmarks' guard alike
]
# imports before the start-up's guard (milliseconds: a signal there is held until the guard, held_signals.py),
# made a few seconds long, not a minute
HELD_IMPORTS = {"megatron.parallel.launch_env"}


@pytest.mark.parametrize("script,module,after", SLOW_IMPORTS,
                         ids=[f"{Path(script).stem}-{module}" for script, module, _ in SLOW_IMPORTS])
def test_ctrl_c_during_the_imports_is_one_line(tmp_path, script, module, after):
    """Ctrl-C in the first seconds of an entry point, while it imports torch and DeepSpeed (here while it
    imports `module`): the start-up's one line and exit 130, not a KeyboardInterrupt traceback through
    the imports (the tools printed one: errors.start_up_stops_in_one_line is pretrain_bert.py's guard)."""
    marker, path = tmp_path / "importing", ROOT / script
    env = {name: value for name, value in os.environ.items() if name not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    child = subprocess.Popen([PYTHON, "-c", SLOW_IMPORT.format(root=str(ROOT), module=module, marker=str(marker),
                                                               script=str(path),
                                                               seconds=2 if module in HELD_IMPORTS else 60)],
                             cwd=ROOT, env={**env, "DS_ACCELERATOR": "cpu"}, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=default_signals)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert child.poll() is None and time.monotonic() < deadline, child.stderr.read()
            time.sleep(0.05)
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
    assert (child.returncode, err) == (130, f"{path.name}: stopped by SIGINT during start-up, {after}\n")


CTRL_C_AT_A_FILE = """import os, pathlib, runpy, signal, sys
sys.path.insert(0, {root!r})
sys.path.insert(0, os.path.dirname({script!r}))
is_file = pathlib.Path.is_file


def ctrl_c_when_read(path):  # Ctrl-C as the tool looks at its input, after its imports
    if path.name == {name!r}:
        os.kill(os.getpid(), signal.SIGINT)
    return is_file(path)


pathlib.Path.is_file = ctrl_c_when_read
sys.argv = [{script!r}, *{argv!r}]
runpy.run_path({script!r}, run_name="__main__")
"""

CTRL_C_TOOLS = [  # (tool, its arguments naming {json}, the DeepSpeed JSON it reads)
    ("tools/ds_config.py", ["show", "{json}"]),
    ("azureml/submit.py", ["--dry-run", "{tmp}/job.yml", "--ds-config", "{json}", "--data", "{tmp}"]),
]


@pytest.mark.parametrize("script,argv", CTRL_C_TOOLS, ids=[Path(script).stem for script, _ in CTRL_C_TOOLS])
def test_ctrl_c_in_a_tool_without_heavy_imports_is_one_line(tmp_path, script, argv):
    """ds_config.py and submit.py ran their own main wrappers without run_tool's signal handling:
    Ctrl-C was a KeyboardInterrupt traceback. Now run_tool's one line and exit 130."""
    json_path = tmp_path / "interrupted.json"
    json_path.write_text((ROOT / "ds_configs" / "ring_sp2.json").read_text())
    path = ROOT / script
    argv = [part.format(json=json_path, tmp=tmp_path) for part in argv]
    code = CTRL_C_AT_A_FILE.format(root=str(ROOT), script=str(path), name=json_path.name, argv=argv)
    result = subprocess.run([PYTHON, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                            preexec_fn=default_signals)
    assert (result.returncode, result.stderr) == (130, f"{path.name}: error: interrupted by SIGINT, partial output "
                                                       "removed; rerun the same command to start over\n")
    assert not (tmp_path / "job.yml").exists()


# The rank waits to be stopped or orphaned: sleeping on with launch.py gone would hold the output pipe.
KILLING_RANK = """import os, signal, time
launcher = os.getppid()
os.kill({target}, signal.{signal})
deadline = time.monotonic() + 60
while os.getppid() == launcher and time.monotonic() < deadline:
    time.sleep(0.05)
"""


@pytest.mark.parametrize("killed, signum", [("os.getppid()", signal.SIGKILL), ("os.getpid()", signal.SIGKILL),
                                            ("os.getppid()", signal.SIGTERM)],
                         ids=["launch.py", "the rank", "launch.py-SIGTERM"])
def test_a_launcher_or_rank_ended_by_a_signal_is_128_plus_it(tmp_path, killed, signum):
    """DeepSpeed's runner passes on a positive return code only: its launch.py killed by SIGKILL (the
    OOM killer) ended the `deepspeed` command with 0, short of --train-iters, and a rank so killed
    with launch.py's -9 as 247; launch.py given SIGTERM stops the ranks and exits 1, read as a failure.
    Under deepspeed_command.py (the launch scripts' launcher) all are 128 + the signal, as a shell says;
    the real runner and launch.py, a rank that signals one of them."""
    rank = tmp_path / "rank.py"
    rank.write_text(KILLING_RANK.format(target=killed, signal=signum.name))
    env = {name: value for name, value in os.environ.items()
           if name not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(CUDA_VISIBLE_DEVICES="", DS_ACCELERATOR="cpu", PYTHONPATH=str(ROOT))
    result = subprocess.run([PYTHON, "-P", "-m", "megatron.parallel.deepspeed_command", "--num_gpus", "1",
                             "--master_port", str(free_port()), str(rank)], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 128 + signum, result.stderr[-3000:]


def group_members(pgid: int) -> list:
    """Pids of the live (not zombie) processes of process group `pgid`."""
    members = []
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError, IndexError):
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            if entry.isdigit() and int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry))
    return members


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_whole_group_stops_a_run_with_data_workers(tmp_path, data, signum):
    """Ctrl-C in the rank's terminal (SIGINT to its process group) or a scheduler's SIGTERM to every
    process reaches the DataLoader workers of --num-workers 2 too: they go on serving batches until
    the rank has agreed the stop, which saves and exits 128 + the signal as without workers, and no
    worker outlives the rank."""
    from test_training import single_rank_env

    stdout = tmp_path / "output.txt"
    command = [PYTHON, str(ROOT / "pretrain_bert.py"),
               *run_argv(tmp_path, data, "--train-iters", "100000", "--eval-interval", "100000", "--eval-iters", "1",
                         "--num-workers", "2")]
    with open(stdout, "w") as output:
        rank = subprocess.Popen(command, cwd=ROOT, env=single_rank_env(), stdout=output, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=default_signals)
    try:
        deadline = time.monotonic() + 180
        while logged_iterations(tmp_path / "log" / "metrics.jsonl") < 2:
            assert rank.poll() is None and time.monotonic() < deadline, stdout.read_text()[-3000:]
            time.sleep(0.2)
        assert len(group_members(rank.pid)) >= 3  # the rank and its 2 workers
        os.killpg(rank.pid, signum)
        assert rank.wait(timeout=120) == 128 + signum, stdout.read_text()[-3000:]
        assert group_members(rank.pid) == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(rank.pid, signal.SIGKILL)
    latest = checkpoint.latest_tag(str(tmp_path / "ckpt"))
    assert f"pretrain_bert.py: stopped by {signum.name} after iteration {int(latest[5:])}" in stdout.read_text()
    assert records(tmp_path, "train")[-1] == int(latest[5:])


def test_launchs_kill_lines_after_a_stop_do_not_bury_the_ranks_line():
    """Ctrl-C to the main job: the rank's line (saved, how to resume) was followed by launch.py's `Killing
    subprocess N` lines and an [ERROR] line holding the rank's 60-argument command `exits with return code =
    130`; only a failed rank's [ERROR] line stays."""
    import logging

    from megatron.parallel.deepspeed_command import not_a_stops_kill_lines

    def record(level, message, function="sigkill_handler"):
        line = logging.LogRecord("DeepSpeed", level, "launch.py", 259, message, None, None, func=function)
        return not_a_stops_kill_lines(line)

    assert not record(logging.INFO, "Killing subprocess 3147")
    assert not record(logging.ERROR, "['python', '-u', 'pretrain_bert.py', '--local_rank=1'] exits with return code = 130")
    assert not record(logging.ERROR, "['python', '-u', 'pretrain_bert.py'] exits with return code = -15")
    assert not record(logging.INFO, "Main process received SIGINT, exiting")
    # a start-up refusal: the trainer's one line (or argparse's) was followed by this one, the last the user read
    assert not record(logging.ERROR, "['python', '-u', 'pretrain_bert.py'] exits with return code = 2")
    assert record(logging.ERROR, "['python', '-u', 'pretrain_bert.py'] exits with return code = 1")
    assert record(logging.ERROR, "['python', '-u', 'pretrain_bert.py'] exits with return code = -9")
    assert record(logging.INFO, "Killing subprocess 3147", function="main")


def main_to_stderr(argv) -> tuple:
    """`main`'s (exit code, stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = training.main(argv)
    return code, err.getvalue()


def test_a_time_limit_stops_every_rank_after_a_step_saved_and_a_rerun_goes_on(tmp_path, data):
    """--exit-duration-in-mins (Megatron's flag, a job's wall-time limit): every rank stops after the
    same step once a rank is past the limit, saves it and exits 0 with one line; the first step of a
    run is always taken, so a requeued job makes progress however short its limit (here 6 ms: the
    start-up alone is longer, the stop comes after iteration 1). The same command without the limit,
    with --load, trains the rest."""
    argv = run_argv(tmp_path, data, "--train-iters", "4", "--eval-interval", "1000", "--split", "949,50,0")
    outcomes = run_on_ranks(main_to_stderr, 2, [*argv, "--exit-duration-in-mins", "0.0001"], timeout=240)
    ckpt = tmp_path / "ckpt"
    assert [code for code, _ in outcomes] == [0, 0], outcomes[0][1][-3000:]
    assert outcomes[0][1].splitlines()[-1] == (
        f"pretrain_bert.py: stopped by the time limit (--exit-duration-in-mins 0.0001) after iteration 1; checkpoint "
        f"{ckpt / 'iter_0000001'} holds it: resume with --load {ckpt}")
    assert checkpoint.latest_tag(str(ckpt)) == checkpoint.tag_for(1) and records(tmp_path, "train") == [1]
    outcomes = run_on_ranks(main_to_stderr, 2, [*argv, "--load", str(ckpt)], timeout=240)
    assert [code for code, _ in outcomes] == [0, 0], outcomes[0][1][-3000:]
    assert records(tmp_path, "train") == [1, 2, 3, 4] and checkpoint.latest_tag(str(ckpt)) == checkpoint.tag_for(4)


def main_signalled_on_rank_1_in_its_first_step(argv) -> tuple:
    """`main`, with SIGTERM sent to rank 1 alone inside its first step; returns (exit code, stderr)."""
    steps, train_step = [], training.train_step

    def step(engine, micro_batches):
        steps.append(train_step(engine, micro_batches))
        if len(steps) == 1 and dist.get_rank() == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return steps[-1]
    training.train_step = step
    return main_to_stderr(argv)


def test_a_signal_at_the_step_the_time_limit_comes_names_the_stop(tmp_path, data):
    """Rank 1 is signalled in the step after which the (6 ms) limit stops the run: the signal, seen by
    one rank only, names the stop on every rank and gives its exit code (a scheduler's preemption is
    no planned end), not the limit's 0."""
    argv = run_argv(tmp_path, data, "--train-iters", "4", "--eval-interval", "1000", "--split", "949,50,0",
                    "--exit-duration-in-mins", "0.0001")
    outcomes = run_on_ranks(main_signalled_on_rank_1_in_its_first_step, 2, argv, timeout=240)
    assert [code for code, _ in outcomes] == [143, 143], outcomes[0][1][-3000:]
    assert outcomes[0][1].splitlines()[-1].startswith("pretrain_bert.py: stopped by SIGTERM after iteration 1;")


def test_a_rank_waiting_for_rank_0s_address_line_ends_at_the_launchers_sigterm():
    """A rank that leaves the unusable-address line to its node's first rank waits for it (outlive_rank_0), while
    the stop signals of pretrain_bert.py's first line are still held (held_signals.py): the launcher's SIGTERM,
    which ends every rank once one fails, must end it then, not PRINTER_WAIT seconds later."""
    env = {**os.environ, "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "no-such-host-xyz.invalid",
           "MASTER_PORT": "29500"}
    rank = subprocess.Popen([PYTHON, str(ROOT / "pretrain_bert.py")], env=env, stderr=subprocess.PIPE, text=True)
    time.sleep(3)  # into its wait (PRINTER_WAIT, 10 s)
    started = time.monotonic()
    rank.terminate()
    _, err = rank.communicate(timeout=30)
    assert (rank.returncode, err) == (-signal.SIGTERM, "")
    assert time.monotonic() - started < 3

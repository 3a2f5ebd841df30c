"""Faults through the real entry point: ranks SIGKILLed mid-step and mid-save resume to bitwise
the same losses and weights as an uninterrupted run (CPU, fp32); a save never leaves `latest`
naming an incomplete checkpoint; a rank that ends or freezes ends the others with one line
(--distributed-timeout-minutes); NaN/inf losses stop the run or are skipped; unreadable
checkpoints are one-line errors."""
import argparse
import contextlib
import io
import json
import os
import random
import re
import signal
import socket
import subprocess
import threading
import time
from datetime import timedelta
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.distributed as dist

from megatron import (checkpoint, checkpoint_compat, checkpoint_save, checkpoint_weights, locks, run_log, start_plan,
                      stop_signals, training)
from megatron.errors import ConfigError, DataError
from megatron.data import bert_dataset
from megatron.model.bert import BertConfig
from megatron.arguments import build_parser
from megatron.parallel import device, peers, same_settings
from megatron.parallel.spawn import RankFailure, free_port, run_on_ranks
from megatron.training import main
from bert_fixtures import with_fp16_kernels_allowed
from test_training import PYTHON, ROOT, TINY

ITERS = 8


def write_json(path, value) -> str:
    path.write_text(json.dumps(value))
    return str(path)


def run_argv(tmp_path, data_dir, ds_config: dict, *extra) -> list:
    """A tiny run with dropout on (its RNG must resume too), a checkpoint every 2 steps, a log
    record every step; all segments of one run share --save and --log-dir."""
    return [*TINY, "--hidden-dropout", "0.1", "--deepspeed", "--deepspeed_config",
            write_json(tmp_path / "ds.json", ds_config), "--train-iters", str(ITERS), "--save-interval", "2",
            "--log-interval", "1", "--eval-interval", "1000", "--eval-iters", "1", "--default-data-dir", data_dir,
            "--save", str(tmp_path / "ckpt"), "--log-dir", str(tmp_path / "log"), *extra]


def train_records(run_dir) -> dict:
    """iteration -> the train record the surviving run wrote last; records a killed run wrote
    for the same iteration must be equal to it (the resumed run repeats them exactly)."""
    records = {}
    for record in run_log.read_metrics(run_dir / "log" / "metrics.jsonl"):  # skips a record a kill tore
        if record["kind"] != "train":
            continue
        fields = (record["loss"], record["lr"], record["consumed_samples"])
        previous = records.get(record["iteration"])
        assert previous is None or previous == fields, (record["iteration"], previous, fields)
        records[record["iteration"]] = fields
    return records


def assert_same_run(resumed_dir, straight_dir) -> None:
    resumed, straight = train_records(resumed_dir), train_records(straight_dir)
    assert list(straight) == list(range(1, ITERS + 1))
    assert resumed == straight
    got = checkpoint_weights.bert_state_from_checkpoint(str(resumed_dir / "ckpt"))
    want = checkpoint_weights.bert_state_from_checkpoint(str(straight_dir / "ckpt"))
    assert checkpoint.latest_tag(str(resumed_dir / "ckpt")) == checkpoint.tag_for(ITERS)
    assert set(got) == set(want) and all(torch.equal(got[name], want[name]) for name in want)


# ---------------------------------------------------------------- killed from outside, mid-step

def launch(argv, world: int, stderr) -> subprocess.Popen:
    """`world` ranks of pretrain_bert.py in one new process group; returns rank 0's process."""
    port, leader = free_port(), None
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "CUDA_VISIBLE_DEVICES": ""}
        proc = subprocess.Popen([PYTHON, str(ROOT / "pretrain_bert.py"), *argv], cwd=ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=stderr,
                                process_group=0 if leader is None else leader.pid)
        leader = leader or proc
    return leader


def logged_iterations(metrics) -> int:
    if not metrics.is_file():
        return 0
    return max([json.loads(line)["iteration"] for line in metrics.read_text().splitlines() if line.endswith("}")],
               default=0)


def run_and_kill(argv, world: int, metrics, kill_after: int, timeout=180) -> None:
    """SIGKILLs every rank as soon as iteration `kill_after` is logged (the ranks are then inside
    the next step)."""
    stderr = metrics.parent.parent / "stderr.txt"
    with open(stderr, "w") as file:
        leader = launch(argv, world, file)
    deadline = time.monotonic() + timeout
    try:
        while leader.poll() is None and time.monotonic() < deadline:
            if logged_iterations(metrics) >= kill_after:
                return
            time.sleep(0.01)
        ended = "timed out" if leader.poll() is None else f"ended with exit code {leader.poll()}"
        pytest.fail(f"the run {ended} before iteration {kill_after} was logged: {stderr.read_text()[-3000:]}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()


def test_killed_mid_step_twice_resumes_exactly_sp2(tmp_path, data_dir):
    """Ring attention at SP=2, ZeRO 1: killed at two random iterations (every rank SIGKILLed from
    outside), resumed with --load. The uninterrupted run and the last resume run in-process, with as
    many threads as the ranks started as processes."""
    ds = {"sequence_parallel": {"size": 2, "attention": "ring"}, "zero_optimization": {"stage": 1}}
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    straight.mkdir(), killed.mkdir()
    threads = torch.get_num_threads()
    assert run_on_ranks(main, 2, run_argv(straight, data_dir, ds), threads_per_rank=threads, timeout=300) == [0, 0]
    # the sequence ranks hold other tokens of the same samples: each draws its own dropout masks
    # (determinism.seed_dropout); one seed gave both the same RNG state at every step
    rng = [torch.load(straight / "ckpt" / checkpoint.tag_for(ITERS) / f"rng_rank{rank}.pt")["cpu"] for rank in (0, 1)]
    assert not torch.equal(*rng)
    # after iteration 3 or 4 is logged, iter_0000002 is committed: the restart has a checkpoint
    first, second = random.randint(3, 4), random.randint(5, 6)
    print(f"kill points: after iterations {first} and {second}")
    argv = run_argv(killed, data_dir, ds)
    run_and_kill(argv, 2, killed / "log" / "metrics.jsonl", first)
    run_and_kill([*argv, "--load", str(killed / "ckpt")], 2, killed / "log" / "metrics.jsonl", second)
    assert run_on_ranks(main, 2, [*argv, "--load", str(killed / "ckpt")], threads_per_rank=threads,
                        timeout=300) == [0, 0]
    assert_same_run(killed, straight)
    # each checkpoint names the one its run continued from, across the kills (--keep-last follows the links)
    parents = {tag: checkpoint.run_state(str(killed / "ckpt"), tag).get(checkpoint.PARENT)
               for tag in checkpoint.complete_tags(str(killed / "ckpt"))}
    assert parents == {checkpoint.tag_for(i): checkpoint.tag_for(i - 2) if i > 2 else None
                       for i in range(2, ITERS + 1, 2)}


# ---------------------------------------------------------------- one rank killed inside a save

def main_killed_in_save(argv, rank_to_kill: int, tag: str) -> int:
    """`main`, with rank `rank_to_kill` SIGKILLed while it writes its first file of checkpoint `tag`."""
    if torch.distributed.get_rank() == rank_to_kill:
        original = torch.save

        def save(obj, f, *args, **kwargs):
            if isinstance(f, str) and f"{tag}{checkpoint.PARTIAL}" in f:
                os.kill(os.getpid(), signal.SIGKILL)
            return original(obj, f, *args, **kwargs)

        torch.save = save
    return main(argv)


def test_killed_mid_save_then_mid_step_resumes_exactly_pp2(tmp_path, data_dir):
    """BigBird (random blocks per iteration) in a 2-stage pipeline, ZeRO 1. Rank 1 dies writing
    iter_0000004: `latest` still names iter_0000002, the partial folder stays until the resume removes
    it at start-up. That resume is killed inside a step at a random iteration past 4 (every rank
    SIGKILLed from outside) and resumed again: the losses and weights of the uninterrupted run. (The
    ranks run here in-process take as many threads as those started as processes.)"""
    ds = {"zero_optimization": {"stage": 1}, "train_batch_size": 4, "train_micro_batch_size_per_gpu": 2}
    model = ["--pipeline-model-parallel-size", "2", "--bigbird", "--block-size", "16",
             "--bigbird-num-random-blocks", "1"]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    straight.mkdir(), killed.mkdir()
    threads = torch.get_num_threads()
    assert run_on_ranks(main, 2, run_argv(straight, data_dir, ds, *model), threads_per_rank=threads,
                        timeout=300) == [0, 0]
    argv = run_argv(killed, data_dir, ds, *model)
    with pytest.raises(RankFailure, match="rank1 exited without a result"):
        run_on_ranks(main_killed_in_save, 2, argv, 1, checkpoint.tag_for(4), threads_per_rank=threads, timeout=300)
    ckpt, partial = killed / "ckpt", killed / "ckpt" / f"{checkpoint.tag_for(4)}{checkpoint.PARTIAL}"
    assert checkpoint.latest_tag(str(ckpt)) == checkpoint.tag_for(2)
    assert partial.is_dir() and not (ckpt / checkpoint.tag_for(4)).exists()
    kill_after = random.randint(5, 7)  # the log already holds iterations up to 3 or 4
    print(f"kill point: after iteration {kill_after}")
    run_and_kill([*argv, "--load", str(ckpt)], 2, killed / "log" / "metrics.jsonl", kill_after)
    assert not partial.exists()  # removed by the resume at start-up
    assert run_on_ranks(main, 2, [*argv, "--load", str(ckpt)], threads_per_rank=threads, timeout=300) == [0, 0]
    assert_same_run(killed, straight)


# ---------------------------------------------------------------- another rank lost: ended or frozen

def main_losing_rank_1(argv, how: str, at_step: int, thawed: str) -> tuple | None:
    """`main`, where rank 1 ends (os._exit) or freezes at the start of its step `at_step` (frozen: it
    ends once rank 0's main has returned and made the file `thawed`, however long that takes); returns
    rank 0's (exit code, stderr, seconds from rank 1's fault to main's return)."""
    lost_at = []
    train_step = training.train_step

    def step(engine, micro_batches):
        lost_at.append(time.monotonic())
        if len(lost_at) == at_step and torch.distributed.get_rank() == 1:
            deadline = time.monotonic() + 120
            while how == "frozen" and not os.path.exists(thawed) and time.monotonic() < deadline:
                time.sleep(0.1)
            os._exit(0)
        return train_step(engine, micro_batches)
    training.train_step = step
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    open(thawed, "w").close()
    return code, err.getvalue(), time.monotonic() - lost_at[-1] if lost_at else None


@pytest.mark.parametrize("how", ["ended", "frozen"])
def test_a_lost_rank_ends_the_others_with_one_line(tmp_path, data_dir, how):
    """Rank 1 ends (kill -9, a crash) or freezes (SIGSTOP, a hang) in step 3, after the checkpoint of
    step 2: rank 0 leaves with one line naming the phase and the checkpoint to resume from, exit 2,
    no traceback (was: gloo's 30-100 lines; a frozen rank stalled it for torch's 30 minutes, the
    default of the groups made after the default one), within the bound: at once for an ended rank,
    --distributed-timeout-minutes (0.15 here: fractions allowed) for a frozen one. Its --save lock goes."""
    ds = {"train_batch_size": 8}
    argv = run_argv(tmp_path, data_dir, ds, "--distributed-timeout-minutes", "0.15")
    [(code, err, seconds), _] = run_on_ranks(main_losing_rank_1, 2, argv, how, 3, str(tmp_path / "thawed"),
                                             ending_ranks=(1,), timeout=240)
    ckpt = tmp_path / "ckpt"
    said = {"ended": "another rank ended during the step of iteration 3 (its own output or its launcher's says why)",
            "frozen": "another rank did not answer within --distributed-timeout-minutes 0.15 during the step of "
                      "iteration 3 (frozen, hung or slower than that)"}[how]
    fix = f"the last checkpoint is {ckpt / checkpoint.tag_for(2)}: resume with --load {ckpt}"
    assert (code, err.splitlines()[-1:]) == (2, [f"pretrain_bert.py: error: {said}; {fix}" + (
        ", with a larger --distributed-timeout-minutes if that phase is this slow" if how == "frozen" else "")]), err
    assert "Traceback" not in err and not (ckpt / locks.LOCK).exists()
    assert seconds < {"ended": 10, "frozen": 9 + 10}[how]


@pytest.mark.parametrize("error, how", [
    (RuntimeError("[/w/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:123"),
     "ended"),
    (RuntimeError("[/w/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 3000ms for recv "
                  "operation to complete"), "timeout"),
    (torch.distributed.DistBackendError("NCCL error in: ProcessGroupNCCL.cpp:1, remote process exited"), "ended"),
    (torch.distributed.DistStoreError("wait timeout after 600000ms, keys: /megatron/x"), "timeout"),
    (torch.distributed.DistNetworkError("Failed to recv, got 0 bytes. Connection was likely closed. Did the remote "
                                        "server shutdown or crash?"), "ended"),
    (torch.distributed.DistNetworkError("Broken pipe"), "ended"),
    (torch.distributed.DistNetworkError("The server socket has failed to listen on any local network address. "
                                        "port: 29500, useIpv6: 0, code: -98, name: EADDRINUSE, message: address "
                                        "already in use"), None),
    (torch.distributed.DistBackendError("NCCL error in: ProcessGroupNCCL.cpp:1, invalid usage (run with "
                                        "NCCL_DEBUG=WARN for details)"), None),
    (RuntimeError("Connection closed by peer"), None),  # no gloo location: not the backend's (a narrow match)
    (RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)"), None),
    (ValueError("[gloo/transport/tcp/pair.cc:1] not a RuntimeError"), None),
], ids=["gloo_closed", "gloo_timeout", "nccl", "store_timeout", "store_host_gone", "store_pipe",
                          "port_in_use", "nccl_usage", "bare_message", "bug", "other_type"])
def test_only_a_lost_rank_is_told_apart(error, how):
    """The backends' errors for another rank that ended or did not answer; every other error keeps
    its traceback (the training loop's bugs are RuntimeErrors too; a DistError of another cause, such
    as the store's port in use, would fail the same way on a rerun)."""
    assert peers.lost(error) == how


def build_map_losing_a_rank(folder: str, build_seconds: float, lost_rank: int | None, lost_after: float) -> tuple:
    """cached_array on every rank under a 1 s collective bound, rank 0 building for `build_seconds`;
    `lost_rank` ends `lost_after` seconds into it (0: as it would enter it). (outcome, seconds): outcome
    is the map, or peers.lost's verdict."""
    device.bound_collectives(timedelta(seconds=1))
    if dist.get_rank() == lost_rank:
        if not lost_after:
            os._exit(1)
        threading.Timer(lost_after, os._exit, (1,)).start()

    def build():
        time.sleep(build_seconds)
        return np.arange(5)
    start = time.monotonic()
    try:
        outcome = list(map(int, bert_dataset.cached_array(os.path.join(folder, "map.npy"), build)))
    except Exception as error:
        outcome = peers.lost(error) or repr(error)
    return outcome, time.monotonic() - start


def test_an_index_map_build_outlasts_the_collective_bound(tmp_path):
    """Rank 0 builds an index map for 4 s while the others wait under a 1 s collective bound: all go
    on with the map (no fixed bound on the build: was 120 minutes, then the launcher killed the build)."""
    results = run_on_ranks(build_map_losing_a_rank, 3, str(tmp_path), 4.0, None, 0, timeout=60)
    assert [outcome for outcome, _ in results] == [[0, 1, 2, 3, 4]] * 3


@pytest.mark.parametrize("lost_after", [0, 1.0], ids=["as_it_starts", "during_it"])
def test_a_rank_lost_around_an_index_map_build_ends_the_others(tmp_path, lost_after):
    """Rank 2, which does not build, ends as rank 0's 4 s build starts or during it: ranks 0 and 1 end
    at once or as soon as the build is done, with the lost-rank verdict (was, for a rank lost before it
    arrived: both waited 120 minutes, then blamed the builder)."""
    results = run_on_ranks(build_map_losing_a_rank, 3, str(tmp_path), 4.0, 2, lost_after, ending_ranks=(2,),
                           timeout=40)
    assert [outcome for outcome, _ in results[:2]] == ["ended", "ended"] and results[2] is None
    assert max(seconds for _, seconds in results[:2]) < 10


def test_a_silent_builder_fails_the_wait_after_the_timeout():
    """A builder whose heartbeat stops (frozen, its node lost) fails the others' wait after the store's
    timeout, as a timeout (lost-rank line); one that beats goes on past it until it is done."""
    store = dist.TCPStore("127.0.0.1", free_port(), 1, True, timeout=timedelta(seconds=1))
    threading.Timer(2.5, store.set, ("beating/done/1", "1")).start()
    start = time.monotonic()
    with peers._heartbeat(store, "beating/beat/1", 0.2):
        peers._wait_for(store, "beating", [1], 1.0)
    assert time.monotonic() - start > 2
    with pytest.raises(dist.DistStoreError) as silent:
        peers._wait_for(store, "silent", [1], 1.0)
    assert peers.lost(silent.value) == "timeout" and "rank 1" in str(silent.value)


def test_a_rank_lost_at_the_end_of_a_complete_run_cuts_nothing(monkeypatch, capsys):
    """A rank lost at the last agreement, after every step was trained and saved: the others close
    their log, plot, exit 0 and say the run is complete (was: exit 2 and "resume with --load" from the
    phase of the last save)."""
    class Log:
        done = []

        def close(self):
            self.done.append("close")

        def plot(self, save):
            self.done.append("plot")

    def lost(values):
        raise RuntimeError("[/w/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:1")

    stop = stop_signals.StopSignals("tokenizer.json")
    monkeypatch.setattr(stop, "_largest", lost)
    args = SimpleNamespace(save="ckpt", distributed_timeout_minutes=10, launched_by=None)
    assert stop.complete(args, 8, "ckpt/iter_0000008", Log()) is None and Log.done == ["close", "plot"]
    assert capsys.readouterr().err == ("pretrain_bert.py: another rank ended during the end of the run (its own "
                                       "output or its launcher's says why); the run is complete: checkpoint "
                                       "ckpt/iter_0000008 holds iteration 8\n")


def test_a_lost_rank_outlives_the_launchers_sigterm(monkeypatch, capsys):
    """The launcher SIGTERMs every rank once one ended; a survivor blocked in a collective during
    start-up handles that signal only as the collective's error is being reported (here: as the lock is
    released). The error's line is still printed, once, with exit 2 and the lock released (was: the
    Interrupted escaped the report, a KeyboardInterrupt traceback and the lock left)."""
    from megatron.errors import Interrupted

    released = []

    def release_lock():
        released.append(1)
        if len(released) == 1:
            raise Interrupted(signal.SIGTERM)

    def lost_in_start_up(args, start_up, progress):
        raise RuntimeError("[/w/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:1")

    for name in ("check_flags", "check_flag_combinations"):
        monkeypatch.setattr(training, name, lambda args: None)
    monkeypatch.setattr(training, "pretrain", lost_in_start_up)
    monkeypatch.setattr(locks, "release_lock", release_lock)
    assert main(["--data-path", "x"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "pretrain_bert.py: error: another rank ended during start-up (its own output or its launcher's says why); "
        "nothing was trained; rerun the same command"]
    assert len(released) >= 2


# stands for the interpreter's teardown: an object that only the clearing of the sys module at the end frees
TEARDOWN_PROBE = """
import atexit, os, runpy, sys
class Probe:
    def __del__(self, write=os.write):
        write(2, b"interpreter teardown ran\\n")
sys.teardown_probe = Probe()
atexit.register(os.write, 2, b"exit hooks ran\\n")
print("printed before main, not flushed")
sys.argv[0] = {script!r}
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("outcome", ["finished", "refused", "raised"])
def test_a_rank_ends_without_the_interpreters_teardown(tmp_path, data_dir, outcome):
    """pretrain_bert.py leaves by os._exit (training.exit_rank), however main ends: DeepSpeed's engine
    keeps the gloo groups and their threads alive past main, and a teardown racing one of them
    aborted ranks of finished runs now and then (SIGABRT; the launcher's exit 250 in CI). An object
    freed only by the teardown stands for it: it must not be freed, while the exit hooks (logging,
    wandb) run, and the exit code and all the rank printed, into block-buffered pipes, arrive: for a
    finished run, a refused one and one that raised (a traceback). This sees the exit path, not the
    race itself, which no test brings about on demand."""
    mistake = {"finished": [], "refused": ["--weight-decay", "-5"],
               "raised": ["--vocab-file", str(tmp_path / "none.txt"), "--debug"]}[outcome]
    argv = [*TINY, "--train-iters", "2", "--log-interval", "1", "--eval-iters", "1", "--default-data-dir", data_dir,
            "--log-dir", str(tmp_path / "log"), *mistake]
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run([PYTHON, "-c", TEARDOWN_PROBE.format(script=str(ROOT / "pretrain_bert.py")), *argv],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert "interpreter teardown ran" not in result.stderr and "exit hooks ran" in result.stderr, result.stderr
    assert result.stdout.startswith("printed before main, not flushed\n")
    if outcome == "refused":
        assert result.returncode == 2 and "error: --weight-decay -5.0 is negative" in result.stderr, result.stderr
    elif outcome == "raised":
        assert result.returncode == 1 and "Traceback" in result.stderr and "DataError: vocab file" in result.stderr
    else:
        assert result.returncode == 0, result.stderr[-3000:]
        assert "iteration 2/2" in result.stdout and result.stdout.rstrip().endswith(str(tmp_path / "log" / "loss.png"))


def test_save_dir_ahead_of_the_run_is_refused(tmp_path):
    (tmp_path / "latest").write_text(checkpoint.tag_for(10))
    with pytest.raises(ConfigError, match="holds checkpoint iter_0000010, ahead of this run's start at iteration 0"):
        checkpoint_save.check_save_dir(str(tmp_path), 0)
    checkpoint_save.check_save_dir(str(tmp_path), 10)  # resuming from it


def fake_checkpoints(save, *iterations, latest=None, run_id=None) -> None:
    """iter_* folders that pass for complete ones (model states, run_state.json), and `latest`; `run_id`: the
    run they belong to (checkpoint.RUN_ID in their origin record; none: saved before runs had one)."""
    for iteration in iterations:
        folder = save / checkpoint.tag_for(iteration)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "mp_rank_00_model_states.pt").write_bytes(b"")
        origin = {checkpoint.ORIGIN: {"from": None, checkpoint.RUN_ID: run_id}} if run_id else {}
        (folder / checkpoint.RUN_STATE).write_text(json.dumps(
            {"config": {"model": {}}, "iteration": iteration, "consumed_samples": 2 * iteration, **origin}))
    if latest is not None:
        (save / checkpoint.LATEST).write_text(checkpoint.tag_for(latest))


def start_run(save, load="save", finetune=False) -> "start_plan.StartPlan":
    args = argparse.Namespace(init_from_hf=None, load=str(save) if load == "save" else load, save=str(save),
                              finetune=finetune, launched_by=None)
    given = dict(vars(args))
    plan = start_plan.check_start(args)
    assert vars(args) == given  # the run reads the plan; the flags stay as given
    return plan


def test_a_save_dir_with_checkpoints_but_no_latest_is_refused(tmp_path, capsys):
    """A copy that missed `latest`, or one deleted by hand: `--load S --save S` started from scratch and
    overwrote S's checkpoints. A folder with none (a first run killed in its first save) still starts."""
    save = tmp_path / "ck"
    (save / "iter_0000006.partial").mkdir(parents=True)
    assert start_run(save).load is None  # Megatron's --load X --save X before the first save
    fake_checkpoints(save, 2, 4)
    refusal = (f"--save {save} holds checkpoints iter_0000002, iter_0000004 but no 'latest' naming the one to resume; "
               f"write the tag to resume into {save / 'latest'} (the newest: iter_0000004) and resume with --load "
               f"{save}, or choose another --save directory to start afresh")
    for load in ("save", None):
        with pytest.raises(ConfigError, match=f"^{re.escape(refusal)}$"):
            start_run(save, load)
    with pytest.raises(ConfigError, match=re.escape(f"missing 'latest'); write the tag to resume into "
                                                    f"{save / 'latest'} (the newest: iter_0000004)") + "$"):
        checkpoint.latest_tag(str(save))
    (save / checkpoint.LATEST).write_text("iter_0000004")
    capsys.readouterr()
    assert start_run(save).load == str(save) and capsys.readouterr().err == ""


def test_a_rollback_names_the_checkpoints_it_will_overwrite(tmp_path, capsys):
    """`latest` edited back to an older tag (after a loss spike): the newer checkpoints of --save are
    replaced by this run's saves at their iterations, as one warning says; --load elsewhere alike."""
    save = tmp_path / "ck"
    fake_checkpoints(save, 2, 4, 6, latest=2)
    capsys.readouterr()
    start_run(save)
    assert capsys.readouterr().err == (
        f"warning: --save {save} holds iter_0000004, iter_0000006, beyond iteration 2 where this run starts: a save "
        f"of this run at one of their iterations replaces that checkpoint (--keep-last neither counts nor removes "
        f"them); move them out of {save} to keep them\n")
    other = tmp_path / "other"
    fake_checkpoints(other, 4, latest=4)
    start_run(save, str(other))
    assert capsys.readouterr().err == (
        f"warning: --save {save} holds iter_0000006, beyond iteration 4 where this run starts: a save of this run "
        f"at its iteration replaces it (--keep-last neither counts nor removes it); move it out of {save} to keep it\n")


def test_a_resume_into_a_save_of_another_run_is_refused_naming_its_checkpoints(tmp_path, capsys):
    """`--load A --save B`, B holding another run's checkpoints at or below A's iteration: this run's saves
    joined them under one `latest` (a rollback there would resume that run), as one line refuses. This run's
    own there (moved or copied between the two folders, a run that went A -> B -> A) carry its run id: not
    named; nor are checkpoints without one. A new run from A's weights (--finetune) into an empty B starts."""
    save, load = tmp_path / "ck", tmp_path / "other"
    fake_checkpoints(load, 4, latest=4, run_id="this")
    assert start_run(tmp_path / "empty", str(load), finetune=True).weights_only
    fake_checkpoints(save, 2, 4, latest=4, run_id="this")  # this run's history, moved there
    capsys.readouterr()
    start_run(save, str(load))
    assert capsys.readouterr().err == ""
    for iteration in (4, 2):  # another run's: another run id
        fake_checkpoints(save, iteration, run_id="another")
        named = "iter_0000004" if iteration == 4 else "iter_0000002, iter_0000004"
        them = "it" if iteration == 4 else "them"
        with pytest.raises(ConfigError) as refused:
            start_run(save, str(load))
        assert str(refused.value) == (
            f"--save {save} holds {named} of another run (run id another), not of the run --load {load} resumes: "
            f"its saves would join {them} under one 'latest'; pass another --save, or --load {save} to continue "
            f"that run, or move {them} out of {save}")
    assert start_run(save).load == str(save)  # continuing that run
    assert capsys.readouterr().err == ""
    fake_checkpoints(load, 4, latest=4)  # saved before runs had an id: nothing to tell them apart by
    start_run(save, str(load))
    assert capsys.readouterr().err == ""


def test_a_new_runs_origin_carries_a_run_id_of_its_own():
    """The id foreign_tags compares: made by each new run (scratch or weights), never shared by two."""
    plan = start_plan.StartPlan.at(load=None, init_from_hf=None, finetune=False)  # from scratch
    first, second = (start_plan.weights_origin(plan) for _ in range(2))
    assert first[checkpoint.RUN_ID] != second[checkpoint.RUN_ID] and len(first[checkpoint.RUN_ID]) == 32


def test_finetune_into_the_folder_it_starts_from_names_finetune(tmp_path):
    """The refusal named --load, which was given: --finetune (a new run from iteration 0) is the cause."""
    save = tmp_path / "ck"
    fake_checkpoints(save, 4, latest=4)
    with pytest.raises(ConfigError, match=f"^--finetune starts a new run at iteration 0, and --save {save} holds "
                                          f"iteration 4 of the run it starts from; pass another --save, or drop "
                                          f"--finetune to resume {save}$"):
        start_run(save, finetune=True)


# ---------------------------------------------------------------- unreadable checkpoints

def test_unreadable_checkpoints_are_one_line_errors(tmp_path):
    with pytest.raises(ConfigError, match="missing 'latest'"):
        checkpoint.latest_tag(str(tmp_path))
    (tmp_path / "latest").write_text(checkpoint.tag_for(4))
    with pytest.raises(DataError, match=f"{tmp_path / 'iter_0000004'} named by .* does not exist"):
        checkpoint.checkpoint_folder(str(tmp_path), checkpoint.tag_for(4))
    (tmp_path / "iter_0000004").mkdir()
    with pytest.raises(DataError, match="iter_0000004 is incomplete"):
        checkpoint.checkpoint_folder(str(tmp_path), checkpoint.tag_for(4))
    states = tmp_path / "iter_0000004" / "mp_rank_00_model_states.pt"
    torch.save({"module": {"w": torch.ones(3)}, "config": {}}, states)
    states.write_bytes(states.read_bytes()[:40])  # truncated
    with pytest.raises(DataError, match=f"checkpoint file {states} cannot be read"):
        checkpoint.safe_load(str(states))
    small, large = BertConfig(hidden_size=32, num_attention_heads=4), BertConfig(hidden_size=64, num_attention_heads=4)
    with pytest.raises(ConfigError, match=r"holds embeddings.word_embeddings.weight of shape \[30592, 32\], this "
                                          r"model expects \[30592, 64\]"):
        checkpoint_compat.check_model_shapes(vars(small), large, "ckpt/iter_0000004")
    # a preset's vocab (50368) before presets left the vocab size to the vocab file: the flag to pass
    preset_vocab = BertConfig(hidden_size=32, num_attention_heads=4, vocab_size=50368)
    with pytest.raises(ConfigError, match=r"this model expects \[30592, 32\]; pass --vocab-size 50368, the "):
        checkpoint_compat.check_model_shapes(vars(preset_vocab), small, "ckpt/iter_0000004")


def test_own_files_load_with_weights_only(tmp_path):
    """RNG states and run state need no full unpickling (DeepSpeed's optimizer files do)."""
    path = tmp_path / "rng.pt"
    torch.save(checkpoint_save.rng_states(), path)
    assert torch.equal(torch.load(path, weights_only=True)["cpu"], torch.get_rng_state())


# ---------------------------------------------------------------- NaN / inf

def main_with_bad_loss(argv, bad_iteration: int, value: float):
    """`main` with the embeddings' output multiplied by `value` (nan, inf) in the forward of
    training step `bad_iteration`; returns (exit code, stderr, stdout)."""
    import megatron.training as training

    build = training.build_engine

    def build_with_fault(*args, **kwargs):
        engine = build(*args, **kwargs)
        calls = []

        def inject(module, inputs, output):
            if module.training:
                calls.append(1)
                if len(calls) == bad_iteration:
                    return output * value
            return None

        engine.module.embeddings.register_forward_hook(inject)
        return engine

    training.build_engine = build_with_fault
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = training.main(argv)
    return code, err.getvalue(), out.getvalue()


def nan_argv(tmp_path, data_dir, ds: dict, *extra) -> list:
    return [*TINY, "--deepspeed", "--deepspeed_config", write_json(tmp_path / "ds.json", ds), "--train-iters", "4",
            "--save-interval", "1", "--log-interval", "1", "--eval-interval", "1000", "--eval-iters", "1",
            "--split", "100,0,0", "--default-data-dir", data_dir, "--save", str(tmp_path / "ckpt"),
            "--log-dir", str(tmp_path / "log"), *extra]


def weights(run_dir, iteration: int) -> dict:
    return checkpoint_weights.bert_state_from_checkpoint(str(run_dir / "ckpt"), checkpoint.tag_for(iteration))


def same_weights(a: dict, b: dict) -> bool:
    return all(torch.equal(a[name], b[name]) for name in a)


BF16 = {"bf16": {"enabled": True}}


@pytest.mark.parametrize("ds", [
    {"zero_optimization": {"stage": 0}},  # the plain torch optimizer
    {**BF16, "zero_optimization": {"stage": 0}},  # DeepSpeed's FP16_UnfusedOptimizer over bf16 weights
    {**BF16, "zero_optimization": {"stage": 1}},  # DeepSpeedZeroOptimizer, bf16 gradients
    {**BF16, "zero_optimization": {"stage": 1}, "data_types": {"grad_accum_dtype": "fp32"}},  # BF16_Optimizer
], ids=["fp32", "bf16-zero0", "bf16-zero1", "bf16-zero1-fp32-grads"])
def test_nan_loss_stops_naming_the_last_good_checkpoint(tmp_path, data_dir, ds):
    """fp32 and bf16 alike: one line naming the iteration and the last good checkpoint, exit 2,
    also where DeepSpeed's bf16 optimizers skip the non-finite step by themselves."""
    argv = nan_argv(tmp_path, data_dir, ds)
    code, err, _ = run_on_ranks(main_with_bad_loss, 1, argv, 3, float("nan"), timeout=300)[0]
    errors = [line for line in err.splitlines() if line.startswith("pretrain_bert.py: error:")]
    assert code == 2 and len(errors) == 1, err[-2000:]
    last = tmp_path / 'ckpt' / 'iter_0000002'
    assert re.search(re.escape(f"loss is nan at iteration 3; the last checkpoint is {last} (logged loss ")
                     + r"\d+\.\d+" + re.escape(
        f"): start a new run from its weights with a lower rate (--finetune --load {tmp_path / 'ckpt'} --lr LOWER "
        "--save ANOTHER_DIR; a resume keeps the checkpoint's peak --lr)"), errors[0]), errors[0]
    assert checkpoint.latest_tag(str(tmp_path / "ckpt")) == checkpoint.tag_for(2)


def test_skip_nan_batches_leaves_the_weights_and_lr_unchanged(tmp_path, data_dir):
    """fp32 at ZeRO 0 (a plain torch optimizer, guarded by skip_nonfinite_updates; DeepSpeed's
    ZeRO, bf16 and fp16 optimizers skip by themselves): the step is skipped whole, weights
    unchanged, no LR-scheduler step, and the run goes on."""
    argv = nan_argv(tmp_path, data_dir, {"zero_optimization": {"stage": 0}}, "--skip-nan-batches")
    code, err, out = run_on_ranks(main_with_bad_loss, 1, argv, 3, float("nan"), timeout=300)[0]
    assert code == 0, err[-2000:]
    assert "iteration 3: loss nan, gradients not finite: update skipped" in out
    assert ("warning: 1 of this run's 4 updates were skipped for a non-finite loss or gradients (iterations 3): "
            "those steps trained nothing") in err.splitlines(), err[-2000:]
    assert same_weights(weights(tmp_path, 3), weights(tmp_path, 2))
    assert not same_weights(weights(tmp_path, 4), weights(tmp_path, 3))
    assert all(torch.isfinite(t).all() for t in weights(tmp_path, 4).values())
    records = train_records(tmp_path)
    # the logged lr is the rate a step used: the skipped step 3 did not advance the schedule, so step 4
    # runs at step 3's rate
    assert records[4][1] == records[3][1] and records[3][1] != records[2][1], records


def test_fp16_overflow_lowers_the_loss_scale_and_skips(tmp_path, data_dir):
    """DeepSpeed's dynamic loss scaler (hysteresis 1: the first overflow halves the scale)."""
    ds = {"zero_optimization": {"stage": 1}, "fp16": {"enabled": True, "initial_scale_power": 8, "hysteresis": 1}}
    argv = nan_argv(tmp_path, data_dir, ds)
    code, err, out = run_on_ranks(with_fp16_kernels_allowed, 1, main_with_bad_loss, argv, 3, float("inf"), timeout=300)[0]
    assert code == 0, err[-2000:]
    records = [json.loads(line) for line in (tmp_path / "log" / "metrics.jsonl").read_text().splitlines()]
    scales = {r["iteration"]: r["loss_scale"] for r in records if r["kind"] == "train"}
    assert scales[3] == scales[2] / 2 and scales[2] == 2.0 ** 8, scales
    assert "iteration 3:" in out and "update skipped" in out
    assert same_weights(weights(tmp_path, 3), weights(tmp_path, 2))


# ---------------------------------------------------------------- checked before the first step

def two_nodes_one_unwritable(save_dir: str, unwritable_rank: int) -> dict:
    """Each rank plays a node (LOCAL_RANK 0); on `unwritable_rank` the probe file cannot be created.
    Also reports an error from all ranks and then from rank 1 alone: how often it is printed."""
    import builtins

    os.environ["LOCAL_RANK"] = "0"
    rank, outcome = torch.distributed.get_rank(), {}
    real_open = builtins.open

    def open_denied(file, *args, **kwargs):
        if ".write_probe." in str(file):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    builtins.open = open_denied if rank == unwritable_rank else real_open
    try:
        checkpoint_save.check_writable(save_dir)
    except ConfigError as error:
        outcome["error"] = str(error)
    finally:
        builtins.open = real_open
    outcome["left"] = os.path.exists(os.path.dirname(save_dir))
    # the nodes' flags and JSON compared: alike but where they may differ (the JSON's path, the local rank),
    # then rank 1 launched with another --seq-length
    for case, seq_length in (("alike", "128"), ("other", "128" if rank == 0 else "256")):
        args = build_parser().parse_args(["--seq-length", seq_length, "--local_rank", str(rank),
                                          "--deepspeed_config", f"node{rank}/ds_config.json"])
        try:
            same_settings.check_same_settings(same_settings.launch_settings(args, {"zero_optimization": {"stage": 1}}),
                                              lambda: same_settings.flag_names(build_parser()))
        except ConfigError as error:
            outcome[case] = str(error)
    for reporters in ((0, 1), (1,)):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            if rank in reporters:
                peers.report_once(f"pretrain_bert.py: error: found by {reporters}")
        torch.distributed.barrier()
        outcome[reporters] = err.getvalue()
        if rank == 0:  # a fresh count for the next case (a run reports once)
            torch.distributed.distributed_c10d._get_default_store().delete_key("megatron/errors_reported")
        torch.distributed.barrier()
    return outcome


def test_unwritable_save_on_one_node_stops_every_rank_before_training(tmp_path):
    """The node whose --save cannot be written is named; every rank raises, before any step, and
    the folders the probe created are gone. An error is printed once, whichever ranks meet it."""
    save_dir = tmp_path / "new" / "ckpt"
    outcomes = run_on_ranks(two_nodes_one_unwritable, 2, str(save_dir), 1, timeout=120)
    errors = {outcome.get("error") for outcome in outcomes}
    assert len(errors) == 1 and errors != {None}, errors
    assert f"--save {save_dir} is not writable on" in errors.pop()
    assert not any(outcome["left"] for outcome in outcomes)  # tmp/new was created for the probe, then removed
    for reporters in ((0, 1), (1,)):
        printed = "".join(outcome[reporters] for outcome in outcomes)
        assert printed == f"pretrain_bert.py: error: found by {reporters}\n", printed
    assert not any("alike" in outcome for outcome in outcomes)
    host = socket.gethostname()
    assert [outcome.get("other") for outcome in outcomes] == [
        f"the ranks were launched with different settings: --seq-length is 128 on rank 0 ({host}) but 256 on rank 1 "
        f"({host}); launch every node with the same command and the same DeepSpeed JSON"] * 2


def test_the_first_setting_a_rank_was_launched_with_otherwise_is_named_with_its_rank_and_host():
    """Rank 2 of 3 has another --lr and --train-iters (--train-iters comes first, as the parser lists
    it); the DeepSpeed JSON's path, the local rank and the log folder may differ, its content may not."""
    parser = build_parser()
    names = same_settings.flag_names(parser)
    ds = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 1}}

    def on_rank(rank, *flags, json=ds):
        args = parser.parse_args(["--lr", "1e-4", "--train-iters", "4", "--local_rank", str(rank),
                                  "--deepspeed_config", f"run{rank}/ds_config.json", "--log-dir", f"run{rank}", *flags])
        return same_settings.launch_settings(args, json)

    alike = [on_rank(rank) for rank in range(3)]
    assert same_settings.different_settings(alike, ["a", "a", "b"], names) is None
    other = [on_rank(0), on_rank(1), on_rank(2, "--lr", "5e-4", "--train-iters", "6")]
    assert str(same_settings.different_settings(other, ["a", "a", "b"], names)) == (
        "the ranks were launched with different settings: --train-iters is 4 on rank 0 (a) but 6 on rank 2 (b) "
        "(also --lr); launch every node with the same command and the same DeepSpeed JSON")
    json_only = [on_rank(0), on_rank(1, json={**ds, "zero_optimization": {"stage": 2}}), on_rank(2)]
    assert str(same_settings.different_settings(json_only, ["a", "a", "b"], names)).startswith(
        "the ranks were launched with different settings: the DeepSpeed JSON's zero_optimization.stage is 1 on "
        "rank 0 (a) but 2 on rank 1 (a);")
    saved = [on_rank(0, "--save", "run0/ckpt"), on_rank(1)]  # the folders themselves: check_writable, by rank 0's lock
    assert str(same_settings.different_settings(saved, ["a", "b"], names)).endswith(
        "--save is given on rank 0 (a) but not given on rank 1 (b); launch every node with the same command and "
        "the same DeepSpeed JSON, with --save and --load a folder every node shares (the launch scripts: the same "
        "RUN_DIR)")
    switched = [on_rank(0), on_rank(1, "--bert-no-binary-head")]
    assert "--bert-no-binary-head is not given on rank 0 (a) but given on rank 1 (a);" in str(
        same_settings.different_settings(switched, ["a", "a"], names))


def main_captured(argv) -> tuple:
    """`main`'s exit code and everything the rank printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(argv)
    return code, out.getvalue()


def test_a_load_that_fails_on_another_rank_prints_no_resume_on_rank_0(tmp_path, data_dir):
    """Rank 1's optimizer file is missing: rank 1 says so, and rank 0, whose own load went fine, prints
    nothing after it that reads like a successful resume (`config:`, `resuming from ...`); both exit 2."""
    argv = run_argv(tmp_path, data_dir, {"train_batch_size": 8, "zero_optimization": {"stage": 1}},
                    "--train-iters", "2")
    assert run_on_ranks(main, 2, argv, timeout=300) == [0, 0]
    missing = tmp_path / "ckpt" / checkpoint.tag_for(2) / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    missing.unlink()
    [(code_0, out_0), (code_1, out_1)] = run_on_ranks(main_captured, 2, [*argv, "--train-iters", "4", "--load",
                                                                         str(tmp_path / "ckpt")], timeout=300)
    assert (code_0, code_1) == (2, 2)
    assert f"checkpoint file {missing} is missing; restore it" in out_1
    assert "resuming from" not in out_0 and "config: " not in out_0, out_0

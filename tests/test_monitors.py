"""DeepSpeed's monitors (the JSON's csv_monitor, tensorboard, wandb, comet) receive the trainer's records.

What these tests see: the files DeepSpeed's own csvMonitor writes in a real run, and the calls its
WandbMonitor makes into a stand-in `wandb` package that records them (no account or network here);
the start-up checks of the sections. What they cannot see: the real wandb / comet services.
"""
import csv
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from deepspeed.monitor import csv_monitor

from megatron import monitors

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
        "--max-position-embeddings", "64", "--micro-batch-size", "2"]
# a `wandb` that appends each call to $FAKE_WANDB_LOG: what DeepSpeed's WandbMonitor hands the service
FAKE_WANDB = '''import json, os
def _record(call, **fields):
    with open(os.environ["FAKE_WANDB_LOG"], "a") as log:
        log.write(json.dumps({"call": call, **fields}) + "\\n")
def init(**fields): _record("init", **fields)
def log(data, step=None, commit=None): _record("log", data=data, step=step)
'''


def read_csv(path: Path) -> dict:
    """csvMonitor's file -> {step: value}; its header row is ['step', <metric>]."""
    rows = list(csv.reader(path.open()))
    assert rows[0][0] == "step", rows[:2]
    return {int(step): float(value) for step, value in rows[1:]}


def test_every_record_reaches_the_deepspeed_monitors_at_its_consumed_samples(tmp_path, data_dir):
    """A run with csv_monitor and wandb enabled: each train, validation and test record's numbers are
    events at the record's consumed samples, equal to metrics.jsonl's; DeepSpeed's own lr events stay
    the only ones of their name (one per step)."""
    (tmp_path / "fake" / "wandb").mkdir(parents=True)
    (tmp_path / "fake" / "wandb" / "__init__.py").write_text(FAKE_WANDB)
    ds = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
          "csv_monitor": {"enabled": True, "output_path": str(tmp_path / "csv"), "job_name": "job"},
          "wandb": {"enabled": True, "project": "long-bert"}}
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "fake"), "FAKE_WANDB_LOG": str(tmp_path / "wandb.jsonl"),
           "CUDA_VISIBLE_DEVICES": ""}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    data_dir = Path(data_dir)
    command = [sys.executable, "pretrain_bert.py", "--deepspeed", "--deepspeed_config", str(tmp_path / "ds.json"),
               *TINY, "--data-path", str(data_dir / "sample_text_sentence"), "--vocab-file",
               str(data_dir / "vocab.txt"), "--train-iters", "4", "--log-interval", "2", "--eval-interval", "2",
               "--eval-iters", "1", "--split", "90,5,5", "--log-dir", str(tmp_path / "log")]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]

    records = [json.loads(line) for line in (tmp_path / "log" / "metrics.jsonl").read_text().splitlines()]
    by_kind = {kind: [r for r in records if r["kind"] == kind] for kind in ("train", "validation", "test")}
    assert [r["consumed_samples"] for r in by_kind["train"]] == [4, 8]
    assert all(by_kind.values()), by_kind
    job = tmp_path / "csv" / "job"
    for kind, name in (("train", "loss"), ("train", "mlm_loss"), ("train", "grad_norm"), ("validation", "loss"),
                       ("test", "loss")):
        written = read_csv(job / f"{kind.capitalize()}_Samples_{name}.csv")
        assert written == pytest.approx({r["consumed_samples"]: r[name] for r in by_kind[kind]}), (kind, name)
    assert sorted(read_csv(job / "Train_Samples_lr.csv")) == [2, 4, 6, 8]  # DeepSpeed's, after each step

    calls = [json.loads(line) for line in (tmp_path / "wandb.jsonl").read_text().splitlines()]
    assert calls[0] == {"call": "init", "project": "long-bert", "group": None, "entity": None}
    logged = {(name, call["step"]): value for call in calls[1:] for name, value in call["data"].items()}
    for record in by_kind["train"]:
        assert logged[("Train/Samples/loss", record["consumed_samples"])] == pytest.approx(record["loss"])
    assert logged[("Validation/Samples/loss", 8)] == pytest.approx(by_kind["validation"][-1]["loss"])


def test_monitor_problems_name_the_section_and_the_fix(tmp_path, monkeypatch):
    config = {"wandb": {"enabled": True}, "csv_monitor": {"enabled": False, "output_path": "/nowhere"}}
    real_find_spec = monitors.importlib.util.find_spec
    monkeypatch.setattr(monitors.importlib.util, "find_spec",
                        lambda name: None if name == "wandb" else real_find_spec(name))
    problem, fix = monitors.monitor_problem(config, "ds.json")
    assert problem == "the DeepSpeed config ds.json enables wandb, and the wandb package is not installed"
    assert fix.startswith("pip install wandb") and fix.endswith("or set wandb.enabled to false")

    (tmp_path / "a_file").write_text("not a folder")
    for output_path in (tmp_path / "a_file", tmp_path / "a_file" / "below"):
        config = {"tensorboard": {"enabled": True, "output_path": str(output_path), "job_name": "job"}}
        problem, fix = monitors.monitor_problem(config, "ds.json")
        assert "tensorboard.output_path" in problem and str(tmp_path / "a_file") in problem, problem
        assert fix == "set tensorboard.output_path to a folder this user can write"

    # a relative output_path is named as written, without the job_name DeepSpeed adds (docs/errors.md)
    monkeypatch.chdir(tmp_path)
    config = {"csv_monitor": {"enabled": True, "output_path": "a_file/job"}}
    assert monitors.monitor_problem(config, "ds.json") == (
        "the DeepSpeed config ds.json's csv_monitor.output_path a_file/job lies under a_file, which is a file, not a "
        "directory", "set csv_monitor.output_path to a folder this user can write")
    (tmp_path / "lnk").symlink_to("gone")  # a relative link given relative: both named as written
    problem, fix = monitors.monitor_problem({"csv_monitor": {"enabled": True, "output_path": "lnk/job"}}, "ds.json")
    assert (problem, fix) == ("the DeepSpeed config ds.json's csv_monitor.output_path: lnk is a link to gone, which "
                              "does not exist (a scratch folder not made yet, a file system not mounted)",
                              "create it (mkdir -p gone), or pass another folder")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "job").write_text("a file where DeepSpeed makes its folder")
    config = {"csv_monitor": {"enabled": True, "output_path": "out", "job_name": "job"}}
    assert monitors.monitor_problem(config, "ds.json") == (
        "the DeepSpeed config ds.json's csv_monitor.output_path/job_name out/job is a file, not a directory",
        "set csv_monitor.output_path to a folder this user can write, or csv_monitor.job_name to a name no file "
        "there has")

    fresh = tmp_path / "new" / "deeper"
    assert monitors.monitor_problem({"csv_monitor": {"enabled": True, "output_path": str(fresh)}}, "ds.json") is None
    assert not (tmp_path / "new").exists()  # the probe's folders are removed again
    assert monitors.monitor_problem({"wandb": {"enabled": False}, "comet": "off"}, "ds.json") is None


def test_a_monitor_file_that_cannot_be_written_stops_the_run_as_the_run_logs_does(tmp_path, monkeypatch):
    """DeepSpeed's csvMonitor failing to write (its folder gone): a `failure` the stop agreement acts on,
    naming the file, not a traceback on rank 0 alone; the same for DeepSpeed's own write of its events inside
    engine.step (it raised there: a traceback, and no final checkpoint), which writes nothing more after."""
    from test_run_log import rank_0_run_log

    monkeypatch.setattr(csv_monitor.dist, "get_rank", lambda: 0)
    monitor = csv_monitor.csvMonitor(SimpleNamespace(enabled=True, output_path=str(tmp_path / "csv"), job_name="job"))
    log = rank_0_run_log(monkeypatch, tmp_path / "log", steps=2, interval=1, monitor=monitor)
    engine = SimpleNamespace(fp16_enabled=lambda: False)
    result = SimpleNamespace(loss=2.0, mlm=1.5, sop=0.5, grad_norm=1.0, mlm_accuracy=0.5, real_token_share=1.0,
                             segments_per_sample=1.0, real_flops_per_sample=1e9)
    log.step(1, 4, result, engine, seconds=0.5, lr=1e-3)
    assert log.failure is None and read_csv(tmp_path / "csv" / "job" / "Train_Samples_loss.csv") == {4: 2.0}
    (tmp_path / "csv" / "job").rename(tmp_path / "moved")
    (tmp_path / "csv" / "job").write_text("a file where the folder was")
    monitor.write_events([("Train/Samples/lr", 1e-3, 8)])  # as engine.step writes DeepSpeed's own: no raise
    assert log.failure[0].startswith(f"cannot write a DeepSpeed monitor's file {tmp_path / 'csv' / 'job'}/Train_")
    assert log.failure[1] == "set another output_path in the DeepSpeed JSON's monitor section"  # no disk full
    log.step(2, 8, result, engine, seconds=0.5, lr=1e-3)  # the run's own records: nothing written, no raise
    assert log.failure[0].startswith(f"cannot write a DeepSpeed monitor's file {tmp_path / 'csv' / 'job'}/Train_")


def test_a_resume_continues_the_csv_files_with_one_header_and_without_the_steps_it_redoes(tmp_path, monkeypatch):
    """DeepSpeed's csvMonitor writes a header the first time a process writes a file: a resumed run's files got
    a second one mid-file, after the rows of the steps the stopped run took past its checkpoint (which the
    resume redoes, so each such step had two rows). RunLog.resumed keeps the rows up to the checkpoint's
    consumed samples (a torn last row of a killed run too goes) and DeepSpeed writes no second header."""
    from test_run_log import rank_0_run_log

    monkeypatch.setattr(csv_monitor.dist, "get_rank", lambda: 0)
    config = SimpleNamespace(enabled=True, output_path=str(tmp_path / "csv"), job_name="job")
    first = csv_monitor.csvMonitor(config)
    first.write_events([("Train/Samples/loss", 9.0 - step, step) for step in (4, 8, 12)])
    loss_file = tmp_path / "csv" / "job" / "Train_Samples_loss.csv"
    with loss_file.open("a") as file:
        file.write("16,1.2")  # killed mid-row
    log = rank_0_run_log(monkeypatch, tmp_path / "log", steps=4, interval=1)
    log.monitor = SimpleNamespace(csv_monitor=csv_monitor.csvMonitor(config), write_events=lambda events: None)
    log.resumed(iteration=2, consumed=8)  # the checkpoint at 8 samples: the rows at 12 and 16 are redone
    log.monitor.csv_monitor.write_events([("Train/Samples/loss", 0.5, 12)])
    rows = list(csv.reader(loss_file.open()))
    assert rows == [["step", "loss"], ["4", "5.0"], ["8", "1.0"], ["12", "0.5"]], rows
    assert log.failure is None and not list((tmp_path / "csv" / "job").glob("*.partial"))


def test_a_home_path_in_the_json_is_expanded_for_deepspeed_not_made_a_folder_named_tilde(tmp_path, monkeypatch):
    """DeepSpeed expands no ~ in its path values: the run wrote into a folder named "~" in the current one. The JSON
    the trainer hands DeepSpeed (and checks the folders of at start-up) has it expanded, as a path flag's; the
    user's file stays as written."""
    from megatron.arguments import build_parser
    from megatron.training import deepspeed_settings

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    written = {"csv_monitor": {"enabled": True, "output_path": "~/csv", "job_name": "j"},
               "flops_profiler": {"enabled": True, "output_file": "~/flops.txt"}}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(written))
    ds = deepspeed_settings(build_parser().parse_args(["--deepspeed", "--deepspeed_config", str(path)]), cuda=False)
    assert ds["csv_monitor"]["output_path"] == str(tmp_path / "home" / "csv")
    assert ds["flops_profiler"]["output_file"] == str(tmp_path / "home" / "flops.txt")
    assert monitors.output_folder(ds, "csv_monitor") == str(tmp_path / "home" / "csv" / "j")
    (tmp_path / "home").write_text("a file where the home folder should be")
    problem, _ = monitors.monitor_problem(ds, str(path))  # the start-up check looks where DeepSpeed will write
    assert str(tmp_path / "home") in problem and "~" not in problem, problem
    assert json.loads(path.read_text()) == written and not (tmp_path / "~").exists()


def test_a_new_run_is_warned_of_chart_folders_holding_another_runs_files(tmp_path):
    """A new run given the --tensorboard-dir or the monitor folder (a shared JSON's fixed job_name) of another
    run mixed its points into that run's charts without a word; an empty or missing folder, or a monitor not
    enabled, says nothing (a resume is not asked: check_log_dirs passes resumes)."""
    ds = {"csv_monitor": {"enabled": True, "output_path": str(tmp_path / "csv"), "job_name": "job"},
          "tensorboard": {"enabled": False, "output_path": str(tmp_path / "dstb")}}
    (tmp_path / "tb").mkdir()
    assert monitors.reused_folders_warning(str(tmp_path / "tb"), ds) is None
    assert monitors.reused_folders_warning(None, {}) is None
    (tmp_path / "tb" / "events.out.tfevents.1.host").write_bytes(b"")
    (tmp_path / "csv" / "job").mkdir(parents=True)
    (tmp_path / "csv" / "job" / "Train_Samples_loss.csv").write_text("step,loss\n4,2.0\n")
    (tmp_path / "dstb" / "DeepSpeedJobName").mkdir(parents=True)
    (tmp_path / "dstb" / "DeepSpeedJobName" / "events.out.tfevents.1.host").write_bytes(b"")
    assert monitors.reused_folders_warning(str(tmp_path / "tb"), ds) == (
        f"warning: --tensorboard-dir {tmp_path / 'tb'} and the csv_monitor folder (output_path/job_name) "
        f"{tmp_path / 'csv' / 'job'} already hold another run's files: this new run's points go beside them (one "
        "chart, two runs' values at the same steps); pass new folders (or another job_name) to keep the runs apart")
    assert monitors.reused_folders_warning(None, ds).startswith(f"warning: the csv_monitor folder (output_path/"
                                                                f"job_name) {tmp_path / 'csv' / 'job'} already holds")

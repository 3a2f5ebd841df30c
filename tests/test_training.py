"""The entry point: --help, a short run that learns, the real launcher (its start-up config line,
plain log lines, TensorBoard scalars), and one-line errors."""
import argparse
import contextlib
import dataclasses
import io
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from megatron import checkpoint, run_log
from megatron.parallel.spawn import free_port, run_on_ranks
from megatron.resume import (describe_batch_change, describe_data_change, describe_sample_change, resume_schedule,
                            run_length)
from megatron.run_data import NO_EVALUATION, data_warnings, small_eval_splits, with_eval_passes
from megatron.schedule import Schedule
from megatron.loss_watch import LossWatch
from megatron.training import main, nothing_to_train, train_samples_note

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
TINY = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "128",
        "--max-position-embeddings", "128", "--attention-dropout", "0", "--hidden-dropout", "0",
        "--micro-batch-size", "4", "--lr", "1e-3", "--lr-warmup-fraction", "0.1"]


def single_rank_env() -> dict:
    return {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port())}


def run_entry_point(*argv, timeout=240) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, str(ROOT / "pretrain_bert.py"), *argv], cwd=ROOT, env=single_rank_env(),
                          capture_output=True, text=True, timeout=timeout)


def test_help_explains_the_flags():
    result = subprocess.run([PYTHON, str(ROOT / "pretrain_bert.py"), "--help"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0
    for flag in ("--seq-length", "--sequence-parallel-size", "--pipeline-model-parallel-size", "--linformer-k",
                 "--bigbird", "--block-size", "--checkpoint-activations", "--deepspeed_config", "--data-path",
                 "--lr-decay-style", "--save-interval", "--eval-iters", "--tensorboard-dir", "--num-workers"):
        assert flag in result.stdout, flag
    assert "the next micro-batches while a step runs (default: 2 with CUDA, 0 without" in " ".join(result.stdout.split())


@pytest.mark.parametrize("argv, cuda, workers", [([], True, 2), ([], False, 0), (["--num-workers", "3"], False, 3),
                                                 (["--num-workers", "0"], True, 0)])
def test_data_workers_default_to_2_with_cuda_and_0_without(monkeypatch, argv, cuda, workers):
    from megatron.arguments import build_parser
    from megatron.run_data import data_workers

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert data_workers(build_parser().parse_args(argv)) == workers


def hard_defaults_not_in_help(parser: argparse.ArgumentParser) -> list:
    """The flags whose argparse default applies when they are not given but whose help does not say
    it ("default X", "default: X" or "default, X")."""
    missing = []
    for action in parser._actions:
        if not action.option_strings or action.default in (None, False, argparse.SUPPRESS):
            continue
        default = " ".join(action.default) if isinstance(action.default, list) else str(action.default)
        if not re.search(rf"default[:,]? {re.escape(default)}\b", action.help or ""):
            missing.append(action.option_strings[0])
    return missing


def test_help_states_every_default_argparse_applies(monkeypatch):
    """pretrain_bert.py's and preprocess_data.py's --help name the value a flag takes when it is not
    given, where argparse (not the JSON or BertConfig) supplies it."""
    from megatron.arguments import add_model_and_parallel_args, add_training_args

    trainer = add_training_args(add_model_and_parallel_args(argparse.ArgumentParser()))
    assert hard_defaults_not_in_help(trainer) == []
    parsers = []

    def keep_parser(parser, argv=None, namespace=None):
        parsers.append(parser)
        raise SystemExit(0)

    monkeypatch.syspath_prepend(str(ROOT / "tools"))
    import preprocess_data

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", keep_parser)
    with pytest.raises(SystemExit):
        preprocess_data.parse_args([])
    assert hard_defaults_not_in_help(parsers[0]) == []


def main_then_group_state(argv) -> tuple:
    """main's exit code, and whether the process group is still open after it."""
    import torch.distributed as dist

    return main(argv), dist.is_initialized()


def test_two_ranks_sequence_parallel_loss_falls(tmp_path, data_dir):
    """50 steps at SP=2 (ring) in-process on the default data: the logged loss falls, a
    validation and a test loss are logged, the checkpoint and the plot are written."""
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"sequence_parallel": {"size": 2, "attention": "ring"},
                                  "zero_optimization": {"stage": 1}}))
    argv = [*TINY, "--deepspeed", "--deepspeed_config", str(config), "--train-iters", "50", "--log-interval", "10",
            "--eval-interval", "25", "--eval-iters", "2", "--default-data-dir", data_dir,
            "--save", str(tmp_path / "ckpt"), "--log-dir", str(tmp_path / "log")]
    # each rank closes its process group at the end (gloo's threads could otherwise abort it at exit)
    assert run_on_ranks(main_then_group_state, 2, argv, timeout=600) == [(0, False), (0, False)]
    records = [json.loads(line) for line in (tmp_path / "log" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert [r["iteration"] for r in train] == [10, 20, 30, 40, 50]
    assert train[-1]["loss"] < train[0]["loss"] - 0.5, [r["loss"] for r in train]
    assert {r["kind"] for r in records} == {"start", "train", "validation", "test"}
    assert all(r["tokens_per_s"] > 0 and r["peak_memory_mib"] > 0 for r in train)
    assert (tmp_path / "ckpt" / "iter_0000050").is_dir() and (tmp_path / "log" / "loss.png").stat().st_size > 0

    # resumed on one rank (SP=1: the layout-free files) with a longer run, another peak, sample length, masking
    # and weight decay: one line says where it starts, warnings what the schedule, the data and the optimizer
    # do; config.json records the weight decay the optimizer keeps; the log goes on in metrics.jsonl. It asks
    # for no evaluation, Megatron's way (--eval-iters 0): no test loss at its end, no held-out data built
    resume = [*TINY, "--deepspeed", "--deepspeed_config", str(config), "--sequence-parallel-size", "1",
              "--load", str(tmp_path / "ckpt"), "--save", str(tmp_path / "ckpt"), "--train-iters", "54",
              "--lr", "2e-3", "--log-interval", "2", "--eval-interval", "1", "--eval-iters", "0",
              "--default-data-dir", data_dir, "--log-dir", str(tmp_path / "log"), "--seq-length", "96",
              "--split", "90,5,5", "--seed", "7", "--mask-prob", "0.2", "--weight-decay", "0.05", "--keep-last", "1",
              "--override-data-settings"]
    result = run_entry_point(*resume)
    assert result.returncode == 0, result.stderr[-3000:]
    ckpt = tmp_path / "ckpt" / "iter_0000050"
    assert f"resuming from {ckpt} iteration 50, consumed samples 200" in result.stdout.splitlines()
    # --keep-last 1: the save that made room is logged, then what it removed
    saves = [line.split(" in ")[0] for line in result.stdout.splitlines() if line.startswith(("saved", "removed"))]
    assert saves == [f"saved checkpoint {tmp_path / 'ckpt' / 'iter_0000054'}",
                     f"removed checkpoint iter_0000050 of {tmp_path / 'ckpt'} (--keep-last 1)"], saves
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: resuming with")]
    assert len(warnings) == 4, result.stderr[-3000:]
    assert ("--train-iters 54 (the checkpoint's: 50), --lr 0.002 (the checkpoint's: 0.001)" in warnings[0]
            and "the checkpoint's peak 1.000e-03" in warnings[0] and "at iteration 54" in warnings[0]), warnings[0]
    # the first resumed step already at this run's rate (the checkpoint left 0: its schedule had ended)
    from megatron.arguments import build_parser

    args = build_parser().parse_args(resume)
    rule = Schedule(train_iters=54, lr=2e-3, min_lr=0.0, lr_decay_style=args.lr_decay_style,
                    lr_warmup_fraction=args.lr_warmup_fraction).factor(1e-3)
    assert f"lr {1e-3 * rule(50):.3e} for iteration 51, then {1e-3 * rule(51):.3e} at iteration 52" in warnings[0]
    assert rule(50) > 0
    # another sample length: the consumed count points into another map, said once
    assert warnings[1].startswith("warning: resuming with --seq-length 96 (the checkpoint's: 128): samples are cut "
                                  "differently now, and the data goes on at sample 200 of the new index map")
    # another split and seed (the data the checkpoint records): said once, with what a split change does
    assert warnings[2].startswith("warning: resuming with --split 90,5,5 (the checkpoint's: 969,30,1), --seed 7 (the "
                                  "checkpoint's: 1234; it shuffles and masks the samples), --mask-prob 0.2 (the "
                                  "checkpoint's: 0.15): the data goes on at sample 200 of another index map"), warnings[2]
    assert "validation and test, so the held-out losses may include text the run trained on" in warnings[2]
    assert "; other tokens are masked from here on, so the objective is not the one the checkpoint" in warnings[2]
    assert warnings[3].startswith("warning: resuming with --weight-decay 0.05 (the checkpoint's: 0.01): the optimizer "
                                  "goes on with the checkpoint's settings, which config.json records"), warnings[3]
    logged = json.loads((tmp_path / "log" / "config.json").read_text())
    recorded = logged["ds_config"]["optimizer"]["params"]
    assert recorded["weight_decay"] == 0.01, recorded
    # the peak it trained at is the checkpoint's, not --lr: config.json and the next checkpoint say so, and a
    # later resume compares with it
    saved = checkpoint.run_state(str(tmp_path / "ckpt"), "iter_0000054")["schedule"]
    assert recorded["lr"] == logged["schedule"]["lr"] == saved["lr"] == 1e-3, (recorded, logged["schedule"], saved)
    records = run_log.read_metrics(tmp_path / "log" / "metrics.jsonl")
    starts = [r for r in records if r["kind"] == "start"]
    assert [r["iteration"] for r in starts] == [0, 50] and starts[1]["resumed_from"] == str(ckpt)
    assert [r["iteration"] for r in records if r["kind"] == "train"] == [10, 20, 30, 40, 50, 52, 54]
    assert [r["iteration"] for r in records if r["kind"] in ("validation", "test")] == [25, 50, 50]
    assert NO_EVALUATION in result.stdout.splitlines() and "valid data:" not in result.stdout, result.stdout[-3000:]
    assert len({r["run"] for r in records}) == 2

    # a new run into the same --save is refused from the files, before DeepSpeed starts
    fresh = [flag for flag in resume[:resume.index("--load")] + resume[resume.index("--load") + 2:]
             if flag != "--override-data-settings"]
    result = run_entry_point(*fresh)
    assert result.returncode == 2 and "resolved config" not in result.stdout, result.stdout[-2000:]
    assert (f"pretrain_bert.py: error: --save {tmp_path / 'ckpt'} holds checkpoint iter_0000054, ahead of this "
            "run's start at iteration 0") in result.stderr


@pytest.fixture(scope="module")
def launched(tmp_path_factory, data_dir) -> SimpleNamespace:
    """Two steps at SP=2 through the real `deepspeed` launcher (2 CPU ranks), stdout a pipe,
    with a validation run each step and TensorBoard scalars, index maps in a --data-cache-path and
    `--load` = `--save` (a requeued job's command; empty at first): run once, read by the tests below."""
    out = tmp_path_factory.mktemp("launched")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    port = free_port()
    command = [str(Path(PYTHON).parent / "deepspeed"), "--num_gpus", "2", "--master_port", str(port),
               str(ROOT / "pretrain_bert.py"), *TINY, "--deepspeed", "--deepspeed_config",
               str(ROOT / "ds_configs" / "ring_sp2.json"), "--train-iters", "2", "--log-interval", "1",
               "--eval-interval", "1", "--eval-iters", "1", "--default-data-dir", data_dir,
               "--save", str(out / "ckpt"), "--load", str(out / "ckpt"), "--data-cache-path", str(out / "cache"),
               "--log-dir", str(out / "log"), "--tensorboard-dir", str(out / "tb")]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = [json.loads(line) for line in (out / "log" / "metrics.jsonl").read_text().splitlines()]
    return SimpleNamespace(stdout=result.stdout, stderr=result.stderr, records=records, tensorboard_dir=out / "tb",
                           checkpoints=out / "ckpt", log_dir=out / "log", vocab_file=Path(data_dir) / "vocab.txt",
                           cache=out / "cache", port=port, command=command)


def test_the_launched_sequence_parallel_run_is_the_single_process_run(launched, tmp_path):
    """End to end on the default corpus (the in-process layout tests use hand-made batches): the same
    command as one process at SP = 1 logs the same training, validation and test losses and gradient
    norms, and saves the same weights, to fp32 rounding."""
    from megatron.checkpoint_weights import bert_state_from_checkpoint
    from test_sequence_parallel_bert import REL_TOL, max_relative_diff

    argv = launched.command[launched.command.index(str(ROOT / "pretrain_bert.py")) + 1:]
    paths = {"--save": tmp_path / "ckpt", "--load": tmp_path / "ckpt", "--log-dir": tmp_path / "log",
             "--tensorboard-dir": tmp_path / "tb", "--data-cache-path": tmp_path / "cache"}
    argv = [str(paths.get(argv[i - 1], value)) if i else value for i, value in enumerate(argv)]
    result = run_entry_point(*argv, "--sequence-parallel-size", "1")
    assert result.returncode == 0, result.stderr[-3000:]

    def measured(records: list) -> list:  # (kind, iteration, loss, and the gradient norm of a training step)
        return [(r["kind"], r["iteration"], r["loss"], *([r["grad_norm"]] if r["kind"] == "train" else []))
                for r in records if r["kind"] in ("train", "validation", "test")]

    single, launched_measured = measured(run_log.read_metrics(tmp_path / "log" / "metrics.jsonl")), measured(
        launched.records)
    assert [row[:2] for row in single] == [row[:2] for row in launched_measured] and len(single) == 5, single
    for ours, theirs in zip(launched_measured, single):
        assert ours[2:] == pytest.approx(theirs[2:], rel=1e-5), (ours, theirs)
    # the layout tests' measure and bound (Adam's default eps scales rounding in near-zero gradients up)
    sp, one = (bert_state_from_checkpoint(str(folder)) for folder in (launched.checkpoints, tmp_path / "ckpt"))
    assert sp.keys() == one.keys() and max_relative_diff(sp, one, floor=1.0) <= REL_TOL, max_relative_diff(sp, one)


def test_real_launcher_runs_two_steps(launched):
    assert "iteration 2/2" in launched.stdout and "saved checkpoint" in launched.stdout
    assert launched.stdout.splitlines().count("starting from scratch") == 1
    assert "note: dropout" not in launched.stdout  # dropout 0: the SP=2 run is the single-process one


def test_no_shared_memory_left_behind(launched):
    """DeepSpeed's CPU all-reduce buffers (66 MB per rank in /dev/shm) go with the run."""
    left = [name for name in os.listdir("/dev/shm") if name.startswith("deepspeed_allreduce_buffer_")
            and f"_{launched.port}_" in name]
    assert left == []


def test_each_checkpoint_records_the_folders_its_run_logs_into(launched):
    """What a resume into other folders names (run_log.split_logs_warning)."""
    from megatron import checkpoint

    state = checkpoint.run_state(str(launched.checkpoints), checkpoint.latest_tag(str(launched.checkpoints)))
    assert state[checkpoint.LOGS] == {"log_dir": str(launched.log_dir),
                                      "tensorboard_dir": str(launched.tensorboard_dir)}


def test_index_maps_are_read_from_the_data_cache_path(launched):
    used = json.loads((launched.log_dir / "index_maps.json").read_text())["maps"]
    assert len(used) >= 2 and all(Path(path).parent == launched.cache.resolve() for path in used), used
    assert sorted(str(path.resolve()) for path in launched.cache.iterdir()) == sorted(used)
    assert f"index maps in {launched.cache.resolve()}: {len(used)} used by this run" in launched.stdout


def test_resolved_config_is_written_to_the_log_dir_with_one_line_on_screen(launched):
    output = launched.stdout.splitlines()
    lines = [line for line in output if line.startswith("config: ")]
    assert len(lines) == 1, lines
    assert output.index(lines[0]) < min(i for i, line in enumerate(output) if line.startswith("iteration 1/2 |"))
    assert lines[0] == ("config: pipeline 1 x data 1 x sequence 2, ring attention, fp32, ZeRO 1, global batch 4 = "
                        "micro 4 x grad-acc 1 x data 1, 2 layers x hidden 64 x 4 heads, seq 128, pre-LN "
                        f"(resolved: {launched.log_dir / 'config.json'})")
    config = json.loads((launched.log_dir / "config.json").read_text())
    layout = ("sequence_parallel_size", "pipeline_parallel_size", "data_parallel_size", "micro_batch_size",
              "gradient_accumulation_steps", "zero_stage")
    assert [config[key] for key in layout] == [2, 1, 1, 4, 1, 1]
    assert config["model"]["attention"] == "ring" and config["model"]["seq_length"] == 128
    assert config["model"]["num_layers"] == 2 and config["ds_config"]["train_batch_size"] == 4
    # what else decides the run: the schedule and data records a checkpoint keeps, the loader's workers
    from megatron.arguments import build_parser

    defaults = build_parser().parse_args([])
    assert config["schedule"]["train_iters"] == 2 and config["schedule"]["lr_decay_style"] == defaults.lr_decay_style
    assert (config["data"]["seed"], config["data"]["split_flag"]) == (defaults.seed, defaults.split)
    assert config["num_workers"] == 0  # the default without CUDA
    assert not any(line.startswith("resolved config") for line in output)  # no JSON dump on screen


def test_no_deepspeed_noise_on_screen(launched):
    """The ranks name the CPU accelerator themselves and filter torch's FutureWarning about the
    collectives DeepSpeed still calls (megatron/quiet.py)."""
    output = launched.stdout + launched.stderr
    # the deepspeed runner and its per-node launch.py (DeepSpeed's processes) warn; the 2 ranks do not
    assert output.count("Setting accelerator to CPU") <= 2
    assert "FutureWarning" not in output and "all_gather" not in output, output[-3000:]


def test_log_lines_are_plain_when_stdout_is_a_pipe(launched):
    assert "\r" not in launched.stdout
    lines = launched.stdout.splitlines()
    for iteration in (1, 2):
        assert sum(line.startswith(f"iteration {iteration}/2 | consumed samples {4 * iteration} | lr ")
                   for line in lines) == 1, launched.stdout[-3000:]


def test_logged_lr_is_the_rate_the_logged_step_used(launched):
    """DeepSpeed steps the scheduler after each step: the record of iteration i holds the rate of
    step i - 1 of the schedule (TINY: --lr 1e-3, 2 steps, no warm-up step: 1e-3 then 5e-4), not the next."""
    flags = dict(zip(TINY[::2], TINY[1::2]))
    schedule = Schedule(train_iters=2, lr=float(flags["--lr"]), min_lr=0.0, lr_decay_style="linear",
                        lr_warmup_fraction=float(flags["--lr-warmup-fraction"]))
    factor = schedule.factor(schedule.lr)
    logged = [record["lr"] for record in launched.records if record["kind"] == "train"]
    assert logged == pytest.approx([float(flags["--lr"]) * factor(step) for step in range(2)], rel=1e-12)


def test_warm_up_rises_from_the_first_step_to_the_peak_then_decays():
    """Step 0 (iteration 1) already trains, at 1 / warm-up steps of the peak (not at rate 0); the peak
    is reached at the last warm-up step, then the decay runs to min_lr at --train-iters."""
    factor = Schedule(train_iters=10, lr=1.0, min_lr=0.0, lr_decay_style="linear", lr_warmup_fraction=0.2).factor(1.0)
    assert [factor(step) for step in range(10)] == pytest.approx([0.5, 1.0, 1.0, 0.875, 0.75, 0.625, 0.5, 0.375,
                                                                  0.25, 0.125])


def test_tensorboard_scalars_are_the_logged_metrics(launched):
    """Rank 0 writes one event file; each metric of metrics.jsonl is a scalar `<kind>/<name>` by
    iteration, with the logged value (TensorBoard keeps float32)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert len(list(launched.tensorboard_dir.glob("events.out.tfevents.*"))) == 1
    events = EventAccumulator(str(launched.tensorboard_dir), size_guidance={"scalars": 0})
    events.Reload()
    tags = set(events.Tags()["scalars"])
    train = {f"train/{name}" for name in ("loss", "mlm_loss", "sop_loss", "lr", "grad_norm", "tokens_per_s",
                                          "tflops_per_rank", "real_tflops_per_rank", "peak_memory_mib", "consumed_samples", "real_token_share",
                                          "segments_per_sample", "real_tokens_per_s", "mlm_accuracy")}
    assert tags == train | {"validation/loss", "test/loss"}  # fp32 run: no train/loss_scale
    assert {r["kind"] for r in launched.records} == {"start", "train", "validation", "test"}
    for tag in sorted(tags):
        kind, name = tag.split("/")
        logged = [(r["iteration"], float(np.float32(r[name]))) for r in launched.records if r["kind"] == kind]
        assert [(e.step, e.value) for e in events.Scalars(tag)] == logged, tag


@pytest.mark.parametrize("argv,message", [
    (["--deepspeed_config", "missing.json", "--train-iters", "1"],
     "DeepSpeed config missing.json does not exist; pass an existing JSON file"),
    (["--data-path", "corpus_text_sentence", "--train-iters", "1"], "--data-path is given without --vocab-file"),
    (["--data-path", "no/such/prefix", "--vocab-file", "VOCAB", "--train-iters", "1"], "no/such/prefix"),
    (["--vocab-file", "no/such/vocab.txt", "--train-iters", "1"], "no/such/vocab.txt"),
    (["--sequence-parallel-size", "2", "--train-iters", "1"],
     "--sequence-parallel-size 2 x pipeline 1 does not divide the world size 1; launch 2 processes"),
    ([], "the run length is not set; pass --train-iters N or --train-samples N"),
    (["--attention", "ring", "--attention-dropout", "0.1", "--train-iters", "1"],
     "attention_dropout 0.1 is not supported by ring attention"),
])
def test_bad_input_is_one_line(tmp_path, data_dir, argv, message):
    argv = [a.replace("VOCAB", str(Path(data_dir) / "vocab.txt")) for a in argv]
    # argv comes last: a flag given twice takes its last value
    result = run_entry_point(*TINY, "--default-data-dir", data_dir, "--log-dir", str(tmp_path), *argv)
    errors = [line for line in result.stderr.splitlines() if line.startswith("pretrain_bert.py: error:")]
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(errors) == 1 and message in errors[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr


def test_a_default_run_exports_to_hugging_face(launched, tmp_path):
    """The launched run uses the trainer's default layout (pre-LN, no embedding LayerNorm: HF
    MegatronBert): tools/convert_checkpoint.py to-hf exports its checkpoint into a folder with
    a plain mkdir's permissions (not mkdtemp's 0700) that transformers loads."""
    output = tmp_path / "hf"
    result = subprocess.run([PYTHON, str(ROOT / "tools" / "convert_checkpoint.py"), "to-hf", "--load",
                             str(launched.checkpoints), "--vocab-file", str(launched.vocab_file), "--output",
                             str(output)], capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "MegatronBertForPreTraining" in result.stdout
    umask = os.umask(0)
    os.umask(umask)
    assert output.stat().st_mode & 0o777 == 0o777 & ~umask
    from transformers import MegatronBertForPreTraining

    model = MegatronBertForPreTraining.from_pretrained(output)
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 64


def test_pretrain_default_settings_export():
    """examples_deepspeed/pretrain_default.sh's model flags resolve to an exportable layout."""
    from megatron.arguments import build_parser, config_flags
    from megatron.config import read_ds_config, resolve
    from megatron.hf_modernbert import check_exportable
    from megatron.training import dropout_layout_note

    script = (ROOT / "examples_deepspeed" / "pretrain_default.sh").read_text()
    command = script[script.index("TRAINER=(") + len("TRAINER=("):script.index(' "$@")')]
    command = command.replace('"$save"', "SAVE").replace('"${repo}', '"')  # --save, resumed when run again
    flags = shlex.split(command)
    args = build_parser().parse_args(flags)
    config = resolve({**config_flags(args), "vocab_size": 1000}, read_ds_config(ROOT / args.deepspeed_config), 2)
    model = config.model
    assert (model.seq_length, model.position_embedding_type, model.local_attention_window) == (1024, "rope", 128)
    assert [model.is_local_layer(i) for i in range(model.num_layers)] == [False, True, True]
    assert config.sequence_parallel_size == 2 and config.pack_samples
    assert args.load == args.save == "SAVE"  # run again, it resumes (or says it is complete), not refusing --save
    check_exportable(model)  # as a ModernBertForMaskedLM
    assert dropout_layout_note(config) is None  # dropout 0: the SP=2 run is the single-process one, no note
    # the folder: runs/default/checkpoints, or a --save among the extra flags (then loaded from there too)
    assert 'save_dir "${repo}runs/default/checkpoints" "$@"' in script and 'save="$SAVE_DIR"' in script
    group = ROOT / "examples_deepspeed" / "launcher_group.sh"
    scan = f'source "{group}"; save_dir runs/default/checkpoints "$@"; echo "$SAVE_DIR"'
    for extra, folder in (([], "runs/default/checkpoints"), (["--train-iters", "5", "--save", "/x y"], "/x y"),
                          (["--save=/z"], "/z")):
        found = subprocess.run(["bash", "-c", scan, "pretrain_default.sh", *extra], capture_output=True, text=True)
        assert found.stdout == folder + "\n", found.stderr


def test_a_run_ends_with_a_validation_and_a_rerun_of_its_checkpoint_repeats_it(tmp_path, data_dir):
    """Megatron's pretrain ends with validation and test: a run whose last step is off --eval-interval
    validates at its end too, and marks its checkpoint as ended (checkpoint.RUN_ENDED). The same command
    again on a checkpoint whose final evaluation never ran (a stop or a lost rank cut it; saved before the
    mark) says nothing to train and evaluates it, reading the same slices, so it logs the run's own losses;
    a reader of the log (read_metrics) keeps one of each. (The rerun of a marked one: the test below.)"""
    argv = [*TINY, "--train-iters", "3", "--eval-interval", "2", "--eval-iters", "1", "--default-data-dir", data_dir,
            "--log-dir", str(tmp_path / "log"), "--save", str(tmp_path / "ck"), "--load", str(tmp_path / "ck")]
    state = tmp_path / "ck" / "iter_0000003" / checkpoint.RUN_STATE
    for _ in range(2):
        result = run_entry_point(*argv)
        assert result.returncode == 0, result.stderr[-3000:]
        ended = json.loads(state.read_text())
        assert ended.pop(checkpoint.RUN_ENDED) is True
        state.write_text(json.dumps(ended))
    assert "nothing to train: the checkpoint is at iteration 3" in result.stdout
    metrics = tmp_path / "log" / "metrics.jsonl"
    held_out = [(r["run"], r["kind"], r["iteration"], r["loss"]) for r in map(json.loads, metrics.read_text().split(
        "\n")[:-1]) if r["kind"] in ("validation", "test")]
    first, again = sorted({run for run, *_ in held_out}, key=[run for run, *_ in held_out].index)
    assert [what[1:3] for what in held_out] == [("validation", 2), ("validation", 3), ("test", 3),
                                                ("validation", 3), ("test", 3)], held_out
    assert [what[0] for what in held_out] == [first] * 3 + [again] * 2
    assert held_out[1][3] == held_out[3][3] and held_out[2][3] == held_out[4][3], held_out
    assert held_out[0][3] != held_out[1][3]  # another step's weights (or another slice): not one number logged twice
    read = [(r["run"], r["kind"], r["iteration"], r["loss"]) for r in run_log.read_metrics(metrics)
            if r["kind"] in ("validation", "test")]
    assert read == [held_out[0], *held_out[3:]], read  # the rerun's evaluation at 3 replaces the first run's


def test_runs_without_a_launcher_as_one_process(tmp_path, data_dir):
    """`python pretrain_bert.py ...` with no RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT: one
    process (world size 1) on a free port, saying so in one line; not DeepSpeed's MPI discovery
    (`No module named 'mpi4py'`)."""
    env = {name: value for name, value in os.environ.items()
           if name not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    argv = [*TINY, "--train-iters", "1", "--eval-iters", "1", "--split", "100,0,0", "--default-data-dir", data_dir,
            "--log-dir", str(tmp_path / "log"), "--save", str(tmp_path / "ck"), "--load", str(tmp_path / "ck")]
    result = subprocess.run([PYTHON, str(ROOT / "pretrain_bert.py"), *argv], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "no launcher: running as one process (world size 1)" in result.stdout
    assert "mpi4py" not in result.stderr and "Traceback" not in result.stderr
    # the same command again (the main job run twice): the run ended at its checkpoint, said in one line, with no
    # resume and no evaluation; a schedule change is not described, as no step runs to take it
    again = subprocess.run([PYTHON, str(ROOT / "pretrain_bert.py"), *argv, "--lr-decay-style", "constant"], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=240)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (f"nothing to train: the run of checkpoint {tmp_path / 'ck' / 'iter_0000001'} is finished already at "
            "iteration 1 of --train-iters 1; pass a larger --train-iters to train on") in again.stdout.splitlines()
    assert "resuming from" not in again.stdout and "config:" not in again.stdout, again.stdout
    assert "warning:" not in again.stderr, again.stderr
    assert sorted(path.name for path in (tmp_path / "ck").iterdir()) == ["iter_0000001", "latest"]
    assert "config: pipeline 1 x data 1 x sequence 1" in result.stdout
    # resumed on for a step without --save and with other dropout: the resume's lines, once, after the load
    unsaved = [*argv[:argv.index("--save")], "--load", str(tmp_path / "ck"), "--train-iters", "2", "--hidden-dropout",
               "0.2"]
    on = subprocess.run([PYTHON, str(ROOT / "pretrain_bert.py"), *unsaved], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=240)
    assert on.returncode == 0, on.stderr[-3000:]
    lines = on.stdout.splitlines()
    note = (f"note: no --save: the 1 step this run trains after iteration 1 is not kept; pass --save {tmp_path / 'ck'} "
            "to keep them")
    assert lines.count(note) == 1 and lines.index(note) > next(
        i for i, line in enumerate(lines) if line.startswith("resuming from")), on.stdout[-3000:]
    warnings = [line for line in on.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2 and warnings[1] == (f"warning: --hidden-dropout 0.2 changes hidden_dropout from 0.0, "
                                                  f"which the checkpoint {tmp_path / 'ck'}'s run trained with"), warnings
    assert sorted(path.name for path in (tmp_path / "ck").iterdir()) == ["iter_0000001", "latest"]


@pytest.mark.parametrize("flag, name, message", [
    ("tensorboard_dir", "afile", "--tensorboard-dir {tmp}/afile is a file, not a directory; pass a --tensorboard-dir"),
    ("log_dir", "afile/log", "--log-dir {tmp}/afile/log lies under {tmp}/afile, which is a file, not a directory"),
    # a relative path is named as the user wrote it, the file in the way too (docs/errors.md)
    ("log_dir", "./afile/deeper/log", "--log-dir ./afile/deeper/log lies under afile, which is a file, not a "
                                      "directory; pass a --log-dir directory this user can write"),
])
def test_log_folders_are_checked_before_any_work(tmp_path, monkeypatch, flag, name, message):
    """Rank 0 checks both folders (RunLog writes them) and every rank gets its answer; the probe
    leaves nothing, not even the log folder it made."""
    from megatron import training

    (tmp_path / "afile").write_text("x")
    monkeypatch.setattr(training.dist, "get_rank", lambda: 0)
    monkeypatch.setattr(training.dist, "broadcast_object_list", lambda found, src: None)  # one rank
    monkeypatch.chdir(tmp_path)
    args = SimpleNamespace(log_dir=str(tmp_path / "log"), tensorboard_dir=None, deepspeed_config=None)
    setattr(args, flag, name if name.startswith("./") else str(tmp_path / name))
    with pytest.raises(training.ConfigError) as error:
        training.check_log_dirs(args, {})
    assert str(error.value).startswith(message.format(tmp=tmp_path))
    assert [path.name for path in tmp_path.iterdir()] == ["afile"]


def test_the_log_dirs_records_are_checked_at_start_up(tmp_path, monkeypatch, capsys):
    """check_log_dirs refuses a metrics.jsonl of no run before any step, and warns of another run's logs."""
    from megatron import locks, training
    from test_run_log import logged_run

    monkeypatch.setattr(training.dist, "get_rank", lambda: 0)
    monkeypatch.setattr(training.dist, "broadcast_object_list", lambda found, src: None)  # one rank
    args = SimpleNamespace(log_dir=str(tmp_path / "log"), tensorboard_dir=None, deepspeed_config=None,
                           save=str(tmp_path / "mine"), load=None, finetune=False)
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "metrics.jsonl").write_text("not json\n")
    with pytest.raises(training.ConfigError, match=f"^--log-dir {tmp_path / 'log'} holds a metrics.jsonl that is not"):
        training.check_log_dirs(args, {})
    (tmp_path / "log" / "metrics.jsonl").unlink()
    logged_run(tmp_path / "log", str(tmp_path / "theirs"))
    try:
        training.check_log_dirs(args, {})
    finally:
        locks.release_lock(locks.LOG_LOCK)
    assert capsys.readouterr().err.startswith(f"warning: --log-dir {tmp_path / 'log'} holds the logs of another run")


def test_data_flags_that_leave_data_out_are_named():
    args = SimpleNamespace(split="100,0,0", eval_interval=10, eval_iters=10)
    blend = ["0.5", "corpus_a", "0", "corpus_b"]
    assert data_warnings(args, blend, valid_set=None, train_iters=20) == [
        "--data-path weight 0 for corpus_b: none of its samples are read",
        "--split 100,0,0 leaves no validation documents: the evaluation every --eval-interval 10 steps is skipped; "
        "pass a --split with a validation share, e.g. --split 949,50,1"]
    assert data_warnings(args, ["corpus_a"], valid_set=None, train_iters=9) == []  # no evaluation asked for
    small = SimpleNamespace(split="969,30,1", eval_interval=10, eval_iters=10)  # a share that a small corpus rounds to none
    assert data_warnings(small, ["corpus_a"], valid_set=None, train_iters=20)[0].endswith(
        "skipped; pass a larger validation share of --split, or a larger corpus")
    empty_part = SimpleNamespace(split="100,,0", eval_interval=10, eval_iters=10)  # read as the data layer reads it: 100, 0
    assert data_warnings(empty_part, ["corpus_a"], valid_set=None, train_iters=20)[0].endswith(
        "skipped; pass a --split with a validation share, e.g. --split 949,50,1")
    assert data_warnings(args, ["corpus_a"], valid_set=object(), train_iters=20) == []
    # a test share a small corpus rounds to no document: no test loss at the end, said at the start
    assert data_warnings(small, ["corpus_a"], valid_set=object(), train_iters=20, test_set=None) == [
        "--split 969,30,1 leaves no test documents: there is no test loss at the end; pass a larger test share of "
        "--split, or a larger corpus (a test share of 0 asks for none)"]
    for no_test_share in ("98,2,0", "98,2"):
        asked_none = SimpleNamespace(split=no_test_share, eval_interval=10, eval_iters=10)
        assert data_warnings(asked_none, ["corpus_a"], valid_set=object(), train_iters=20, test_set=None) == []
    # no evaluation asked for (--eval-iters 0): no split lacks documents it was asked for
    no_evaluation = SimpleNamespace(split="969,30,1", eval_interval=10, eval_iters=0)
    assert data_warnings(no_evaluation, ["corpus_a"], valid_set=None, train_iters=20, test_set=None) == []


def test_the_data_lines_count_a_splits_distinct_samples():
    """`test data: 201003 samples` counted the index map, while the evaluation warning said 3 samples: the line
    counts one pass over the split, and the map's repeats where there are any."""
    from megatron.data.bert_dataset import TokenStats

    repeated = TokenStats(201003, 128, False, 1.0, 0.92, epoch_samples=3)
    assert repeated.describe("test") == ("test data: 3 samples of 128 tokens (its index map repeats them to 201003: "
                                         "67001 passes), 1.0 segments per sample, real-token share 0.92")
    assert "(its index map repeats them to 6: 2.0 passes)" in TokenStats(6, 128, False, 1.0, 1.0, 3).describe("test")
    assert TokenStats(77, 128, True, 2.0, 0.5, epoch_samples=77).describe("valid") == (
        "valid data: 77 packed samples of 128 tokens, 2.0 segments per sample, real-token share 0.50")


def test_evaluation_splits_smaller_than_a_micro_batch_are_named_with_their_tokens(tmp_path):
    """A packed run at a long --seq-length on a split of a few documents: its samples repeat the same few
    tokens among padding (one epoch after another), so its loss is measured on them alone: one warning
    line counts them (the epoch-0 segments' tokens, as the samples built from them hold)."""
    from megatron.data.bert_dataset import build_train_valid_test_datasets, split_tokens, token_stats
    from test_data_bert import write_corpus, write_vocab

    prefix, tokenizer = write_corpus(tmp_path / "corpus", num_docs=100), write_vocab(tmp_path)
    _, valid, test = build_train_valid_test_datasets([prefix], "mmap", "96,3,1", (8, 40, 8), 512, tokenizer,
                                                     pack_samples=True, max_segment_length=64)
    epochs = valid.segments.mapping[:, 3]
    first_epoch = [i for i in range(len(valid)) if epochs[valid.segment_indices(i)[0]] == 0]
    assert 0 < len(first_epoch) < len(valid)  # the split repeats
    built = sum(int((valid[i]["segment_ids"] > 0).sum()) for i in first_epoch)
    assert split_tokens(valid) == built
    splits = {name: (token_stats(dataset), split_tokens(dataset)) for name, dataset in (("valid", valid),
                                                                                       ("test", test))}
    line = small_eval_splits(splits, micro_batch=4)
    assert line.startswith("evaluation data smaller than one micro-batch of samples (4 x 512 tokens): valid "
                           f"{built} tokens in {len(first_epoch)} sample{'s' * (len(first_epoch) > 1)} (repeated to {len(valid)}; ") and (
                               f"test {split_tokens(test)} tokens" in line)  # the samples it holds, not its repeats
    assert line.endswith("each loss is measured on these few tokens, repeated; give the split more documents (a "
                         "larger share of --split, or a larger corpus) or pass a shorter --seq-length")
    one_sample = dataclasses.replace(splits["valid"][0], seq_length=built)  # a split that fills one sample
    assert small_eval_splits({"valid": (one_sample, built)}, micro_batch=1) is None
    assert small_eval_splits({"valid": (one_sample, built)}, micro_batch=2) is not None
    assert small_eval_splits({}, micro_batch=4) is None


def test_an_evaluation_that_reads_its_split_several_times_says_how_many_passes(tmp_path):
    """--eval-iters x global batch beyond a split's samples reads the same documents again and again
    (re-masked): the warning counts the passes over the samples of one pass, packed or not, and
    extends the small-split line where there is one."""
    from megatron.data.bert_dataset import build_train_valid_test_datasets, token_stats
    from test_data_bert import write_corpus, write_vocab

    prefix, tokenizer = write_corpus(tmp_path / "corpus", num_docs=100), write_vocab(tmp_path)
    for options in ({}, {"pack_samples": True, "max_segment_length": 32}):
        _, valid, test = build_train_valid_test_datasets([prefix], "mmap", "50,48,2", (8, 400, 400), 64, tokenizer,
                                                         **options)
        stats = {"valid": token_stats(valid), "test": token_stats(test)}
        unique = (sum(valid.segments.mapping[valid.segment_indices(i)[0], 3] == 0 for i in range(len(valid)))
                  if options else int((valid.mapping[:, 3] == 0).sum()))  # the samples of the first epoch
        assert stats["valid"].epoch_samples == unique
        assert 0 < unique < 400 and stats["test"].epoch_samples < 40
        line = with_eval_passes(None, stats, 400)
        assert re.fullmatch(rf"each evaluation reads 400 samples \(--eval-iters x global batch\): valid "
                            rf"{400 / unique:.1f} passes over its {unique} samples, test \d+ passes over its "
                            rf"{stats['test'].epoch_samples} samples \(the same documents, masked anew\); give the "
                            r"split more documents .* or pass a smaller --eval-iters", line), line
        assert with_eval_passes("small", stats, 400).startswith("small; each evaluation reads 400 samples")
        assert with_eval_passes("small", stats, 2) == "small" and with_eval_passes(None, stats, 2) is None
        twice = 2 * stats["test"].epoch_samples  # read twice: no line; once more: named
        assert with_eval_passes(None, {"test": stats["test"]}, twice) is None
        assert "test 3.0 passes over its" in with_eval_passes(None, {"test": stats["test"]}, twice * 3 // 2)


def test_a_blended_split_counts_the_passes_over_its_most_read_prefix(tmp_path):
    """A blend's prefixes are read in their weights' shares: a small prefix of a large weight repeats
    more often than the blend's sum of samples says, which kept the warning silent (1100 samples, 300 read:
    no line, though 270 of them came from a prefix of 100)."""
    from megatron.data.bert_dataset import TokenStats, build_train_valid_test_datasets, token_stats
    from test_data_bert import write_corpus, write_vocab

    blend = TokenStats(300, 64, False, 1.0, 1.0, 1100, ((0.9, 100), (0.1, 1000)))
    assert with_eval_passes(None, {"valid": blend}, 300).startswith(
        "each evaluation reads 300 samples (--eval-iters x global batch): valid 2.7 passes over one prefix's 100 "
        "samples (the same documents")
    assert with_eval_passes(None, {"valid": blend}, 200) is None  # 1.8 passes
    tokenizer = write_vocab(tmp_path)
    prefixes = [str(write_corpus(tmp_path / name, num_docs=num_docs)) for name, num_docs in (("a", 100), ("b", 30))]
    _, valid, _ = build_train_valid_test_datasets(["0.2", prefixes[0], "0.8", prefixes[1]], "mmap", "50,48,2",
                                                  (8, 400, 40), 64, tokenizer)
    stats = token_stats(valid)
    assert [epoch for _, epoch in stats.prefix_epochs] == [part.epoch_samples for part in
                                                          map(token_stats, valid.datasets)]
    assert sum(share for share, _ in stats.prefix_epochs) == pytest.approx(1.0)
    assert stats.prefix_epochs[1][0] > 0.7


def test_a_resume_with_another_peak_decays_to_min_lr():
    """The checkpoint's peak stays (the scheduler state holds it); --min-lr is still where the decay
    ends, and the warning states the rates the run then uses."""
    schedule = Schedule(train_iters=10, lr=2e-3, min_lr=1e-4, lr_decay_style="linear", lr_warmup_fraction=0.0)
    first = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    scheduler = schedule.lambda_lr(first)
    for _ in range(5):
        first.step()
        scheduler.step()
    resumed = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2e-3)  # --lr 2e-3 on resume
    engine = SimpleNamespace(lr_scheduler=schedule.lambda_lr(resumed),
                             get_lr=lambda: [group["lr"] for group in resumed.param_groups])
    engine.lr_scheduler.load_state_dict(scheduler.state_dict())
    warning = resume_schedule(engine, {**schedule.record(), "lr": 1e-3}, schedule, iteration=5)
    assert "lr 5.500e-04 for iteration 6, then 4.600e-04 at iteration 7, ending at 1.900e-04 at iteration 10" in warning
    assert warning.endswith("to change the peak, pass --finetune and another --save to start a new run from the "
                            "checkpoint's weights with a fresh optimizer and schedule"), warning
    rates = [resumed.param_groups[0]["lr"]]
    for _ in range(4):
        resumed.step()
        engine.lr_scheduler.step()
        rates.append(resumed.param_groups[0]["lr"])
    assert rates == pytest.approx([5.5e-4, 4.6e-4, 3.7e-4, 2.8e-4, 1.9e-4])


def test_a_resume_names_the_peak_as_it_was_given_and_says_a_last_step_once(tmp_path):
    """The JSON's optimizer.params.lr (no --lr) is named as the JSON key; a run two steps from its end names
    the rate of each once (no "ending at" the step just named)."""
    from megatron.resume import peak_given

    json_file = tmp_path / "ds.json"
    json_file.write_text(json.dumps({"optimizer": {"type": "AdamW", "params": {"lr": 3e-4}}}))
    assert peak_given(SimpleNamespace(lr=None, deepspeed_config=str(json_file))) == "optimizer.params.lr"
    assert peak_given(SimpleNamespace(lr=3e-4, deepspeed_config=str(json_file))) == "--lr"
    assert peak_given(SimpleNamespace(lr=None, deepspeed_config=None)) == "--lr"
    schedule = Schedule(train_iters=10, lr=3e-4, min_lr=0.0, lr_decay_style="linear", lr_warmup_fraction=0.0)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-4)
    engine = SimpleNamespace(lr_scheduler=schedule.lambda_lr(optimizer),
                             get_lr=lambda: [group["lr"] for group in optimizer.param_groups])
    for _ in range(8):
        optimizer.step()
        engine.lr_scheduler.step()
    warning = resume_schedule(engine, {**schedule.record(), "lr": 1e-4, "train_iters": 8}, schedule, iteration=8,
                              peak="optimizer.params.lr")
    assert warning.startswith("warning: resuming with --train-iters 10 (the checkpoint's: 8), optimizer.params.lr "
                              "0.0003 (the checkpoint's: 0.0001): the schedule continues"), warning
    assert "lr 2.000e-05 for iteration 9, then 1.000e-05 at iteration 10; to change the peak" in warning, warning


def test_a_requeued_finetunes_fix_for_another_peak_names_the_folder_it_resumes():
    """`--finetune --load A --save F` requeued with another --lr resumes F (start_plan.requeue_from_weights):
    the fix cannot be "pass --finetune" (given) with --load A (F's weights would be lost)."""
    from megatron.resume import fresh_run_fix

    assert fresh_run_fix(SimpleNamespace(finetune=False), "F") == ("pass --finetune and another --save to start a "
                                                                   "new run from the checkpoint's weights")
    fix = fresh_run_fix(SimpleNamespace(finetune=True), "F")
    assert fix == "pass --load F with --finetune and another --save to start a new run from the checkpoint's weights"
    schedule = Schedule(train_iters=6, lr=1e-3, min_lr=0.0, lr_decay_style="linear", lr_warmup_fraction=0.0)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=5e-4)
    engine = SimpleNamespace(lr_scheduler=schedule.lambda_lr(optimizer),
                             get_lr=lambda: [group["lr"] for group in optimizer.param_groups])
    warning = resume_schedule(engine, {**schedule.record(), "lr": 5e-4}, schedule, iteration=4, fix=fix)
    assert warning.endswith(f"to change the peak, {fix} with a fresh optimizer and schedule"), warning


def test_nothing_to_train_names_the_run_length_flag_given():
    by_samples = SimpleNamespace(train_iters=None, train_samples=8)
    assert nothing_to_train(by_samples, 2, 2) == ("nothing to train: the checkpoint is at iteration 2 of 2 "
                                                  "(--train-samples 8); pass a larger --train-samples to train on")
    by_iters = SimpleNamespace(train_iters=2, train_samples=None)
    assert nothing_to_train(by_iters, 2, 2).endswith("of --train-iters 2; pass a larger --train-iters to train on")


def test_a_resume_on_other_data_says_so():
    """The data a checkpoint records is compared by content: a moved copy is the same data."""
    stored = {"data": [[1.0, "0123456789"]], "data_path": ["a/corpus"], "split": [0.969, 0.03, 0.001],
              "split_flag": "969,30,1", "seed": 1234}
    assert describe_data_change(stored, {**stored, "data_path": ["b/corpus"]}, 8) is None
    assert describe_data_change(None, stored, 8) is None  # a checkpoint from before the record
    assert describe_data_change(stored, {**stored, "split_flag": "96.9,3,0.1"}, 8) is None  # the same shares
    thirds = {**stored, "data": [[0.1 / 0.7, "a"], [0.1 / 0.7, "b"], [0.5 / 0.7, "c"]]}  # 0.1 a 0.1 b 0.5 c
    assert describe_data_change(thirds, {**thirds, "data": [[1 / 7, "a"], [1 / 7, "b"], [5 / 7, "c"]]}, 8) is None
    other = describe_data_change(stored, {**stored, "data": [[1.0, "abcdef0123"]], "data_path": ["b/other"]}, 8)
    assert other.startswith("warning: resuming with --data-path b/other (the checkpoint's: a/corpus; other text or "
                            "weights): the data goes on at sample 8 of another index map"), other
    assert "held-out" not in other
    shorter = describe_data_change({**stored, "short_seq_prob": 0.1}, {**stored, "short_seq_prob": 0.0}, 8)
    assert shorter.startswith("warning: resuming with --short-seq-prob 0.0 (the checkpoint's: 0.1; the samples' "
                              "lengths): the data goes on at sample 8 of another index map"), shorter
    assert describe_data_change(stored, {**stored, "short_seq_prob": 0.0}, 8) is None  # recorded since
    reseeded = describe_data_change(stored, {**stored, "seed": 7}, 8)  # another shuffle of the same data
    assert reseeded.startswith("warning: resuming with --seed 7 (the checkpoint's: 1234; it shuffles and masks the "
                               "samples): the data goes on at sample 8 of another index map"), reseeded
    # the masking (recorded since; an older record lacks it): another objective on the same index map
    masked = {**stored, "mask_prob": 0.15, "whole_word_masking": False}
    assert describe_data_change(stored, {**masked, "mask_prob": 0.3}, 8) is None
    assert describe_data_change(masked, {**masked, "mask_prob": 0.3, "whole_word_masking": True}, 8) == (
        "warning: resuming with --mask-prob 0.3 (the checkpoint's: 0.15), --whole-word-masking True (the checkpoint's: "
        "False): other tokens are masked from here on, so the objective is not the one the checkpoint trained on; "
        "keep the checkpoint's settings to continue the same data")



def test_a_resume_on_other_data_is_refused_unless_overridden():
    """A resume on other data settings than its checkpoint's (a --save folder another run left: the launch scripts
    resume their --save) went on with that run's weights, optimizer and schedule on this run's data, with a
    warning only. It is one line now, naming each change and the fixes; --override-data-settings resumes (the
    warning above); a moved copy of the data, and a checkpoint without the record, resume as before."""
    from megatron.errors import ConfigError
    from megatron.resume import refuse_data_change

    stored = {"data": [[1.0, "0123456789"]], "data_path": ["a/corpus"], "split": [0.969, 0.03, 0.001],
              "split_flag": "969,30,1", "seed": 1234}
    refuse_data_change(stored, {**stored, "data_path": ["b/corpus"]}, "ck", override=False)  # the same data
    refuse_data_change(None, stored, "ck", override=False)  # a checkpoint from before the record
    other = {**stored, "data": [[1.0, "abcdef0123"]], "data_path": ["b/other"], "seed": 7}
    refuse_data_change(stored, other, "ck", override=True)
    with pytest.raises(ConfigError) as refused:
        refuse_data_change(stored, other, "ck", override=False)
    assert str(refused.value) == (
        "--load ck holds a checkpoint of a run with other data settings: resuming it with --data-path b/other (the "
        "checkpoint's: a/corpus; other text or weights), --seed 7 (the checkpoint's: 1234; it shuffles and masks the "
        "samples); keep the checkpoint's settings to resume it, pass another --save (and no --load ck) to start a "
        "new run, or pass --override-data-settings to resume it on these")

def test_a_resume_without_save_says_its_steps_are_not_kept():
    """A resume without --save trained on and ended with no checkpoint line and no word."""
    from megatron.resume import unsaved_note

    assert unsaved_note(None, "ck", 2, 4) == ("note: no --save: the 2 steps this run trains after iteration 2 are "
                                              "not kept; pass --save ck to keep them")
    assert unsaved_note(None, "ck", 3, 4).startswith("note: no --save: the 1 step this run trains after iteration 3 is ")
    assert unsaved_note("ck", "ck", 2, 4) is None and unsaved_note(None, "ck", 4, 4) is None


def test_a_resume_with_another_global_batch_says_what_the_steps_read():
    """More ranks or another micro batch changed the samples per step with no word, while --seq-length,
    --split or --lr each got a warning; the schedule counts steps."""
    stored = {"micro_batch_size": 2, "gradient_accumulation_steps": 1, "data_parallel_size": 1}
    assert describe_batch_change(stored, SimpleNamespace(global_batch_size=2), 4, 6) is None
    assert describe_batch_change(stored, SimpleNamespace(global_batch_size=4), 4, 6) == (
        "warning: resuming with global batch 4 (the checkpoint's: 2): the learning-rate schedule counts steps, so its "
        "remaining 2 steps to --train-iters 6 read 8 samples in place of 4 (2x per step, at the same rate); pass "
        "--global-batch-size 2 to keep the batch")
    # the data-parallel ranks count: a checkpoint of 2 ranks of 2 resumed on 1 rank of 4 keeps the batch
    two_ranks = {**stored, "data_parallel_size": 2}
    assert describe_batch_change(two_ranks, SimpleNamespace(global_batch_size=4), 4, 6) is None
    assert describe_batch_change(two_ranks, SimpleNamespace(global_batch_size=2), 4, 6).startswith(
        "warning: resuming with global batch 2 (the checkpoint's: 4)")
    # a run whose length --train-samples gave is named so (resume.run_length), not by --train-iters
    length = run_length(SimpleNamespace(train_iters=None, train_samples=24), 6, 4)
    assert length == "--train-samples 24 (6 steps at global batch 4)"
    assert "remaining 2 steps to --train-samples 24 (6 steps at global batch 4) read 8 samples" in \
        describe_batch_change(stored, SimpleNamespace(global_batch_size=4), 4, 6, length)


def test_a_resume_with_other_packed_segments_says_samples_are_cut_differently():
    """--max-segment-length where both runs pack (else --pack-samples is the change named); a config
    saved before the field is not compared."""
    def config(pack_samples, max_segment_length, seq_length=128):
        return SimpleNamespace(pack_samples=pack_samples, model=SimpleNamespace(
            seq_length=seq_length, max_segment_length=max_segment_length))

    stored = {"pack_samples": True, "model": {"seq_length": 128, "max_segment_length": 128}}
    assert describe_sample_change(stored, config(True, 128), 4) is None
    assert describe_sample_change(stored, config(True, 64), 4).startswith(
        "warning: resuming with --max-segment-length 64 (the checkpoint's: 128): samples are cut differently now, and "
        "the data goes on at sample 4 of the new index map")
    assert "--max-segment-length" not in describe_sample_change(stored, config(False, None), 4)
    assert describe_sample_change({"pack_samples": True, "model": {"seq_length": 128}}, config(True, 64), 4) is None
    # segments of the default length follow --seq-length, the one change named
    longer = describe_sample_change(stored, config(True, 256, seq_length=256), 4)
    assert longer.startswith("warning: resuming with --seq-length 256 (the checkpoint's: 128): samples"), longer


def test_a_resume_that_packs_otherwise_names_no_flag_that_does_not_exist():
    """'resuming with --pack-samples False': the user passed no such flag (there is none)."""
    def config(pack_samples):
        return SimpleNamespace(pack_samples=pack_samples, model=SimpleNamespace(seq_length=128, max_segment_length=128))

    packed = {"pack_samples": True, "model": {"seq_length": 128, "max_segment_length": 128}}
    assert describe_sample_change(packed, config(False), 4).startswith(
        "warning: resuming with no --pack-samples (the checkpoint's run packed samples): samples are cut differently")
    assert describe_sample_change({**packed, "pack_samples": False}, config(True), 4).startswith(
        "warning: resuming with --pack-samples (the checkpoint's run did not pack samples): samples")


def test_a_resume_that_steps_otherwise_on_the_same_samples_says_so():
    """Another gradient clipping, precision or micro-batch split of the same global batch: resumed without a
    word (the clipping, at ZeRO 1/2, not even applied: DeepSpeed's load restored the checkpoint's)."""
    from megatron.resume import describe_step_change

    stored = {"micro_batch_size": 4, "gradient_accumulation_steps": 1, "ds_config": {"gradient_clipping": 1.0}}

    def config(micro=4, accumulation=1, **ds):
        return SimpleNamespace(micro_batch_size=micro, gradient_accumulation_steps=accumulation,
                               ds_config={"gradient_clipping": 1.0, **ds})

    assert describe_step_change(stored, config()) is None
    assert describe_step_change(stored, config(micro=2)) is None  # another global batch: describe_batch_change's
    assert describe_step_change(stored, config(2, 2, gradient_clipping=0.0, bf16={"enabled": True})) == (
        "note: resuming with gradient_clipping 0.0 (the checkpoint's: 1.0; it applies from this step on), bf16 (the "
        "checkpoint's: fp32; the weights go on from its fp32 values), micro-batches of 2 x 2 (the checkpoint's: 4 x 1; "
        "the loss is averaged per micro-batch): the same samples at the same rate, but the steps are no longer "
        "bit-exact with the checkpoint's run going on")


def test_a_checkpoint_older_than_the_data_record_says_what_is_not_compared():
    from megatron.resume import unrecorded_note

    assert unrecorded_note("ck", None).startswith(
        "note: ck was written by an earlier version of this trainer, which did not record the data it read: a change "
        "of --data-path, --split, --seed, --short-seq-prob or the masking is not checked on this resume; and if it "
        "was written before index maps were shuffled per epoch")
    record = {"data": [], "split": [1.0], "seed": 1234, "mask_prob": 0.15, "whole_word_masking": False}
    assert unrecorded_note("ck", record) == (
        "note: ck was written by an earlier version of this trainer, which did not record --short-seq-prob: a change "
        "of it is not checked on this resume")
    assert unrecorded_note("ck", {**record, "short_seq_prob": 0.1}) is None


def test_a_resume_or_start_with_attention_of_other_math_says_the_outputs_change():
    """checkpoint_compat.attention_change, the line a resume, --finetune and extend_context print at start: the exact
    variants (one softmax over every token, split across ranks otherwise) move weights unchanged, silently;
    to or from Linformer's or BigBird's math the trained function changes, said once."""
    from megatron.checkpoint_compat import attention_change

    def change(trained, now, **fields):
        return attention_change("checkpoint ck", {"attention": trained}, {"attention": now, **fields})

    exact = ("dense", "ring", "ulysses", "hybrid")
    assert all(change(a, b) is None for a in exact for b in exact)
    assert change("bigbird", "bigbird") is None
    assert change("linformer", "linformer") is None
    assert change("bigbird", "ring") == (
        "checkpoint ck was trained with BigBird's block-sparse attention (bigbird); this run uses attention to every "
        "token (ring), so its outputs differ from the trained model's")
    assert change("hybrid", "linformer") == (
        "checkpoint ck was trained with attention to every token (hybrid); this run uses Linformer's low-rank "
        "projected attention (linformer), so its outputs differ from the trained model's")
    assert "BigBird's" in change("linformer", "bigbird")
    assert change("bigbird", "dense", bigbird_block_size=8) == change("bigbird", "dense")  # the variant says it all


def test_attention_settings_that_shape_no_tensor_are_compared_too():
    """Weights meet the same variant with other BigBird blocks or other local layers (a resume refuses the
    local layers' change: fields.resume_kept; --finetune may set another window): a line naming both
    values. BigBird's seed (random blocks redrawn every step), the rope thetas (a longer context changes
    them on purpose) and the options of a variant neither run uses are not compared; a stored config
    without a field had its default."""
    from megatron.checkpoint_compat import attention_change
    from megatron.model.args import BertConfig

    bigbird = vars(BertConfig(attention="bigbird", bigbird_block_size=8))
    assert attention_change("checkpoint ck", bigbird, {**bigbird, "bigbird_block_size": 16,
                                                       "bigbird_num_random_blocks": 0}) == (
        "checkpoint ck was trained with bigbird attention at bigbird_block_size 8, bigbird_num_random_blocks 2; this "
        "run uses bigbird_block_size 16, bigbird_num_random_blocks 0, so its outputs differ from the trained model's")
    assert "bigbird_num_window_blocks 3; the Hugging Face model uses bigbird_num_window_blocks 5" in attention_change(
        "ck", bigbird, {**bigbird, "bigbird_num_window_blocks": 5}, user="the Hugging Face model")
    same = {**bigbird, "bigbird_seed": 7, "rotary_base": 160000.0, "local_rotary_base": 1e6, "linformer_k": 64}
    assert attention_change("ck", bigbird, same) is None
    assert attention_change("ck", {"attention": "bigbird"}, {**bigbird, "bigbird_block_size": 64}) is None
    dense = vars(BertConfig())
    modern = {**dense, "local_attention_window": 128, "global_attention_every": 3}
    assert attention_change("checkpoint ck", modern, {**modern, "local_attention_window": 256}) == (
        "checkpoint ck was trained with dense attention at local_attention_window 128; this run uses "
        "local_attention_window 256, so its outputs differ from the trained model's")
    assert attention_change("checkpoint ck", {**dense, "attention": "ring"}, modern) == (
        "checkpoint ck was trained with ring attention at local_attention_window None, global_attention_every 1; this "
        "run uses local_attention_window 128, global_attention_every 3, so its outputs differ from the trained "
        "model's")
    assert attention_change("ck", {**dense, "linformer_k": 64}, {**dense, "attention": "ulysses"}) is None


def main_and_stderr(argv: list) -> tuple:
    """main's exit code and what it wrote to stderr."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    return code, err.getvalue()


def main_recording_bigbird_iterations(argv: list) -> tuple:
    """main_and_stderr, plus the iteration BigBird's layers hold (their random blocks' draw) at each step."""
    from megatron import training
    from megatron.model.attention.bigbird import BigBirdAttention

    iterations, step = [], training.train_step

    def recording_step(engine, micro_batches):
        iterations.append(sorted({m.iteration for m in engine.module.modules() if isinstance(m, BigBirdAttention)}))
        return step(engine, micro_batches)
    training.train_step = recording_step  # in this spawned rank only
    return (*main_and_stderr(argv), iterations)


def test_a_resume_with_other_bigbird_blocks_says_the_outputs_change(tmp_path, data_dir):
    """The line is printed at a resume (on rank 0, once). Every step, the first run's and the resumed
    one's, draws the random blocks of its own iteration."""
    argv = [*TINY, "--attention", "bigbird", "--block-size", "16", "--train-iters", "2", "--eval-iters", "1",
            "--split", "100,0,0", "--default-data-dir", data_dir, "--log-dir", str(tmp_path / "log"),
            "--save", str(tmp_path / "ck")]
    resume = [*argv, "--load", str(tmp_path / "ck"), "--bigbird-num-random-blocks", "1", "--train-iters", "3"]
    [(code, _, iterations)] = run_on_ranks(main_recording_bigbird_iterations, 1, argv, timeout=240)
    assert code == 0 and iterations == [[0], [1]]
    [(code, err, iterations)] = run_on_ranks(main_recording_bigbird_iterations, 1, resume, timeout=240)
    assert code == 0, err[-3000:]
    assert iterations == [[2]]
    assert [line for line in err.splitlines() if "outputs differ" in line] == [
        f"warning: checkpoint {tmp_path / 'ck'} was trained with bigbird attention at bigbird_num_random_blocks 2; "
        "this run uses bigbird_num_random_blocks 1, so its outputs differ from the trained model's"], err[-3000:]


def test_a_resume_names_each_optimizer_setting_the_way_it_was_given(tmp_path, monkeypatch):
    """The checkpoint's settings win; the warning names a flag where the flag was given or the value is
    its default (no JSON key), and the JSON key where the user's JSON wrote it."""
    from megatron import optimizer_state
    from megatron.resume import resume_optimizer

    monkeypatch.setattr(optimizer_state, "settings", lambda engine: {"param_groups": [
        {"lr": 1e-4, "weight_decay": 0.1, "betas": (0.9, 0.98), "eps": 1e-8}]})
    json_file = tmp_path / "ds.json"
    json_file.write_text(json.dumps({"optimizer": {"type": "AdamW", "params": {"weight_decay": 0.01}}}))

    def warning(json_path, **flags):
        config = SimpleNamespace(ds_config={"optimizer": {"params": {
            "lr": 1e-4, "weight_decay": 0.01, "betas": [0.9, 0.999], "eps": 1e-8}}})
        args = SimpleNamespace(**{"deepspeed_config": json_path, "weight_decay": None, "adam_beta1": None,
                                  "adam_beta2": None, "adam_eps": None, **flags})
        return resume_optimizer(None, config, args), config.ds_config["optimizer"]["params"]

    line, recorded = warning(str(json_file))
    assert line.startswith("warning: resuming with optimizer.params.weight_decay 0.01 (the checkpoint's: 0.1), "
                           "--adam-beta2 0.999 (the checkpoint's: 0.98): the optimizer goes on"), line
    assert recorded["weight_decay"] == 0.1 and recorded["betas"] == [0.9, 0.98]  # what config.json records
    line, _ = warning(None, **{"weight_decay": 0.01})
    assert line.startswith("warning: resuming with --weight-decay 0.01 (the checkpoint's: 0.1), --adam-beta2"), line


def test_the_optimizer_flags_a_resume_names_are_the_parsers():
    """resume.OPTIMIZER_PARAM_FLAGS states each flag's argparse destination, which resume_optimizer
    reads to tell a given flag from its default: the parser's own."""
    from megatron.arguments import build_parser
    from megatron.resume import OPTIMIZER_PARAM_FLAGS

    dests = {action.option_strings[0]: action.dest for action in build_parser()._actions if action.option_strings}
    assert {flag: dest for flag, dest in OPTIMIZER_PARAM_FLAGS.values()} == {
        flag: dests[flag] for flag, _ in OPTIMIZER_PARAM_FLAGS.values()}


def nan_engine(applied: bool = True, fp16: bool = False) -> SimpleNamespace:
    return SimpleNamespace(fp16_enabled=lambda: fp16, was_step_applied=lambda: applied)


def watched(*steps, saves=()) -> LossWatch:
    """A LossWatch told the losses `steps` (iterations 1, 2, ...), with a checkpoint saved after each
    iteration in `saves` (as tmp folders that exist: (iteration, folder))."""
    watch, folders = LossWatch(), dict(saves)
    for iteration, loss in enumerate(steps, start=1):
        watch.step(iteration, loss, skipped_for_nan=False)
        if iteration in folders:
            watch.saved(str(folders[iteration]), iteration)
    return watch


def test_a_nan_loss_advises_what_works(tmp_path):
    """check_step's line: with --save set, "rerun with --save" could not help; it says what else would. After a
    checkpoint, a lower --lr takes --finetune, from the last checkpoint whose loss was in range, named with
    its logged loss (the newest may have been saved while the loss was already 1e10)."""
    from megatron.errors import ConfigError
    from megatron.training import check_step

    for save, iteration, where in ((None, 5, "rerun with --save and --save-interval (e.g."),
                                   ("ck", 5, "rerun with a --save-interval below 5 (e.g."), ("ck", 1, "rerun (e.g.")):
        args = SimpleNamespace(skip_nan_batches=False, save=save, launched_by=None)
        with pytest.raises(ConfigError, match=f"^loss is nan at iteration {iteration}; no checkpoint was saved before "
                                              f"it: {re.escape(where)} with a lower --lr"):
            check_step(args, nan_engine(), iteration, float("nan"), LossWatch(), log=None)
    # a resume keeps the checkpoint's peak --lr (resume_schedule): a lower one takes --finetune, in another --save
    args = SimpleNamespace(skip_nan_batches=False, save=str(tmp_path), launched_by=None)
    four = tmp_path / "iter_0000004"
    four.mkdir()
    with pytest.raises(ConfigError, match=re.escape(
            f"loss is nan at iteration 5; the last checkpoint is {four} (logged loss 9.5): start a new run from its "
            f"weights with a lower rate (--finetune --load {tmp_path} --lr LOWER --save ANOTHER_DIR; a resume keeps "
            "the checkpoint's peak --lr), or pass --skip-nan-batches")):
        check_step(args, nan_engine(), 5, float("nan"), watched(9.7, 9.6, 9.6, 9.5, saves=[(4, four)]), log=None)
    two = tmp_path / "iter_0000002"
    two.mkdir()
    diverged = watched(9.7, 9.6, 3e7, 8e10, saves=[(2, two), (4, four)])
    with pytest.raises(ConfigError, match=re.escape(
            f"the last checkpoint whose loss was in range is {two} (logged loss 9.6; the later {four} logged loss "
            f"8e+10): write iter_0000002 into {tmp_path / 'latest'}, then start a new run from its weights")):
        check_step(args, nan_engine(), 5, float("nan"), diverged, log=None)
    with pytest.raises(ConfigError, match=re.escape(
            f"no checkpoint from before the loss left its range is kept (the last, {four}, logged loss 8e+10): "
            "rerun with a lower --lr, or pass")):
        check_step(args, nan_engine(), 5, float("nan"), watched(9.7, 3e7, 3e7, 8e10, saves=[(4, four)]), log=None)
    two.rmdir()  # --keep-last removed it
    with pytest.raises(ConfigError, match=re.escape("no checkpoint from before the loss left its range is kept")):
        check_step(args, nan_engine(), 5, float("nan"), diverged, log=None)


def test_a_loss_that_explodes_is_warned_of_once_naming_the_checkpoint_before(tmp_path, capsys, monkeypatch):
    """A loss 100x the run's first, still finite (lr 1e3: 9.7 -> 3e7 -> 1e12), trained on without a word: one
    warning, the first time, naming the last checkpoint saved while the loss was in range."""
    import megatron.training as training

    monkeypatch.setattr(training.dist, "get_rank", lambda: 0)
    args = SimpleNamespace(skip_nan_batches=False, save=str(tmp_path), launched_by=None)
    log = SimpleNamespace(message=print)
    watch = LossWatch()
    for iteration, loss in enumerate((9.7, 900.0, 9.5, 3e7, 1e12), start=1):
        training.check_step(args, nan_engine(), iteration, loss, watch, log)
        if iteration == 3:
            watch.saved(str(tmp_path / "iter_0000003"), iteration)
            (tmp_path / "iter_0000003").mkdir()
    warnings = capsys.readouterr().err.splitlines()
    assert warnings == [f"warning: the loss 3e+07 at iteration 4 is over 100x this run's first 9.7 (iteration 1): the "
                        f"training is diverging; the last checkpoint before it is {tmp_path / 'iter_0000003'} (logged "
                        f"loss 9.5): a lower --lr from its weights (--finetune --load {tmp_path} --lr LOWER --save "
                        "ANOTHER_DIR) may train"], warnings
    quiet = watched(9.7, 2.0, 0.05, 1.5)  # a loss that falls far, then rises again, stays below 100x the first
    assert not quiet.diverged


def test_steps_skipped_in_a_row_stop_the_run_and_a_few_are_summed_up_at_the_end():
    """--skip-nan-batches with weights that give NaN on every batch trained nothing and exited 0: SKIPPED_IN_A_ROW_LIMIT
    skipped steps in a row stop the run (an fp16 overflow of a finite loss, the loss scaler's work, counts
    not); a few skipped steps are summed up at the end."""
    from megatron.errors import ConfigError
    from megatron.loss_watch import SKIPPED_IN_A_ROW_LIMIT
    from megatron.training import check_step

    args = SimpleNamespace(skip_nan_batches=True, save=None, launched_by=None)
    log = SimpleNamespace(message=lambda line: None)
    watch = LossWatch()
    check_step(args, nan_engine(), 1, 9.7, watch, log)
    for iteration in range(2, 4):
        check_step(args, nan_engine(applied=False), iteration, float("nan"), watch, log)
    check_step(args, nan_engine(), 4, 9.6, watch, log)  # a finite step ends the streak
    check_step(args, nan_engine(applied=False, fp16=True), 5, 9.6, watch, log)  # a loss-scale overflow
    assert watch.skipped_summary() == ("warning: 2 of this run's 5 updates were skipped for a non-finite loss or "
                                       "gradients (iterations 2, 3): those steps trained nothing")
    for iteration in range(6, 5 + SKIPPED_IN_A_ROW_LIMIT):
        check_step(args, nan_engine(applied=False), iteration, float("nan"), watch, log)
    with pytest.raises(ConfigError, match=re.escape(
            f"{SKIPPED_IN_A_ROW_LIMIT} steps in a row, up to iteration {5 + SKIPPED_IN_A_ROW_LIMIT}, skipped their "
            "update for a non-finite loss or gradients: the weights give NaN/inf whatever the batch; no checkpoint "
            "was saved before it: rerun with --save")):
        check_step(args, nan_engine(applied=False), 5 + SKIPPED_IN_A_ROW_LIMIT, float("nan"), watch, log)
    assert LossWatch().skipped_summary() is None


def test_a_long_evaluation_says_how_far_it_is(monkeypatch):
    """--eval-iters 100000 printed nothing for minutes: progress lines by time, the first after
    FIRST_LOG_SECONDS, then every LOG_SECONDS, with an ETA; none at the last step (the loss line follows)."""
    import megatron.training as training

    clock = iter([0.0, 1.0, 2.5, 3.0, 18.0, 20.0])
    monkeypatch.setattr(training.time, "perf_counter", lambda: next(clock))
    lines = []
    progress = training.EvaluationProgress("validation after iteration 4", SimpleNamespace(message=lines.append))
    for done in range(1, 6):
        progress.step(done, 5 if done == 5 else 100)
    assert lines == ["validation after iteration 4: step 2 of 100 (2 s, ETA 2 min 02 s)",
                     "validation after iteration 4: step 4 of 100 (18 s, ETA 7 min 12 s)"]


def test_train_samples_that_are_no_whole_number_of_batches_are_named():
    assert train_samples_note(7, 2) == ("note: --train-samples 7 is 3.5 global batches of 2: the run trains 4 steps "
                                        "(8 samples)")


def comms_summary_of_one_all_reduce() -> list:
    """The lines training.comms_summary prints on this rank after one all_reduce, DeepSpeed's comms_logger on
    as the JSON's "comms_logger": {"enabled": true} turns it on."""
    import contextlib
    import io

    import deepspeed
    import deepspeed.comm
    import torch
    from deepspeed.comm.config import DeepSpeedCommsConfig

    from megatron.training import comms_summary

    deepspeed.init_distributed(dist_backend="gloo")
    deepspeed.comm.comms_logger.configure(DeepSpeedCommsConfig({"comms_logger": {"enabled": True}}))
    deepspeed.comm.all_reduce(torch.ones(4))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        comms_summary()
    return out.getvalue().splitlines()


def test_the_comms_logger_summary_is_printed_by_rank_0_at_the_end(monkeypatch):
    """"comms_logger" in the JSON recorded every collective, and nothing printed them: DeepSpeed leaves its
    log_summary() (barriers on every rank) to the training script. Rank 0 prints the table, rank 1 nothing."""
    from megatron.training import comms_summary

    rank0, rank1 = run_on_ranks(comms_summary_of_one_all_reduce, 2, timeout=120)
    assert rank1 == []
    assert rank0[0].split()[:3] == ["Comm.", "Op", "Message"] and "all_reduce" in rank0, rank0
    reduced = rank0[rank0.index("all_reduce") + 1].split()
    assert reduced[:3] == ["16.0", "B", "1"], rank0  # one all_reduce of 4 fp32 numbers
    import deepspeed.comm

    monkeypatch.setattr(deepspeed.comm.comms_logger, "enabled", False)  # no "comms_logger": no barrier, no table
    monkeypatch.setattr(deepspeed.comm, "log_summary", lambda: pytest.fail("log_summary called"))
    comms_summary()


def test_unpacked_train_samples_mostly_padding_are_noted_with_pack_samples():
    """--seq-length 4096 on a corpus of ~200-token documents: 89% of every step was padding, named only as a
    share; the note connects it to --pack-samples (not for packed samples, a fuller split, or Linformer, which
    cannot pack)."""
    from megatron.data.bert_dataset import TokenStats
    from megatron.run_data import padding_note

    config = SimpleNamespace(model=SimpleNamespace(attention="dense"))
    padded = TokenStats(833, 4096, False, 1.0, 0.11)
    assert padding_note(padded, config) == (
        "train samples are 89% padding at --seq-length 4096 (one document's sentences each, 451 real tokens on "
        "average): --pack-samples fills them with several documents, each attending only to itself: many more real "
        "tokens a step, at little more cost in a model of real size")
    assert padding_note(TokenStats(833, 4096, True, 9.0, 0.11), config) is None
    assert padding_note(TokenStats(833, 512, False, 1.0, 0.6), config) is None
    assert padding_note(padded, SimpleNamespace(model=SimpleNamespace(attention="linformer"))) is None

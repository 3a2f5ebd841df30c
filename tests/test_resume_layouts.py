"""Resuming in another layout continues the run as resuming in its own layout does.

A run at SP=2 (ZeRO 1, hybrid attention of Ulysses 2) saves in warm-up, where every step has another
learning rate; it is then resumed with ring attention (the same function) in its own layout
(DeepSpeed's files), at SP=1 and at PP=2 (the layout-free files). Each resumed step must use the rate
the same-layout resume uses (and count the checkpoint's skipped steps), every optimizer setting (param-group field) must be the checkpoint's on
both paths even where this run's JSON says otherwise (one warning says so, and the config records the
checkpoint's), and the losses must agree within SP rounding. RNG files: a missing one is refused on
every rank before anything is loaded, unless the caller passes load_rng=False (one warning).
"""
import contextlib
import io
import json
import shutil
from types import SimpleNamespace

import pytest
import torch

from bert_fixtures import small_model
from megatron import checkpoint, checkpoint_save, optimizer_state
from megatron.checkpoint import tag_for
from megatron.checkpoint_compat import decays_norms_and_biases
from megatron.config import resolve
from megatron.engine import build_engine, train_step
from megatron.errors import DataError
from megatron.resume import resume_optimizer
from megatron.schedule import Schedule
from megatron.parallel.spawn import run_on_ranks
from test_checkpoint import step_batches
from test_deepspeed_engine import GLOBAL_BATCH, ds_config, model_flags
from test_sequence_parallel_bert import REL_TOL

SAVED_AT, STOP, TRAIN_ITERS = 2, 4, 8
SCHEDULE = SimpleNamespace(min_lr=None, lr_decay_style="linear", lr_warmup_fraction=0.5,  # 4 warm-up steps
                           lr_warmup_iters=None, lr_decay_iters=None, lr_wsd_decay_iters=None,
                           lr_wsd_decay_style=None)


def run(pipeline: int, sequence: int, directory: str, weight_decay: float, resume=False, refused_from=None,
        micro=2, attention="ring", decay_norms_and_biases=False) -> dict:
    """Trains to STOP (saving at SAVED_AT), or resumes from `directory`; returns per step the rate
    it used and its loss, and the optimizer's settings after the load (with the warning and the
    config's record of them). `refused_from`: a copy of the checkpoint without this run's RNG file,
    tried first (its error), then loaded with load_rng=False (its warning) before the real checkpoint.
    `decay_norms_and_biases`: a new run's optimizer groups; a resume takes the checkpoint's, as the trainer's
    model_flags does."""
    world = torch.distributed.get_world_size()
    gas = GLOBAL_BATCH // micro // (world // (pipeline * sequence))
    ds = ds_config(micro, gas, 1, sequence, attention)
    if attention == "hybrid":
        ds["sequence_parallel"]["ulysses_size"] = sequence
    ds["optimizer"]["params"]["weight_decay"] = weight_decay
    if resume:
        decay_norms_and_biases = decays_norms_and_biases(checkpoint.stored_config(directory, tag_for(SAVED_AT)))
    config = resolve({**model_flags(), "pipeline_parallel_size": pipeline,
                      "decay_norms_and_biases": decay_norms_and_biases}, ds, world)
    engine = build_engine(config, bert_state=small_model(config.model).state_dict(),
                          lr_scheduler=Schedule.from_args(SCHEDULE, ds, TRAIN_ITERS).lambda_lr)
    result, start = {}, 0
    if refused_from:
        with pytest.raises(DataError) as refused:
            checkpoint.load(engine, refused_from, config)
        printed = io.StringIO()
        with contextlib.redirect_stderr(printed):
            checkpoint.load(engine, refused_from, config, load_rng=False)
        result.update(refused=str(refused.value), warning=printed.getvalue())
    if resume:
        start = checkpoint.load(engine, directory, config)["iteration"]
        result.update(optimizer_warning=resume_optimizer(engine, config), skipped_steps=engine.skipped_steps,
                      recorded=dict(config.ds_config["optimizer"]["params"]))
    groups = optimizer_state._base_optimizer(engine).param_groups
    result.update(groups=[{key: value for key, value in group.items() if key != "params"} for group in groups],
                  lrs=[], losses=[], config=config.to_dict())
    for step in range(start, STOP):
        result["lrs"].append(engine.get_lr()[0])
        result["losses"].append(train_step(engine, step_batches(step, micro, gas)).loss)
        if step + 1 == SAVED_AT and not resume:
            engine.skipped_steps = 3  # as if 3 fp16 steps had overflowed: the counter must travel too
            checkpoint_save.save(engine, config, directory, iteration=SAVED_AT,
                                 consumed_samples=SAVED_AT * GLOBAL_BATCH)
    return result


@pytest.fixture(scope="module")
def resumed(tmp_path_factory) -> SimpleNamespace:
    """The SP=2 run (hybrid), and its resumes (ring, another weight decay in the JSON) in its own
    layout, at SP=1 and at PP=2, these first refused a copy without rng_rank0.pt (SP=1) /
    rng_rank1.pt (PP=2: rank 0, whose own file is there, stops too)."""
    directory = tmp_path_factory.mktemp("resume_layouts")
    saved = str(directory / "ckpt")
    straight = run_on_ranks(run, 2, 1, 2, saved, 0.01, attention="hybrid", timeout=300)[0]
    without = {}
    for rank in (0, 1):
        without[rank] = shutil.copytree(saved, directory / f"without_rng{rank}")
        (without[rank] / checkpoint.tag_for(SAVED_AT) / f"rng_rank{rank}.pt").unlink()
    return SimpleNamespace(
        straight=straight,
        same_layout=run_on_ranks(run, 2, 1, 2, saved, 0.1, True, timeout=300)[0],
        sp1=run_on_ranks(run, 1, 1, 1, saved, 0.1, True, str(without[0]), timeout=300)[0],
        pp2=run_on_ranks(run, 2, 2, 1, saved, 0.1, True, str(without[1]), timeout=300)[0])


@pytest.mark.parametrize("layout", ["same_layout", "sp1", "pp2"])
def test_resumed_steps_use_the_checkpoints_rate_and_settings(resumed, layout):
    got, same = getattr(resumed, layout), resumed.same_layout
    # warm-up: each step has its own rate; the resumed ones are the uninterrupted run's
    assert len(set(resumed.straight["lrs"])) == STOP
    assert got["lrs"] == resumed.straight["lrs"][SAVED_AT:]
    assert got["groups"] == same["groups"] and got["groups"][0]["weight_decay"] == 0.01
    assert got["skipped_steps"] == 3
    assert got["recorded"]["weight_decay"] == 0.01 and got["optimizer_warning"] == (
        "warning: resuming with optimizer.params.weight_decay 0.1 (the checkpoint's: 0.01): the optimizer goes on with the "
        "checkpoint's settings, which config.json records; pass --finetune and another --save to start a new run from "
        "the checkpoint's weights with a fresh optimizer that takes the new values")
    assert got["losses"] == pytest.approx(same["losses"], rel=REL_TOL)
    assert got["losses"] == pytest.approx(resumed.straight["losses"][SAVED_AT:], rel=REL_TOL)


@pytest.mark.parametrize("layout,missing", [("sp1", "rng_rank0.pt"), ("pp2", "rng_rank1.pt")])
def test_missing_rng_file_refused_unless_asked(resumed, layout, missing):
    got = getattr(resumed, layout)  # rank 0's
    assert f"{missing} is missing" in got["refused"] and "--no-load-rng" in got["refused"]
    lines = got["warning"].splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: ") and "no longer bit-exact" in lines[0], lines


def test_a_checkpoint_of_the_old_grouping_resumes_as_it_trained(tmp_path):
    """A checkpoint written before biases and norm weights were spared weight decay (one group decayed every
    parameter; its config lacks decay_norms_and_biases) goes on with that one group, in its own layout
    (DeepSpeed's files: bit for bit) and at SP=1 (the layout-free files, which compared the group counts and
    refused it), and records the grouping in its config (config.json, the next checkpoint)."""
    saved = str(tmp_path / "ckpt")
    straight = run_on_ranks(run, 2, 1, 2, saved, 0.01, decay_norms_and_biases=True, timeout=300)[0]
    state_file = tmp_path / "ckpt" / tag_for(SAVED_AT) / checkpoint.RUN_STATE
    stored = json.loads(state_file.read_text())
    assert stored["config"].pop("decay_norms_and_biases") is True
    state_file.write_text(json.dumps(stored))  # as written before the field
    same_layout = run_on_ranks(run, 2, 1, 2, saved, 0.01, True, timeout=300)[0]
    sp1 = run_on_ranks(run, 1, 1, 1, saved, 0.01, True, timeout=300)[0]
    assert [[group["weight_decay"] for group in result["groups"]] for result in (straight, same_layout, sp1)] == [
        [0.01]] * 3
    assert same_layout["groups"] == sp1["groups"]
    assert same_layout["losses"] == straight["losses"][SAVED_AT:]
    assert sp1["losses"] == pytest.approx(straight["losses"][SAVED_AT:], rel=REL_TOL)
    assert same_layout["config"]["decay_norms_and_biases"] is sp1["config"]["decay_norms_and_biases"] is True


def scaled_engine(scaler, lr: float) -> SimpleNamespace:
    """What settings / restore_settings read of an engine: DeepSpeed's optimizer wrapper holding
    the torch optimizer (.optimizer) and the loss scaler."""
    adamw = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=lr, weight_decay=0.5, betas=(0.8, 0.9))
    return SimpleNamespace(optimizer=SimpleNamespace(optimizer=adamw, loss_scaler=scaler))


def test_dynamic_loss_scale_travels_into_a_dynamic_scaler_only(tmp_path):
    """fp16: the scale an overflow lowered (and its hysteresis, the iteration of the overflow) goes
    on in another layout as DeepSpeed's own files would restore it; a static scaler (bf16, or a
    fixed fp16 scale) keeps the config's scale."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler

    def dynamic():
        return DynamicLossScaler(init_scale=2.0 ** 16, scale_window=1000, min_scale=1.0, delayed_shift=2,
                                 consecutive_hysteresis=False)

    saved = scaled_engine(dynamic(), lr=3e-4)
    # after overflows (update_scale logs them through DeepSpeed's process group, absent here)
    vars(saved.optimizer.loss_scaler).update(cur_scale=2.0 ** 13, cur_iter=7, last_overflow_iter=5, cur_hysteresis=1)
    torch.save(optimizer_state.settings(saved), tmp_path / "settings.pt")
    stored = checkpoint.safe_load(str(tmp_path / "settings.pt"))  # as the layout-free files are read
    fresh = scaled_engine(dynamic(), lr=1e-3)
    optimizer_state.restore_settings(fresh, stored)
    assert vars(fresh.optimizer.loss_scaler) == vars(saved.optimizer.loss_scaler)
    assert fresh.optimizer.loss_scaler.cur_scale == 2.0 ** 13
    assert fresh.optimizer.optimizer.param_groups[0]["lr"] == 3e-4
    static = scaled_engine(LossScaler(1.0), lr=1e-3)
    optimizer_state.restore_settings(static, stored)
    assert static.optimizer.loss_scaler.cur_scale == 1.0
    assert optimizer_state.settings(static)["loss_scaler"] is None

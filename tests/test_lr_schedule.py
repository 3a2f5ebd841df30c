"""megatron.schedule.Schedule: the LR each optimizer step uses, worked out by hand; the record a
checkpoint keeps of it and what a resume names as changed.

lr 1e-3, min-lr 1e-4, 100 steps, warm-up fraction 0.1 -> 10 warm-up steps. Step k (0-based, the
LR the (k+1)-th update uses) warms up as (k + 1) / 10 x lr, reaching lr at k = 9; decay then runs
over the 90 steps 10..100: progress p = (k - 10) / 90, LR = min + (lr - min) x d(p) with
d = 1 - p (linear) or (1 + cos(pi p)) / 2 (cosine), min-lr at k = 100 and after.
"""

import re
from types import SimpleNamespace

import pytest
import torch

from megatron.schedule import Schedule


def lrs(style: str, steps, warmup_fraction=0.1, train_iters=100, flag_lr=1e-3) -> list:
    """The LR of each step in `steps` under DeepSpeed's use of the scheduler: built on the
    optimizer (step 0, lr 1e-3), then stepped once after every optimizer step."""
    schedule = Schedule(train_iters=train_iters, lr=flag_lr, min_lr=1e-4, lr_decay_style=style,
                        lr_warmup_fraction=warmup_fraction)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    scheduler = schedule.lambda_lr(optimizer)
    seen = {}
    for step in range(max(steps) + 1):
        seen[step] = optimizer.param_groups[0]["lr"]
        optimizer.step()
        scheduler.step()
    return [seen[step] for step in steps]


WARMUP = {0: 1e-4, 4: 5e-4, 9: 1e-3, 10: 1e-3}


@pytest.mark.parametrize("style,after_warmup", [
    # linear: k=40 p=1/3 -> 1e-4 + 9e-4 x 2/3; k=55 p=1/2; k=85 p=5/6 -> 1e-4 + 9e-4 / 6
    ("linear", {40: 7e-4, 55: 5.5e-4, 85: 2.5e-4, 100: 1e-4, 120: 1e-4}),
    # cosine: k=40 cos(pi/3)=1/2 -> d=3/4; k=55 d=1/2; k=70 cos(2pi/3)=-1/2 -> d=1/4
    ("cosine", {40: 7.75e-4, 55: 5.5e-4, 70: 3.25e-4, 100: 1e-4, 120: 1e-4}),
    ("constant", {40: 1e-3, 55: 1e-3, 100: 1e-3, 120: 1e-3}),
])
def test_warmup_then_decay_to_min_lr(style, after_warmup):
    expected = {**WARMUP, **after_warmup}
    assert lrs(style, list(expected)) == pytest.approx(list(expected.values()), rel=1e-12, abs=0)


def test_no_warmup_starts_at_lr():
    # warm-up fraction 0: step 0 is the top of the decay; linear over 100 steps, k=50 -> p=1/2
    assert lrs("linear", [0, 50, 100], warmup_fraction=0.0) == pytest.approx([1e-3, 5.5e-4, 1e-4], rel=1e-12, abs=0)


def test_peak_is_the_optimizer_lr_without_the_flag():
    # no --lr: the optimizer's lr (the JSON's optimizer.params.lr) is the peak; min-lr is still reached
    assert lrs("linear", [9, 55, 100], flag_lr=None) == pytest.approx([1e-3, 5.5e-4, 1e-4], rel=1e-12, abs=0)


# a checkpoint's `schedule` record as runs wrote it before the warm-up / decay step counts and WSD:
# the keys a resume compares
WRITTEN = {"train_iters": 50, "lr": 1e-3, "min_lr": 0.0, "lr_decay_style": "linear", "lr_warmup_fraction": 0.01}
ADDED = {"lr_warmup_iters": None, "lr_decay_iters": None, "lr_wsd_decay_iters": None, "lr_wsd_decay_style": None}


def flags(**given) -> SimpleNamespace:
    """The schedule's flags as argparse leaves them when not given, with `given` set."""
    return SimpleNamespace(**{"min_lr": None, "lr_decay_style": "linear", "lr_warmup_fraction": None, **ADDED,
                              **given})


def test_the_record_keeps_the_checkpoints_format():
    """This run's record is the dict checkpoints have held (no --min-lr: 0.0; the peak: the JSON's
    optimizer.params.lr; no warm-up flag: the fraction 0.01), the keys added since after it; a record
    read back is the same schedule, and one written before the added keys reads as their defaults."""
    schedule = Schedule.from_args(flags(), {"optimizer": {"params": {"lr": 1e-3}}}, 50)
    assert schedule.record() == {**WRITTEN, **ADDED} and list(schedule.record()) == [*WRITTEN, *ADDED]
    assert Schedule.from_record(schedule.record()) == schedule
    assert Schedule.from_record(WRITTEN) == schedule


def test_changes_name_each_flag_against_the_checkpoints_record():
    """In field order, by flag; a key a stored record lacks is not compared."""
    schedule = Schedule(train_iters=54, lr=2e-3, min_lr=1e-4, lr_decay_style="cosine", lr_warmup_fraction=0.01)
    assert schedule.changes(WRITTEN) == [
        "--train-iters 54 (the checkpoint's: 50)", "--lr 0.002 (the checkpoint's: 0.001)",
        "--min-lr 0.0001 (the checkpoint's: 0.0)", "--lr-decay-style cosine (the checkpoint's: linear)"]
    older = {key: value for key, value in WRITTEN.items() if key not in ("min_lr", "lr_decay_style")}
    assert schedule.changes(older) == schedule.changes(WRITTEN)[:2]
    assert Schedule.from_record(WRITTEN).changes(WRITTEN) == []
    # a run whose length --train-samples gave: named so, not by the --train-iters the user never passed
    length = "--train-samples 216 (54 steps at global batch 4)"
    assert schedule.changes(WRITTEN, length)[0] == f"{length} (the checkpoint's: 50 steps)"


def rates(schedule: Schedule, steps) -> list:
    """schedule's LR at each step of `steps` for a peak of 1e-3."""
    rule = schedule.factor(1e-3)
    return [1e-3 * rule(step) for step in steps]


def test_warmup_iters_and_decay_iters():
    """--lr-warmup-iters 10 of 200 steps (the fraction 0.05 would be the same), --lr-decay-iters 100: the
    linear decay runs over steps 10..100 (p = (k - 10) / 90) and holds min-lr after it, as Megatron's."""
    schedule = Schedule.from_args(flags(min_lr=1e-4, lr_warmup_iters=10, lr_decay_iters=100),
                                  {"optimizer": {"params": {"lr": 1e-3}}}, 200)
    assert schedule.lr_warmup_fraction is None and schedule.warmup_steps == 10
    expected = {0: 1e-4, 9: 1e-3, 10: 1e-3, 55: 5.5e-4, 100: 1e-4, 150: 1e-4, 199: 1e-4}
    assert rates(schedule, expected) == pytest.approx(list(expected.values()), rel=1e-12, abs=0)


@pytest.mark.parametrize("style,annealed", [
    # the anneal over steps 80..100 (20 steps), r = (k - 80) / 20; LR = 1e-4 + 9e-4 x a(r)
    ("linear", {85: 0.75, 90: 0.5}),  # a = 1 - r
    ("cosine", {90: 0.5}),  # a = (1 + cos(pi r)) / 2
    ("exponential", {90: 2 * 0.5 ** 0.5 - 1}),  # a = 2 x 0.5^r - 1
    ("minus_sqrt", {85: 0.5, 95: 1 - 0.75 ** 0.5}),  # a = 1 - sqrt(r)
])
def test_wsd_holds_the_peak_then_anneals_its_last_steps(style, annealed):
    """WSD (warmup-stable-decay, ModernBERT's trapezoid): 10 warm-up steps, the peak until step 80,
    then the last 20 of 100 steps annealed to min-lr in the chosen shape; min-lr after."""
    schedule = Schedule.from_args(flags(min_lr=1e-4, lr_decay_style="WSD", lr_warmup_fraction=0.1,
                                        lr_wsd_decay_iters=20, lr_wsd_decay_style=style),
                                  {"optimizer": {"params": {"lr": 1e-3}}}, 100)
    expected = {**WARMUP, 40: 1e-3, 80: 1e-3, **{k: 1e-4 + 9e-4 * a for k, a in annealed.items()}, 100: 1e-4, 130: 1e-4}
    assert rates(schedule, expected) == pytest.approx(list(expected.values()), rel=1e-12, abs=0)


def test_wsd_anneals_exponentially_unless_told():
    schedule = Schedule.from_args(flags(lr_decay_style="WSD", lr_wsd_decay_iters=20),
                                  {"optimizer": {"params": {"lr": 1e-3}}}, 100)
    assert schedule.lr_wsd_decay_style == "exponential"


def test_inverse_square_root_after_warmup():
    """sqrt(warm-up / k) x peak after the warm-up (Megatron's, k as its decays count), never below min-lr:
    10 warm-up steps, k = 10 -> the peak again, k = 40 -> sqrt(10 / 40) = 1/2; k = 1000 -> 0.1, held at
    min-lr 2e-4."""
    schedule = Schedule.from_args(flags(min_lr=2e-4, lr_decay_style="inverse-square-root", lr_warmup_iters=10),
                                  {"optimizer": {"params": {"lr": 1e-3}}}, 2000)
    expected = {0: 1e-4, 9: 1e-3, 10: 1e-3, 40: 5e-4, 160: 2.5e-4, 1000: 2e-4, 1999: 2e-4}
    assert rates(schedule, expected) == pytest.approx(list(expected.values()), rel=1e-12, abs=0)
    # with --lr-decay-iters 160: min-lr after that step, as Megatron's
    ended = Schedule.from_args(flags(min_lr=2e-4, lr_decay_style="inverse-square-root", lr_warmup_iters=10,
                                     lr_decay_iters=160), {"optimizer": {"params": {"lr": 1e-3}}}, 2000)
    assert rates(ended, [40, 160, 161]) == pytest.approx([5e-4, 2.5e-4, 2e-4], rel=1e-12, abs=0)


@pytest.mark.parametrize("given,message", [
    (dict(lr_warmup_iters=10, lr_decay_iters=10), "--lr-decay-iters 10 ends the decay before the 10 warm-up steps"),
    (dict(lr_warmup_fraction=0.5, lr_decay_iters=40), "--lr-decay-iters 40 ends the decay before the 50 warm-up"),
    (dict(lr_decay_style="WSD", lr_warmup_iters=10, lr_wsd_decay_iters=91),
     "--lr-wsd-decay-iters 91 is longer than the 90 steps between the warm-up's end (10) and the decay's (100)"),
])
def test_settings_the_run_length_refuses(given, message):
    """Checked where the run's length is known, before any data is read (pretrain builds the schedule
    first); one line with the fix."""
    from megatron.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(message)):
        Schedule.from_args(flags(**given), {"optimizer": {"params": {"lr": 1e-3}}}, 100)


def test_a_resume_names_a_setting_added_since_against_its_default():
    """A checkpoint written before the decay step counts resumed with --lr-decay-iters: named, its
    record's value being the default (none), so the resume applies this run's schedule."""
    schedule = Schedule.from_args(flags(lr_decay_iters=40), {"optimizer": {"params": {"lr": 1e-3}}}, 50)
    assert schedule.changes(WRITTEN) == ["--lr-decay-iters 40 (the checkpoint's: none)"]


def test_a_warm_up_is_compared_by_its_steps_whichever_flag_gives_them():
    """A checkpoint of --lr-warmup-fraction 0.02 of 100 steps (2) resumed with --lr-warmup-iters 2: no
    change; with 3, the steps are named (not two fields, one of them None)."""
    stored = {**WRITTEN, "train_iters": 100, "lr_warmup_fraction": 0.02}
    peak = {"optimizer": {"params": {"lr": 1e-3}}}
    assert Schedule.from_args(flags(lr_warmup_iters=2), peak, 100).changes(stored) == []
    assert Schedule.from_args(flags(lr_warmup_iters=3), peak, 100).changes(stored) == [
        "a warm-up of 3 steps (the checkpoint's: 2)"]
    assert Schedule.from_args(flags(lr_warmup_fraction=0.02), peak, 200).changes(stored) == [
        "--train-iters 200 (the checkpoint's: 100)", "a warm-up of 4 steps (the checkpoint's: 2)"]

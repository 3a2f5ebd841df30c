"""megatron.schedule.Schedule: the LR each optimizer step uses, worked out by hand; the record a
checkpoint keeps of it and what a resume names as changed.

lr 1e-3, min-lr 1e-4, 100 steps, warm-up fraction 0.1 -> 10 warm-up steps. Step k (0-based, the
LR the (k+1)-th update uses) warms up as (k + 1) / 10 x lr, reaching lr at k = 9; decay then runs
over the 90 steps 10..100: progress p = (k - 10) / 90, LR = min + (lr - min) x d(p) with
d = 1 - p (linear) or (1 + cos(pi p)) / 2 (cosine), min-lr at k = 100 and after.
"""

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


# a checkpoint's `schedule` record as runs have written it: the keys a resume compares
WRITTEN = {"train_iters": 50, "lr": 1e-3, "min_lr": 0.0, "lr_decay_style": "linear", "lr_warmup_fraction": 0.01}


def test_the_record_keeps_the_checkpoints_format():
    """This run's record is the dict checkpoints have held (no --min-lr: 0.0; the peak: the JSON's
    optimizer.params.lr), and a record read back is the same schedule."""
    args = SimpleNamespace(min_lr=None, lr_decay_style="linear", lr_warmup_fraction=0.01)
    schedule = Schedule.from_args(args, {"optimizer": {"params": {"lr": 1e-3}}}, 50)
    assert schedule.record() == WRITTEN and list(schedule.record()) == list(WRITTEN)
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

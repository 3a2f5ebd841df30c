"""megatron.training.lr_schedule: the LR each optimizer step uses, worked out by hand.

lr 1e-3, min-lr 1e-4, 100 steps, warm-up fraction 0.1 -> 10 warm-up steps. Step k (0-based, the
LR the (k+1)-th update uses) warms up as (k + 1) / 10 x lr, reaching lr at k = 9; decay then runs
over the 90 steps 10..100: progress p = (k - 10) / 90, LR = min + (lr - min) x d(p) with
d = 1 - p (linear) or (1 + cos(pi p)) / 2 (cosine), min-lr at k = 100 and after.
"""
from types import SimpleNamespace

import pytest
import torch

from megatron.training import lr_schedule


def lrs(style: str, steps, warmup_fraction=0.1, train_iters=100, flag_lr=1e-3) -> list:
    """The LR of each step in `steps` under DeepSpeed's use of the scheduler: built on the
    optimizer (step 0, lr 1e-3), then stepped once after every optimizer step."""
    args = SimpleNamespace(lr=flag_lr, min_lr=1e-4, lr_warmup_fraction=warmup_fraction, lr_decay_style=style)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    scheduler = lr_schedule(args, train_iters)(optimizer)
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

"""The learning-rate schedule of a run, its keys stated once: Megatron's warm-up and decay styles as a
step -> factor rule (LambdaLR's), the record each checkpoint keeps of it (its `schedule`), and what
a resume says when this run's differs from that record (resume.resume_schedule). No torch at import."""
import dataclasses
import math
from dataclasses import dataclass

from megatron.errors import ConfigError

DECAY_STYLES = ("linear", "cosine", "constant", "inverse-square-root", "WSD")
WSD_DECAY_STYLES = ("linear", "cosine", "exponential", "minus_sqrt")
DEFAULT_WARMUP_FRACTION = 0.01
WARMUP_FIELDS = ("lr_warmup_fraction", "lr_warmup_iters")  # one setting, compared by its steps


def _flag(name: str, **default) -> dataclasses.Field:
    """A schedule field with the flag that sets it (named in a resume's warning); a field added after
    checkpoints had records has a default, which a record without it means."""
    return dataclasses.field(metadata={"flag": name}, **default)


def _annealed(style: str, progress: float) -> float:
    """1 -> 0 as `progress` goes 0 -> 1, in the shape `style` names."""
    if style == "linear":
        return 1.0 - progress
    if style == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    if style == "exponential":  # halves its distance to 1 at each equal share, from 1 to 0
        return 2.0 * 0.5 ** progress - 1.0
    return 1.0 - math.sqrt(progress)  # minus_sqrt (ModernBERT's "1-sqrt" decay)


@dataclass(frozen=True)
class Schedule:
    """What shapes the learning rate over the run (the record keeps these names and values)."""
    train_iters: int = _flag("--train-iters")
    lr: float = _flag("--lr")  # the peak this run asked for; the factor scales the optimizer's own
    min_lr: float = _flag("--min-lr")
    lr_decay_style: str = _flag("--lr-decay-style")  # one of DECAY_STYLES
    lr_warmup_fraction: float | None = _flag("--lr-warmup-fraction")  # None: lr_warmup_iters gives it
    lr_warmup_iters: int | None = _flag("--lr-warmup-iters", default=None)
    lr_decay_iters: int | None = _flag("--lr-decay-iters", default=None)  # None: train_iters
    lr_wsd_decay_iters: int | None = _flag("--lr-wsd-decay-iters", default=None)  # WSD's final anneal
    lr_wsd_decay_style: str | None = _flag("--lr-wsd-decay-style", default=None)  # one of WSD_DECAY_STYLES

    def __post_init__(self):
        """The settings that need the run's length to be checked (flag_checks has the others)."""
        warmup, decay_end = self.warmup_steps, self.decay_end
        if self.lr_decay_iters is not None and self.lr_decay_iters <= warmup:
            raise ConfigError(f"--lr-decay-iters {self.lr_decay_iters} ends the decay before the {warmup} warm-up "
                              "steps do", f"pass a --lr-decay-iters above {warmup}, or a shorter warm-up")
        if self.lr_wsd_decay_iters is not None and self.lr_wsd_decay_iters > decay_end - warmup:
            raise ConfigError(f"--lr-wsd-decay-iters {self.lr_wsd_decay_iters} is longer than the {decay_end - warmup} "
                              f"steps between the warm-up's end ({warmup}) and the decay's ({decay_end})",
                              f"pass a --lr-wsd-decay-iters of at most {decay_end - warmup}")

    @classmethod
    def from_args(cls, args, ds: dict, train_iters: int) -> "Schedule":
        """This run's: the peak is the JSON's optimizer.params.lr (--lr already written there); the
        warm-up a fraction of the steps (DEFAULT_WARMUP_FRACTION unless a flag says)."""
        fraction = args.lr_warmup_fraction
        if fraction is None and args.lr_warmup_iters is None:
            fraction = DEFAULT_WARMUP_FRACTION
        wsd = args.lr_decay_style == "WSD"
        return cls(train_iters=train_iters, lr=ds["optimizer"]["params"]["lr"], min_lr=args.min_lr or 0.0,
                   lr_decay_style=args.lr_decay_style, lr_warmup_fraction=fraction,
                   lr_warmup_iters=args.lr_warmup_iters, lr_decay_iters=args.lr_decay_iters,
                   lr_wsd_decay_iters=args.lr_wsd_decay_iters,
                   lr_wsd_decay_style=(args.lr_wsd_decay_style or "exponential") if wsd else None)

    @property
    def warmup_steps(self) -> int:
        return _warmup_steps(self.lr_warmup_iters, self.lr_warmup_fraction, self.train_iters)

    @property
    def decay_end(self) -> int:
        """The step at which the rate reaches --min-lr (and stays)."""
        return self.train_iters if self.lr_decay_iters is None else self.lr_decay_iters

    def record(self) -> dict:
        """The checkpoint's `schedule` entry, so that a resume can say what changed."""
        return dataclasses.asdict(self)

    @classmethod
    def from_record(cls, record: dict) -> "Schedule":
        return cls(**record)

    def factor(self, peak: float):
        """step -> multiple of the peak: linear warm-up from 0 over the warm-up steps, then the decay
        style down to min_lr at decay_end, held after it (Megatron's schedule): linear or cosine over the
        whole decay, WSD constant until its last lr_wsd_decay_iters steps, inverse-square-root as
        sqrt(warm-up / step) (never below min_lr; min_lr after decay_end, as Megatron's). Step i (from 0)
        is the rate of iteration i + 1. `peak` is the optimizer's rate, which a resume restores."""
        style, warmup, decay_end = self.lr_decay_style, self.warmup_steps, self.decay_end
        floor = self.min_lr / peak if peak else 0.0

        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            if style == "constant" or decay_end <= warmup:
                return 1.0
            if step > decay_end:
                return floor
            if style == "inverse-square-root":
                return max(floor, math.sqrt(max(warmup, 1) / max(step, 1)))  # the peak at step = warm-up
            if style == "WSD":
                anneal_start = decay_end - self.lr_wsd_decay_iters
                progress = min(1.0, max(0.0, (step - anneal_start) / max(1, self.lr_wsd_decay_iters)))
                return floor + (1.0 - floor) * _annealed(self.lr_wsd_decay_style, progress)
            progress = min(1.0, (step - warmup) / max(1, decay_end - warmup))
            return floor + (1.0 - floor) * _annealed(style, progress)

        return factor

    def lambda_lr(self, optimizer):
        """The scheduler DeepSpeed steps (build_engine's lr_scheduler): the peak is the optimizer's
        learning rate (--lr, else the JSON's optimizer.params.lr)."""
        import torch  # here: the module is read without torch

        return torch.optim.lr_scheduler.LambdaLR(optimizer, self.factor(optimizer.param_groups[0]["lr"]))

    def changes(self, stored: dict, length: str | None = None, named: dict | None = None) -> list:
        """'--flag now (the checkpoint's: then)' for each setting that differs from a checkpoint's
        record `stored` (a key the record lacks is its field's default, else not compared); the warm-up
        by its steps, whichever flag gave them; the run's length as `length` says it was given (the
        --train-samples of a run that gave that flag: resume.run_length), else by --train-iters. `named`:
        a field given otherwise than by its flag, by the name to say (the JSON's optimizer.params.lr)."""
        changed = []
        for field in dataclasses.fields(self):
            then = stored.get(field.name, field.default)
            if field.name in WARMUP_FIELDS or then is dataclasses.MISSING or then == getattr(self, field.name):
                continue
            if field.name == "train_iters" and length:
                changed.append(f"{length} (the checkpoint's: {then} steps)")
                continue
            name = (named or {}).get(field.name, field.metadata["flag"])
            changed.append(f"{name} {_shown(getattr(self, field.name))} (the checkpoint's: {_shown(then)})")
        if stored.get("lr_warmup_fraction") is not None or stored.get("lr_warmup_iters") is not None:
            then = _warmup_steps(stored.get("lr_warmup_iters"), stored.get("lr_warmup_fraction"),
                                 stored.get("train_iters", self.train_iters))
            if then != self.warmup_steps:
                changed.append(f"a warm-up of {self.warmup_steps} step{'s' * (self.warmup_steps != 1)} (the "
                               f"checkpoint's: {then})")
        return changed


def _warmup_steps(iters: int | None, fraction: float | None, train_iters: int) -> int:
    """The warm-up's steps: --lr-warmup-iters, else --lr-warmup-fraction of the run's steps."""
    return iters if iters is not None else int(fraction * train_iters)


def _shown(value) -> str:
    return "none" if value is None else str(value)

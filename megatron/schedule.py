"""The learning-rate schedule of a run, its keys stated once: Megatron's warm-up and decay as a
step -> factor rule (LambdaLR's), the record each checkpoint keeps of it (its `schedule`), and what
a resume says when this run's differs from that record (resume.resume_schedule). No torch at import."""
import dataclasses
import math
from dataclasses import dataclass


def _flag(name: str) -> dataclasses.Field:
    """A schedule field with the flag that sets it (named in a resume's warning)."""
    return dataclasses.field(metadata={"flag": name})


@dataclass(frozen=True)
class Schedule:
    """What shapes the learning rate over the run (the record keeps these names and values)."""
    train_iters: int = _flag("--train-iters")
    lr: float = _flag("--lr")  # the peak this run asked for; the factor scales the optimizer's own
    min_lr: float = _flag("--min-lr")
    lr_decay_style: str = _flag("--lr-decay-style")  # linear, cosine or constant
    lr_warmup_fraction: float = _flag("--lr-warmup-fraction")

    @classmethod
    def from_args(cls, args, ds: dict, train_iters: int) -> "Schedule":
        """This run's: the peak is the JSON's optimizer.params.lr (--lr already written there)."""
        return cls(train_iters=train_iters, lr=ds["optimizer"]["params"]["lr"], min_lr=args.min_lr or 0.0,
                   lr_decay_style=args.lr_decay_style, lr_warmup_fraction=args.lr_warmup_fraction)

    def record(self) -> dict:
        """The checkpoint's `schedule` entry, so that a resume can say what changed."""
        return dataclasses.asdict(self)

    @classmethod
    def from_record(cls, record: dict) -> "Schedule":
        return cls(**record)

    def factor(self, peak: float):
        """step -> multiple of the peak: linear warm-up from 0 over lr_warmup_fraction of the steps,
        then linear or cosine decay to min_lr at the last step (Megatron's schedule). Step i (from 0)
        is the rate of iteration i + 1. `peak` is the optimizer's rate, which a resume restores."""
        train_iters, style = self.train_iters, self.lr_decay_style
        warmup = int(self.lr_warmup_fraction * train_iters)
        floor = self.min_lr / peak if peak else 0.0

        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            if style == "constant" or train_iters <= warmup:
                return 1.0
            progress = min(1.0, (step - warmup) / max(1, train_iters - warmup))
            decay = 1.0 - progress if style == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
            return floor + (1.0 - floor) * decay

        return factor

    def lambda_lr(self, optimizer):
        """The scheduler DeepSpeed steps (build_engine's lr_scheduler): the peak is the optimizer's
        learning rate (--lr, else the JSON's optimizer.params.lr)."""
        import torch  # here: the module is read without torch

        return torch.optim.lr_scheduler.LambdaLR(optimizer, self.factor(optimizer.param_groups[0]["lr"]))

    def changes(self, stored: dict) -> list:
        """'--flag now (the checkpoint's: then)' for each setting that differs from a checkpoint's
        record `stored` (a key the record lacks is not compared)."""
        return [f"{field.metadata['flag']} {getattr(self, field.name)} (the checkpoint's: {stored[field.name]})"
                for field in dataclasses.fields(self)
                if field.name in stored and stored[field.name] != getattr(self, field.name)]

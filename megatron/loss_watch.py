"""The training loss watched over a run: a loss far above the run's first one (diverging, though still
finite) is said once; the checkpoints are kept with the loss at their iteration, so that the line of a
NaN names one the user can go back to rather than the newest saved while the loss was already huge;
steps skipped for non-finite values (--skip-nan-batches, fp16) are counted, and too many in a row stop
the run: the weights themselves give NaN then, and every later step would change nothing."""
import dataclasses
import math
import os

from megatron.relaunch import new_run_fix

EXPLODED_FACTOR = 100  # a loss this many times the run's first finite one: diverging
SKIPPED_IN_A_ROW_LIMIT = 5  # steps skipped for non-finite values in a row that stop the run


@dataclasses.dataclass
class SavedCheckpoint:
    folder: str
    iteration: int
    loss: float | None  # the loss of the step at its iteration; None: loaded at the start (not measured here)


@dataclasses.dataclass
class LossWatch:
    """What the training loop tells it: each step's loss and whether its update was applied (step), each
    checkpoint (saved); what it tells the user: the divergence warning, the checkpoint to go back to
    (good_checkpoint), the skipped steps (skipped_summary)."""
    first: tuple | None = None  # (iteration, loss): this run's first finite loss, the scale of the others
    last_loss: float | None = None  # the latest step's
    checkpoints: list = dataclasses.field(default_factory=list)  # SavedCheckpoint, oldest first
    diverged: bool = False  # the warning was given (once)
    steps: int = 0
    skipped: list = dataclasses.field(default_factory=list)  # iterations skipped for non-finite values
    skipped_in_a_row: int = 0
    args: object = None  # the run's flags, for the command of a new run (relaunch.new_run_fix; None: the trainer's)

    def in_range(self, loss: float | None) -> bool:
        """Finite and below EXPLODED_FACTOR x the first loss (None: a checkpoint loaded, not measured)."""
        if loss is None:
            return True
        return math.isfinite(loss) and (self.first is None or loss <= EXPLODED_FACTOR * self.first[1])

    def step(self, iteration: int, loss: float, skipped_for_nan: bool) -> str | None:
        """Notes one step (`skipped_for_nan`: its update was skipped for a NaN/inf, not an fp16 loss-scale
        overflow); returns the divergence warning the first time a finite loss leaves the range."""
        self.steps += 1
        self.last_loss = loss
        if skipped_for_nan:
            self.skipped.append(iteration)
            self.skipped_in_a_row += 1
        elif math.isfinite(loss):
            self.skipped_in_a_row = 0
        if not math.isfinite(loss):
            return None
        if self.first is None:
            self.first = (iteration, loss)
            return None
        if self.diverged or self.in_range(loss):
            return None
        self.diverged = True
        return (f"warning: the loss {loss:.4g} at iteration {iteration} is over {EXPLODED_FACTOR}x this run's first "
                f"{self.first[1]:.4g} (iteration {self.first[0]}): the training is diverging; {self._before_it()}")

    def _before_it(self) -> str:
        good = self.good_checkpoint()
        if good is None:
            return "no checkpoint was saved before it (a lower --lr may train)"
        return (f"the last checkpoint before it is {good.folder} ({_logged(good)}): a lower --lr from its weights "
                f"({new_run_fix(self.args, os.path.dirname(good.folder))}) may train")

    def saved(self, folder: str, iteration: int, loss: float | None = None, loaded: bool = False) -> None:
        self.checkpoints.append(SavedCheckpoint(folder, iteration, None if loaded else
                                                self.last_loss if loss is None else loss))

    def good_checkpoint(self) -> SavedCheckpoint | None:
        """The newest checkpoint still on disk (--keep-last removes old ones) whose loss was in range."""
        return next((saved for saved in reversed(self.checkpoints)
                     if self.in_range(saved.loss) and os.path.isdir(saved.folder)), None)

    def where_to_go_back(self) -> tuple:
        """('the last checkpoint ...' with its loss, the checkpoint to go back to or None). Where a newer
        checkpoint (out of range) is what `latest` names, the clause says to write the good one's tag there."""
        good = self.good_checkpoint()
        newest = next((saved for saved in reversed(self.checkpoints) if os.path.isdir(saved.folder)), None)
        if good is None:
            if newest is None:
                return "no checkpoint was saved before it", None
            return (f"no checkpoint from before the loss left its range is kept (the last, {newest.folder}, "
                    f"{_logged(newest)})", None)
        if good is newest:
            return f"the last checkpoint is {good.folder} ({_logged(good)})", good
        return (f"the last checkpoint whose loss was in range is {good.folder} ({_logged(good)}; the later "
                f"{newest.folder} {_logged(newest)}): write {os.path.basename(good.folder)} into "
                f"{os.path.join(os.path.dirname(good.folder), 'latest')}, then", good)

    def too_many_skipped(self) -> bool:
        return self.skipped_in_a_row >= SKIPPED_IN_A_ROW_LIMIT

    def skipped_summary(self) -> str | None:
        """The end-of-run warning when updates were skipped for NaN/inf (None: none were)."""
        if not self.skipped:
            return None
        shown = ", ".join(map(str, self.skipped[:10])) + (", ..." if len(self.skipped) > 10 else "")
        return (f"warning: {len(self.skipped)} of this run's {self.steps} updates were skipped for a non-finite loss "
                f"or gradients (iterations {shown}): those steps trained nothing")


def _logged(saved: SavedCheckpoint) -> str:
    return "loaded at the start" if saved.loss is None else f"logged loss {saved.loss:.4g}"

"""The lines that say how a run goes on (a stop, a lost rank, a NaN, a --save without `latest`) for a run
that tools/extend_context.py launched (--launched-by): they name that tool's command, which restates the
layout and model flags that `pretrain_bert.py --load SAVE` alone does not take (that resumes at SP 1, dense
attention, unpacked samples); the trainer's own runs keep `--load`. In one process, the collectives stubbed."""
import signal
from types import SimpleNamespace

import pytest

from megatron import locks, stop_signals, training
from megatron.arguments import build_parser
from megatron.errors import ConfigError
from megatron.loss_watch import LossWatch

TOOL = ["--launched-by", "extend_context.py"]


def parsed(*argv):
    return build_parser().parse_args(["--save", "ck", "--seq-length", "256", "--train-iters", "4", *argv])


class Log:
    def close(self):
        pass

    def plot(self, save):
        pass


def stop_line(monkeypatch, capsys, args, cut: str | None, validation_cut: bool = False) -> str:
    """The line of a SIGTERM stop after iteration 4, checkpoint ck/iter_0000004 already saved, on one rank."""
    for name, stub in (("get_world_size", lambda: 1), ("get_rank", lambda: 0),
                       ("all_gather_object", lambda out, value: out.__setitem__(0, value)),
                       ("broadcast_object_list", lambda values, src: None)):
        monkeypatch.setattr(stop_signals.dist, name, stub)
    monkeypatch.setattr(locks, "release_lock", lambda name: None)
    stop = stop_signals.StopSignals("tokenizer.json")
    stop.agreed = signal.SIGTERM
    assert stop.finish(args, 4, 0, "ck/iter_0000004", Log(), save=None, cut=cut,
                       validation_cut=validation_cut) == signal.SIGTERM
    return capsys.readouterr().err.strip().removeprefix("pretrain_bert.py: stopped by SIGTERM after ")


@pytest.mark.parametrize("cut,trainer,tool", [
    (None, "iteration 4; checkpoint ck/iter_0000004 holds it: resume with --load ck",
     "iteration 4; checkpoint ck/iter_0000004 holds it: rerun the same extend_context.py command"),
    ("the test loss", "the last iteration 4, before the test loss; checkpoint ck/iter_0000004 holds it: rerun with "
     "--load ck to compute the test loss",
     "the last iteration 4, before the test loss; checkpoint ck/iter_0000004 holds it: the test loss comes at the end "
     "of a run that trains: rerun the same extend_context.py command with a larger --train-iters to go on"),
    ("the validation and test losses", "the last iteration 4, before the validation and test losses; checkpoint "
     "ck/iter_0000004 holds it: rerun with --load ck to compute the validation and test losses",
     "the last iteration 4, before the validation and test losses; checkpoint ck/iter_0000004 holds it: the "
     "validation and test losses come at the end of a run that trains: rerun the same extend_context.py command with "
     "a larger --train-iters to go on")])
def test_a_stop_names_the_command_that_resumes(monkeypatch, capsys, cut, trainer, tool):
    assert stop_line(monkeypatch, capsys, parsed(), cut) == trainer
    assert stop_line(monkeypatch, capsys, parsed(*TOOL), cut) == tool


def test_a_stop_in_a_validation_before_the_last_step_says_the_resume_computes_it(monkeypatch, capsys):
    """The checkpoint records the validation the stop cut short (checkpoint.VALIDATION_CUT): the resume computes it
    before its first step. After the last step the held-out losses' line says it (the cut validation among them)."""
    assert stop_line(monkeypatch, capsys, parsed(), None, validation_cut=True) == (
        "iteration 4, before its validation loss; checkpoint ck/iter_0000004 holds it: resume with --load ck, which "
        "computes that validation loss first")
    assert stop_line(monkeypatch, capsys, parsed(*TOOL), None, validation_cut=True).endswith(
        "holds it: rerun the same extend_context.py command, which computes that validation loss first")
    assert stop_line(monkeypatch, capsys, parsed(), "the validation and test losses", validation_cut=True) == (
        stop_line(monkeypatch, capsys, parsed(), "the validation and test losses"))


def test_a_lost_rank_names_the_command_that_resumes(monkeypatch):
    monkeypatch.setattr(training.peers, "lost", lambda error: "ended")
    progress = training.Progress()
    progress.phase, progress.last_checkpoint = "the step of iteration 3", "ck/iter_0000002"
    fixes = [training.lost_rank_problem(RuntimeError("gone"), args, progress).fix for args in (parsed(), parsed(*TOOL))]
    assert fixes == ["the last checkpoint is ck/iter_0000002: resume with --load ck",
                     "the last checkpoint is ck/iter_0000002: rerun the same extend_context.py command"]


def test_a_nan_and_a_diverging_loss_name_a_new_run_of_the_command(tmp_path):
    """The checkpoint before a NaN or a loss gone far up: a new run from its weights at a lower rate, as the
    trainer's --finetune or as extend_context.py --from it at the same length (theta kept at 1x)."""
    (tmp_path / "iter_0000002").mkdir()
    for args, command in ((parsed(), f"--finetune --load {tmp_path} --lr LOWER --save ANOTHER_DIR"),
                          (parsed(*TOOL), f"extend_context.py --from {tmp_path} --seq-length 256 --save ANOTHER_DIR "
                                          "-- ... --lr LOWER")):
        watch = LossWatch(args=args)
        watch.step(1, 2.0, skipped_for_nan=False)
        watch.saved(str(tmp_path / "iter_0000002"), 2, 2.5)
        assert f"({command}) may train" in watch.step(3, 1000.0, skipped_for_nan=False)
        with pytest.raises(ConfigError) as error:
            training.check_step(args, SimpleNamespace(was_step_applied=lambda: False, fp16_enabled=lambda: False), 4,
                                float("nan"), watch, log=None)
        assert f"({command}; a resume keeps the checkpoint's peak --lr)" in error.value.fix

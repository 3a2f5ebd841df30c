"""Stop signals during training (StopSignals): every rank notes them, agrees at the next step
boundary, saves a final checkpoint and says so in one line; and the end of a run that trained every
step. training.py builds one per run and calls it from the loop; this module imports nothing of it
(the final save comes as a callable)."""
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist

from megatron import checkpoint, locks, paths
from megatron.errors import WHERE_FIX, ConfigError, DataError, cannot_use, restore_signals, stop_signals
from megatron.parallel import launcher_watch, peers
from megatron.parallel.peers import lost_rank_text, report_once
from megatron.relaunch import held_out_fix, resume_fix


END_OF_RUN = "the end of the run"  # the phase after the last step: a rank lost there cut nothing (StopSignals.complete)


class StopSignals:
    """SIGTERM / SIGINT / SIGHUP during training (a scheduler's preemption, Ctrl-C forwarded by a launch
    script, a closed terminal): the handler only notes the signal; every rank learns of it at the next
    step boundary from one all-reduce (MAX) per step, so all stop after the same iteration, save a
    final checkpoint (with --save) and exit 128 + the signal; rank 0 says so at once (the save may
    take minutes) and again once it is written. The same all-reduce carries the largest
    token id of each rank's batch: data made with another vocab stops every rank with one line,
    not an index error in one rank's embedding. Repeated signals (the deepspeed launcher sends
    its own SIGTERM) are noted and ignored from then on: the handler stays until main has closed
    the process group (the plot, the lock's release), then exit_rank ignores them. The end of the
    rank's launcher (a SIGINT or SIGTERM to the `deepspeed` command ends it alone) is a SIGTERM too
    (parallel/launcher_watch.py). Evaluation steps agree the same way: a stop is honoured within
    one step, in training and in evaluation. A signal after the last agreement of a run that trained
    every step cuts nothing: the run is complete (exit 0), and one line says so (complete)."""

    LOG_FAILED = 1000  # above any signal number: wins the MAX
    TIME_LIMIT = 999  # --exit-duration-in-mins, agreed when no rank has a signal or a failed log

    def __init__(self, tokenizer_file: str, log=None, start_up: dict | None = None, time_limit: tuple | None = None):
        """`time_limit`: (minutes, the time.monotonic() they count from) of --exit-duration-in-mins."""
        self.tokenizer_file = tokenizer_file
        self.time_limit = time_limit
        # training steps this run took (train_steps counts them): a time limit stops none before the first, nor the
        # validation a resume computes before it, so each run makes progress
        self.steps = 0
        self.start_up = start_up or {}  # the handlers main's start-up replaced (errors.raise_on_signals)
        self.log = log  # rank 0's RunLog: a run log that cannot be written (full disk) stops the run too
        self.received = self.agreed = 0
        self.received_at = None  # time.monotonic() of the first signal this rank received
        self.launcher_gone = None  # what ended, when the stop comes from the launcher's end
        self.watching = None

    def install(self) -> None:
        """Notes signals from now on; main's `finally` gives its caller's handlers back."""
        restore_signals(self.start_up)  # from here a signal is noted, the step finished and saved
        if threading.current_thread() is threading.main_thread():  # signal handlers live there only
            for signum in stop_signals():
                signal.signal(signum, self._note)
        self.watching = launcher_watch.watch(self._launcher_ended)

    def _note(self, signum, frame) -> None:
        """The first signal names the stop; until the ranks agree on it, a signal also takes the place of the
        launcher's end: a signal to the whole job (a scheduler's, Ctrl-C) ends the `deepspeed` command at once,
        and the watch sees that first while this thread, inside a long call (torch.save), has not yet run this
        handler. The time stays the earlier one: launch.py's 30 s (_grace_left) count from it."""
        if not self.received or (self.launcher_gone and not self.agreed):
            self.received_at = self.received_at if self.received else time.monotonic()
            self.received, self.launcher_gone = signum, None

    def _launcher_ended(self, description: str) -> None:
        if not self.received:  # else the signal that came first names the stop
            self.received_at = time.monotonic()
            self.received, self.launcher_gone = signal.SIGTERM, description

    def stop_watching(self) -> None:
        if self.watching:
            self.watching.set()

    @staticmethod
    def _largest(values: list) -> list:
        """The largest of each value over the ranks (one all-reduce)."""
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
        flags = torch.tensor(values, dtype=torch.long, device=device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        return [int(value) for value in flags.tolist()]

    def agree(self, step: list, vocab_size: int) -> None:
        """Called by every rank with its micro-batches of one step (train or eval)."""
        top = max(int(batch.tokens.max()) for batch in step)
        received = self.received or (self.LOG_FAILED if self.log is not None and self.log.failure else 0)
        # the time limit apart: a signal on any rank names the stop (and its exit code), the limit only alone
        received, top, out_of_time = self._largest([received, top, int(self._out_of_time())])
        received = received or (self.TIME_LIMIT if out_of_time else 0)
        if top >= vocab_size:
            raise DataError(f"the data holds token id {top}, beyond the {vocab_size} tokens of the vocab "
                            f"{self.tokenizer_file}", "pass the --vocab-file (or --tokenizer-file) the data was "
                            f"preprocessed with, or rerun {paths.in_repository('tools/preprocess_data.py')} "
                            "with this one")
        self.agreed = self.agreed or received

    def _out_of_time(self) -> bool:
        """Past --exit-duration-in-mins, with a step of this run taken (each run makes progress)."""
        if self.time_limit is None or not self.steps:
            return False
        minutes, start = self.time_limit
        return time.monotonic() - start >= 60 * minutes

    def _name(self, signum: int, gone: str | None) -> str:
        """What stopped the run, as its lines say it."""
        if signum == self.LOG_FAILED:
            return "a failed write of the run log"
        if signum == self.TIME_LIMIT:
            return f"the time limit (--exit-duration-in-mins {self.time_limit[0]:g})"
        if gone and signum == signal.SIGTERM:
            return f"the end of {gone}"
        return signal.Signals(signum).name

    def _grace_left(self) -> float | None:
        """Seconds until DeepSpeed's launch.py would kill this rank, had the signal that stops the run
        reached it too (a Ctrl-C in its terminal, a scheduler signalling the whole job); None where
        it cannot have: another parent, or no SIGINT / SIGTERM of this rank's own (a launcher's end with no
        signal here before the agreement: the `deepspeed` command signalled alone, launch.py killed)."""
        if self.received not in (signal.SIGINT, signal.SIGTERM) or self.launcher_gone or \
                not launcher_watch.under_deepspeed_launch():
            return None
        return launcher_watch.DEEPSPEED_KILL_S - (time.monotonic() - self.received_at)

    def finish(self, args, iteration: int, first_iteration: int, last_checkpoint, log, save,
               cut: str | None = None, validation_cut: bool = False) -> int | None:
        """The agreed stop: saves what was trained since the last checkpoint; returns the signal number
        (None for the time limit: the job ends as planned, exit 0, and a rerun with --load goes on), or
        raises the run log's write failure as one line (every rank alike). `cut`: the held-out losses ("the
        test loss", ...) the stop came before, after the last step (a rerun with --load computes them).
        `validation_cut`: before the last step, the stop cut the validation after `iteration` short, which its
        checkpoint records and a resume computes first. `save`: writes the final checkpoint and returns its
        folder (training.save_checkpoint)."""
        noticed = [None] * dist.get_world_size()  # the rank that saw its launcher end may not be the one printing
        dist.all_gather_object(noticed, self.launcher_gone)
        name = self._name(self.agreed, next((description for description in noticed if description), None))
        self.stop_watching()
        folder = args.save and os.path.join(args.save, checkpoint.tag_for(iteration))
        if args.save and iteration > first_iteration and last_checkpoint != folder:
            if dist.get_rank() == 0:
                print(stop_acknowledgement(name, iteration, folder, log.last_save_s, self._grace_left()),
                      file=sys.stderr, flush=True)
            last_checkpoint = save()
        locks.release_lock(locks.LOCK)  # before the plot: --save is free once its last checkpoint is written
        if self.agreed == self.LOG_FAILED:
            failure = [log.failure]
            dist.broadcast_object_list(failure, src=0)
            held = (f"checkpoint {last_checkpoint} holds iteration {iteration}: {resume_fix(args, args.save)}"
                    if args.save and last_checkpoint else f"no checkpoint holds iteration {iteration}")
            raise ConfigError(failure[0][0], f"{failure[0][1]}; {held}")
        validation_cut = validation_cut and not cut
        when = (f"after the last iteration {iteration}, before {cut}" if cut else
                f"after iteration {iteration}{', before its validation loss' * validation_cut}")
        if args.save and last_checkpoint:
            line = (f"stopped by {name} {when}; checkpoint {last_checkpoint} holds it: "
                    + (held_out_fix(args, args.save, cut) if cut else resume_fix(args, args.save)
                       + ", which computes that validation loss first" * validation_cut))
        elif args.save:  # before this run's first step: nothing to save
            line = f"stopped by {name} before the first step of this run (iteration {iteration}); nothing was saved"
        else:
            line = (f"stopped by {name} {when}; no checkpoint holds it: pass --save DIR "
                    "to keep the progress of a stopped run")
        failure = [None]  # rank 0's: its log could not be closed (the plot on a full disk)
        try:
            log.close()
            if dist.get_rank() == 0:  # before the plot, which takes seconds on a long run
                print(f"pretrain_bert.py: {line}", file=sys.stderr, flush=True)
            log.plot(args.save)
        except ConfigError as error:
            failure = [(error.problem, error.fix)]
        except OSError as error:
            if not error.filename:
                raise
            unusable = cannot_use(error, WHERE_FIX)
            failure = [(unusable.problem, unusable.fix)]
        # the launcher ends every rank once one exits non-zero (128 + the signal too): none leaves before
        # rank 0 has closed its log and printed its line, and all leave alike
        dist.broadcast_object_list(failure, src=0)
        if failure[0]:
            raise ConfigError(*failure[0])
        return None if self.agreed == self.TIME_LIMIT else self.agreed

    def complete(self, args, iteration: int, last_checkpoint, log) -> None:
        """The end of a run that trained every step. A signal after the last agreement (during the
        final save without a test set, or after the test evaluation) cut nothing: the run is
        complete, exits 0, and one line says so; also for one during rank 0's plot. Nor does a rank
        lost at this last agreement (peers.lost): the others end alike, exit 0, and one line says
        that the run is complete (the launcher's exit code is the lost rank's own)."""
        lost = None
        try:
            [late] = self._largest([self.received])  # the rank that received it may not be rank 0
        except RuntimeError as error:
            if peers.lost(error) is None:
                raise
            late, lost = self.received, lost_rank_text(peers.lost(error), args, END_OF_RUN)[0]
        self.stop_watching()
        locks.release_lock(locks.LOCK)  # before the plot: --save is free once its last checkpoint is written
        log.close()
        if lost:
            report_once(f"pretrain_bert.py: {lost}; the run is complete: "
                        f"{self._held(args, iteration, last_checkpoint)}")
        self._say_complete(late, args, iteration, last_checkpoint)
        log.plot(args.save)
        if not late:
            self._say_complete(self.received, args, iteration, last_checkpoint)

    def _say_complete(self, signum: int, args, iteration: int, last_checkpoint) -> None:
        if signum and dist.get_rank() == 0:
            print(f"pretrain_bert.py: {self._name(signum, self.launcher_gone)} came after the last step; the run "
                  f"is complete: {self._held(args, iteration, last_checkpoint)}", file=sys.stderr, flush=True)

    @staticmethod
    def _held(args, iteration: int, last_checkpoint) -> str:
        return (f"checkpoint {last_checkpoint} holds iteration {iteration}" if args.save and last_checkpoint
                else f"no checkpoint holds iteration {iteration} (no --save)")


def stop_acknowledgement(name: str, iteration: int, folder: str, last_save_s: float | None,
                         grace_left_s: float | None) -> str:
    """Rank 0's line once the ranks agree to stop and the final save starts: a long save otherwise
    looks like a frozen run, and a user reaching for `kill -9` loses it. `grace_left_s`: the seconds
    DeepSpeed's launch.py leaves this rank before SIGKILL, had the signal reached it too (None: it
    cannot have); named when the last save took longer."""
    took = f"the last save took {last_save_s:.0f} s" if last_save_s is not None else "the first save of this run"
    line = (f"pretrain_bert.py: stopping after iteration {iteration} ({name}): saving checkpoint {folder} ({took}); "
            "further signals are ignored until it is written")
    if grace_left_s is not None and last_save_s is not None and last_save_s > grace_left_s:
        line += (f"; if the signal reached DeepSpeed's launch.py too (Ctrl-C in its terminal, a signal to the whole "
                 f"job), it kills the ranks in {max(grace_left_s, 0):.0f} s, before such a save ends: see "
                 f"{paths.in_repository('docs/resuming.md')}")
    return line

"""DeepSpeed's `deepspeed` command (deepspeed.launcher.runner.main, which .venv/bin/deepspeed runs) with
the same arguments, for a tool that hands its process over to it (extend_context.py), where a Ctrl-C
in the seconds after the tool printed the command is one line, not a KeyboardInterrupt traceback from
inside torch's import:
  - the runner's imports: `deepspeed: stopped by SIGINT during start-up ...` (SIGTERM, SIGHUP too);
  - the runner's wait for DeepSpeed's launch.py (it forwards no signal, the ranks stop on their own,
    each saying what it saved, launcher_watch): one line too;
  - launch.py, which the runner starts as `python -u -m deepspeed.launcher.launch ...` and which a
    terminal's Ctrl-C reaches directly, during its own imports: it runs under this module as well
    (`-m megatron.parallel.deepspeed_command deepspeed.launcher.launch ...`) and ends without a line
    of its own (the runner's says it). Its command line still names deepspeed.launcher.launch.
A process that died by signal N reads as status 128 + N, as in a shell: the runner passes on only a
positive return code, so a launch.py killed by SIGKILL (the OOM killer, a node agent) would end the
command with 0 short of --train-iters, and launch.py, when a rank dies by SIGKILL, exits with -9 (247).
A launch.py stopped by SIGTERM or SIGINT of its own (its sigkill_handler stops the ranks, then exits 1, which
a scheduler reads as a failure) exits 128 + N too.
Run as `python -P -m megatron.parallel.deepspeed_command ...` (-P: the megatron the tool imported,
not one in the working directory); launcher_watch counts it among the launchers.
"""
import logging
import signal
import subprocess
import sys

from megatron.errors import Interrupted, raise_on_signals, restore_signals
from megatron.parallel.launch_env import LAUNCH_SCRIPT, launch_script

PROG = "deepspeed"
MODULE = "megatron.parallel.deepspeed_command"
LAUNCH = "deepspeed.launcher.launch"
LAUNCH_START = ["-u", "-m", LAUNCH]  # how runner.py starts launch.py after the interpreter (DeepSpeed 0.19)
STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STARTED_RANKS_STOP = "; ranks it had started stop on their own, each saying what it saved"


def signal_as_status(code):
    """A return code of -N (death by signal N) as 128 + N; others as they are."""
    return 128 - code if isinstance(code, int) and code < 0 else code


class _LaunchProcess(subprocess.Popen):
    """launch.py's process, whose wait() gives a death by signal as 128 + N (signal_as_status)."""

    def wait(self, timeout=None):
        self.returncode = signal_as_status(super().wait(timeout))
        return self.returncode


class _GuardedLaunch:
    """runner.py's `subprocess`, whose Popen starts launch.py under this module; other commands as they are."""

    def __getattr__(self, name):
        return getattr(subprocess, name)

    @staticmethod
    def Popen(command, *args, **kwargs):  # noqa: N802 (subprocess' name)
        if list(command[1:4]) == LAUNCH_START:
            command = [command[0], "-u", "-P", "-m", MODULE, LAUNCH, *command[4:]]
            return _LaunchProcess(command, *args, **kwargs)
        return subprocess.Popen(command, *args, **kwargs)


class _NotedStops:
    """launch.py's `signal` module, whose handlers note the signal they handle first: its sigkill_handler stops
    the ranks, then exits 1 (main gives 128 + the signal)."""

    def __init__(self):
        self.received = None

    def __getattr__(self, name):
        return getattr(signal, name)

    def signal(self, signum, handler):
        def noted(number, frame):
            self.received = self.received or number
            return handler(number, frame)

        return signal.signal(signum, noted if callable(handler) else handler)


DEEPSPEED_LOGGER = "DeepSpeed"  # deepspeed.utils.logger's name (LoggerFactory.create_logger)
# a rank that stopped, as launch.py sees it
STOP_STATUSES = {str(code) for stop in STOPS for code in (128 + stop, -stop)}
# a rank that refused to start (or to go on) with its one line, `pretrain_bert.py: error: ...` (or argparse's, or
# python's `can't open file`): the line said what and how to fix it
SAID_ITS_LINE = "2"


def not_a_stops_kill_lines(record) -> bool:
    """launch.py's sigkill_handler lines: after a rank stopped on a signal (Ctrl-C to the main job), `Killing
    subprocess N` for each rank and `[ERROR] [<the 60-argument rank command>] exits with return code = 130`
    came after the rank's own line (what it saved, how to resume), burying it; after a start-up refusal (status 2)
    the [ERROR] line came after the trainer's one line, the last the user read (and it names the last rank's
    command, whichever failed). Only the [ERROR] line of a rank that failed otherwise (a traceback's 1, a
    death by SIGKILL) stays. A logging filter of DeepSpeed's logger, in launch.py's process (False: dropped)."""
    if record.funcName != "sigkill_handler":
        return True
    status = record.getMessage().rsplit(" = ", 1)[-1]
    return record.levelno >= logging.ERROR and status not in STOP_STATUSES and status != SAID_ITS_LINE


def _deepspeed_main(launch: bool, stops: _NotedStops):
    """launch.py's main, whose signals `stops` notes, or the runner's, which starts launch.py under this module."""
    if launch:
        from deepspeed.launcher import launch as launch_module

        logging.getLogger(DEEPSPEED_LOGGER).addFilter(not_a_stops_kill_lines)
        launch_module.signal = stops
        return launch_module.main
    from deepspeed.launcher import runner
    runner.subprocess = _GuardedLaunch()
    # the launch script's name reaches the ranks on the nodes the runner starts by ssh (their rendezvous lines)
    runner.EXPORT_ENVS = [*runner.EXPORT_ENVS, LAUNCH_SCRIPT]
    return runner.main


def main() -> int:
    launch = sys.argv[1:2] == [LAUNCH]
    if launch:
        del sys.argv[1]  # launch.py parses the rest
    importing, stops = raise_on_signals(), _NotedStops()
    try:
        run = _deepspeed_main(launch, stops)
        restore_signals(importing)  # from here on, the signals are as under DeepSpeed's own commands
        run()
    except KeyboardInterrupt as error:  # Interrupted during the imports; Python's own once DeepSpeed runs
        signum = getattr(error, "signum", signal.SIGINT)
        if not launch:  # launch.py's is reported by the runner, which the same Ctrl-C reaches
            before = " during start-up, before any rank started; nothing was saved" if isinstance(
                error, Interrupted) else STARTED_RANKS_STOP
            print(f"{PROG}: stopped by {signal.Signals(signum).name}{before}", file=sys.stderr, flush=True)
        return 128 + signum
    except SystemExit as error:  # the runner passes launch.py's exit code on: launch.py stopped by the same
        # Ctrl-C can end before this process handles its own signal (a loaded machine), which then never shows
        if launch:  # launch.py exits with a rank's return code (-9 for one killed by SIGKILL), or 1 after a stop
            return 128 + stops.received if stops.received and error.code == 1 else signal_as_status(error.code)
        signum = error.code - 128 if isinstance(error.code, int) and error.code - 128 in STOPS else None
        if signum is not None and not launch_script():  # a launch script sends its stop to the ranks alone:
            # launch.py's 128 + N is then theirs, not a sign that a Ctrl-C reached this process too
            print(f"{PROG}: stopped by {signal.Signals(signum).name}{STARTED_RANKS_STOP}", file=sys.stderr, flush=True)
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())

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
launch.py of the node that hosts rank 0, in a launch of several nodes, also tells the other nodes when that node
stopped before rank 0 began its rendezvous (tell_other_nodes): their ranks would wait out --rendezvous-timeout.
Run as `python -P -m megatron.parallel.deepspeed_command ...` (-P: the megatron the tool imported,
not one in the working directory); launcher_watch counts it among the launchers.
"""
import argparse
import base64
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import traceback

from megatron.errors import Interrupted, raise_on_signals, restore_signals
from megatron.parallel.launch_env import (LAUNCH_SCRIPT, RANK_0_STATE, RENDEZVOUS_BEGUN, launch_script,
                                          serve_stop_notice)

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


NOTICE_SECONDS = 30.0  # at most, after rank 0's node stopped: the other nodes' ranks may still be importing torch


def other_nodes_ranks(argv: list) -> tuple[int, int] | None:
    """(ranks on the other nodes, MASTER_PORT) for launch.py's arguments `argv` on the node that hosts rank 0 (node
    rank 0) of a launch of several nodes; None on another node, or alone."""
    parser = argparse.ArgumentParser(add_help=False)
    for name, kind in (("--node_rank", int), ("--master_port", int), ("--world_info", str)):
        parser.add_argument(name, type=kind)
    try:
        known, _ = parser.parse_known_args(argv)
        slots = list(json.loads(base64.urlsafe_b64decode(known.world_info)).values())
    except (SystemExit, TypeError, ValueError):  # launch.py's own parse says what is wrong
        return None
    others = sum(map(len, slots[1:]))
    if known.node_rank not in (0, None) or not others or known.master_port is None:
        return None
    return others, known.master_port


def tell_other_nodes(status, state_path: str, others: tuple) -> None:
    """After launch.py on rank 0's node ended with `status` (not 0) before rank 0 began its rendezvous: the ranks on
    the other nodes, waiting for rank 0's store at MASTER_ADDR:MASTER_PORT, read why here and stop at once
    (serve_stop_notice, for NOTICE_SECONDS at most, or until each of them connected), saying so in one line unless
    they all connected at once. Rank 0's own error line, when it said one, is the why (launch_env.note_rank_0_state)."""
    readers, port = others
    try:
        with open(state_path, encoding="utf-8") as state_file:
            said = state_file.read().strip()
    except OSError:
        said = ""
    if said == RENDEZVOUS_BEGUN:  # its store told them, or rank 0 could not open it (the port taken: its line)
        return
    host = socket.gethostname()
    if said:
        why = f"rank 0 on {host} stopped at start-up with its own error ({said.split(': error: ', 1)[-1]})"
    else:
        how = (f"killed by {signal.Signals(status - 128).name}" if isinstance(status, int) and 128 < status < 160
               and status - 128 in signal.valid_signals() else f"status {status}")
        why = (f"its launch on {host} ended ({how}) before rank 0 began it, e.g. a failed import; its traceback or "
               "line is in that node's output")
    with contextlib.suppress(KeyboardInterrupt):  # a Ctrl-C here ends the wait, silently (the error is said)
        serve_stop_notice(port, why, readers, NOTICE_SECONDS, lambda left, unanswered: print(
            f"{PROG}: rank 0's node stopped before the rendezvous: waiting at port {port} for up to {left:.0f} s "
            f"to tell the {unanswered} rank{'s' * (unanswered > 1)} of the other nodes not connected yet why; "
            "Ctrl-C ends the wait", file=sys.stderr, flush=True))


def main() -> int:
    launch = sys.argv[1:2] == [LAUNCH]
    if launch:
        del sys.argv[1]  # launch.py parses the rest
        others, state_path = other_nodes_ranks(sys.argv[1:]), None
        with contextlib.suppress(OSError):  # no temporary folder: the other nodes wait as before
            if others:
                descriptor, state_path = tempfile.mkstemp(prefix="megatron_rank_0_state_")
                os.close(descriptor)
        if state_path:
            return _launch_on_node_0(state_path, others)
    return _main(launch)


def _launch_on_node_0(state_path: str, others: tuple) -> int:
    """launch.py on rank 0's node, which tells the other nodes when that node stopped before the rendezvous."""
    os.environ[RANK_0_STATE] = state_path  # to its ranks (launch.py passes its environment on)
    try:
        try:
            status = _main(True)
        except Exception:  # launch.py itself failed (its imports): its traceback first, then the notice
            traceback.print_exc()
            status = 1
        if isinstance(status, int) and status and status - 128 not in STOPS:  # a stop asked for returns at once
            tell_other_nodes(status, state_path, others)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(state_path)  # after tell_other_nodes read it
    return status


def _main(launch: bool) -> int:
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

"""The trainer runs a benchmark starts through the deepspeed launcher (soak.py, main_job.py, gpu_repeat.py),
stopped with their ranks when the benchmark ends, however it ends.

Each launch is a session of its own, so the launcher and every rank it starts form one process group that
a benchmark can stop as a whole: SIGTERM to a benchmark (a scheduler, `timeout`, `kill`) reached it alone,
and a plain Popen's launcher and ranks trained on. Ctrl-C in a terminal no longer reaches them directly
either: the benchmark's clean-up stops them (run_benchmark raises on each stop signal, so it runs).
"""
import contextlib
import os
import signal
import subprocess
import time

STOP_GRACE_S = 120  # a stopped trainer's ranks end within seconds; past this they are killed
KILLED_S = 10  # how long the killed processes get to be gone


class Launches:
    """`with Launches() as launches: run = launches.start(command, ...)`: every launch started in the block is
    stopped at its end, all at once, so a run that is still starting is stopped with the others: SIGTERM to its
    process group, then the block waits until every process of it has ended (SIGKILL after STOP_GRACE_S)."""

    def __init__(self):
        self.runs = []

    def start(self, command: list, **popen) -> subprocess.Popen:
        """Popen(command, **popen) in a session of its own."""
        run = subprocess.Popen(command, start_new_session=True, **popen)
        self.runs.append(run)
        return run

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for run in self.runs:  # its group too where the launcher has ended: a rank it left
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for run in self.runs:
            if not _ended(run, deadline):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(run.pid, signal.SIGKILL)
                _ended(run, time.monotonic() + KILLED_S)
        return False


def _ended(run: subprocess.Popen, deadline: float) -> bool:
    """Waits until the launcher `run` and every process of its group have ended (a rank may still be stopping
    when its launcher has gone), or `deadline` has passed -> whether they have."""
    while run.poll() is None or _group_runs(run.pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _group_runs(group: int) -> bool:
    """Whether a process of the process group `group` runs (one that ended but is not yet reaped does not)."""
    import psutil  # DeepSpeed's dependency

    for process in psutil.process_iter(["status"]):
        with contextlib.suppress(psutil.Error, OSError):
            if process.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(process.pid) == group:
                return True
    return False

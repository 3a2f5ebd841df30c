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

STOP_GRACE_S = 120  # a stopped trainer's ranks end within seconds; past this they are killed


class Launches:
    """`with Launches() as launches: run = launches.start(command, ...)`: every launch started in the block is
    stopped at its end (SIGTERM to its process group, SIGKILL after STOP_GRACE_S), all at once, so a run that
    is still starting is stopped with the others."""

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
        for run in self.runs:
            try:
                run.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(run.pid, signal.SIGKILL)
                run.wait()
        return False

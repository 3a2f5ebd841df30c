"""Noticing that this rank's launcher is gone, so that the rank stops as on SIGTERM.

The `deepspeed` command runs `python -m deepspeed.launcher.launch`, which starts the ranks. A
SIGINT or SIGTERM to the `deepspeed` command ends it alone (runner.py forwards signals only to
pdsh jobs), leaving launch.py and the ranks training; launch.py itself, when killed by SIGKILL,
forwards nothing. A rank therefore watches its parent when that is a launcher (DeepSpeed's
launch.py, torchrun) and, when the parent is launch.py started by the `deepspeed` command, that
command too. A process is named by its pid and its start time, so a reused pid is not taken for
the launcher still running. Linux (/proc) only: elsewhere nothing is watched.
"""
import os
import threading

POLL_SECONDS = 1.0


def _stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat from field 3 (the state) on, after the command name, which may hold spaces;
    None when there is no such process (or no /proc), or when it has ended but is not yet reaped
    (state Z or X: a launcher killed under a wrapper that never waits keeps its entry)."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            stat = file.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return None if fields[0] in ("Z", "X") else fields


def start_time(pid: int) -> str | None:
    """The process' start time in clock ticks since boot, or None when there is no such process
    or it has ended (a zombie)."""
    fields = _stat(pid)
    return fields[19] if fields else None  # field 22


def _parent_of(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[1]) if fields else None  # field 4


def _command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            return file.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


LAUNCHERS = ("deepspeed", "torchrun", "torch.distributed.run", "torch.distributed.launch",
             "megatron.parallel.deepspeed_command")  # the last: the deepspeed command as extend_context.py runs it


def launcher_processes() -> list[tuple[int, str | None, str]]:
    """(pid, start time, description) of the processes whose end should stop this rank: a parent
    that is a launcher (not a shell: `nohup python pretrain_bert.py &` outlives its shell), and the
    `deepspeed` command above DeepSpeed's launch.py."""
    parent = os.getppid()
    command = _command_line(parent)
    if parent <= 1 or not _is_launcher(command):
        return []
    watched = [(parent, start_time(parent), f"its launcher (pid {parent})")]
    grandparent = _parent_of(parent)
    if _is_deepspeed_launch(command) and grandparent and grandparent > 1 \
            and _is_launcher(_command_line(grandparent)):
        watched.append((grandparent, start_time(grandparent), f"the deepspeed command (pid {grandparent})"))
    return watched


def _is_launcher(command: str) -> bool:
    """Whether a command line runs a launcher: a program or script named one (`deepspeed`,
    `torchrun`) or a launcher module (`python -m torch.distributed.run`), not merely a path that
    mentions one (`bash examples_deepspeed/run.sh`)."""
    words = command.split()
    programs = {os.path.basename(word) for word in words[:3]}  # the interpreter, then the script
    modules = {words[i + 1] for i, word in enumerate(words[:-1]) if word == "-m"}
    return bool(programs & set(LAUNCHERS) or any(module.startswith(LAUNCHERS) for module in modules))


def _is_deepspeed_launch(command: str) -> bool:
    return "deepspeed.launcher.launch" in command.split()


# DeepSpeed 0.19.8's launch.py, on SIGINT or SIGTERM, for each rank in turn: SIGTERM to the rank and its
# children, psutil.wait_procs(timeout=30), then SIGKILL to those still running (terminate_process_tree)
DEEPSPEED_KILL_S = 30


def under_deepspeed_launch() -> bool:
    """Whether this rank's parent is DeepSpeed's per-node launch.py, which kills it DEEPSPEED_KILL_S
    after a SIGINT or SIGTERM reaches the launcher."""
    return _is_deepspeed_launch(_command_line(os.getppid()))


_noted = None  # launcher_processes() at the rank's start (note_launchers), when it was called


def note_launchers() -> None:
    """Notes the launcher processes first thing in a rank, before seconds of imports and set-up:
    once the `deepspeed` command has ended, launch.py's parent is init and the command can no
    longer be found, so a watch that started later would miss that end."""
    global _noted
    _noted = launcher_processes()


def watch(on_gone) -> threading.Event:
    """Calls `on_gone(description)` once, from a daemon thread, when a launcher process (noted at
    the start, else now) ends, at once if one has already; returns the event that stops the watching."""
    stopped = threading.Event()
    watched = launcher_processes() if _noted is None else _noted

    def poll():
        while watched:
            for pid, started, description in watched:
                if start_time(pid) != started:  # gone, or its pid taken by another process
                    on_gone(description)
                    return
            if stopped.wait(POLL_SECONDS):
                return

    threading.Thread(target=poll, name="launcher-watch", daemon=True).start()
    return stopped

"""Who this process is before any process group exists, as its launcher said in the environment:
its global rank (env:// or an MPI launcher's), its index on its node, how a rank that leaves
an error line to rank 0 waits for it, and the first rank's warning lines. No torch: the argument
parser and the tools use it."""
import os
import sys
import time


def launcher_rank() -> int:
    """This process' global rank as its launcher set it before any process group exists: the env://
    RANK (deepspeed, torchrun), else an MPI launcher's; 0 for a process started by hand."""
    return _first_set(("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK"))


def local_rank() -> int:
    """This rank's index on its node: the env:// LOCAL_RANK, else an MPI launcher's (before
    deepspeed.init_distributed sets LOCAL_RANK from it); 0 for a single process."""
    return _first_set(("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK"))


def prints_for_its_node() -> bool:
    """Whether this rank prints a start-up refusal made before any process group exists: rank 0, and each
    node's first rank, whose node's output (a launch per node: pdsh, a scheduler's per-node log) shows nothing
    else of why its ranks stopped (a path that exists on rank 0's node alone). One line per node, not per rank."""
    return launcher_rank() == 0 or local_rank() == 0


def _first_set(names: tuple) -> int:
    """The first of the variables `names` that is set (not blank), as a rank: 0 if none is, or if its
    value is not a number (the launcher's own check names it)."""
    for name in names:
        value = os.environ.get(name, "").strip()
        if value:
            return int(value) if value.isdigit() else 0
    return 0


# the launch script (examples_deepspeed/*.sh, launcher_group.sh) that started this run, by name: it takes the
# rendezvous from MASTER_ADDR and MASTER_PORT in its environment, not from the launcher's flags, and stops the
# ranks itself on a signal (deepspeed_command.py). DeepSpeed's runner under deepspeed_command.py passes it to the
# nodes it reaches by ssh.
LAUNCH_SCRIPT = "MEGATRON_LAUNCH_SCRIPT"


def launch_script() -> str | None:
    """The launch script that started this run (LAUNCH_SCRIPT), else None: the deepspeed command, torchrun, a tool."""
    return os.environ.get(LAUNCH_SCRIPT, "").strip() or None


def rendezvous_setting(*names: str) -> str:
    """Where the user of this launch sets the rendezvous `names` (MASTER_ADDR, MASTER_PORT), as an error's fix names
    it: the environment of the launch script that started the run, else the launcher's flags."""
    script = launch_script()
    if script:
        return f"{' and '.join(names)} in the environment of {script}"
    return "the launcher's " + " and ".join(f"--{name.lower()}" for name in names)


PRINTER_WAIT = 10.0  # seconds at most a rank that leaves an error line to another rank waits for it


def outlive_rank_0(since: float | None = None) -> None:
    """Before any process group exists, a rank that leaves an error line to rank 0 must not exit
    first: the launcher ends every rank once one exits non-zero, rank 0 too, perhaps before it has
    printed. Nothing tells when it has; it exits right after, and the launcher then ends this rank,
    else this returns PRINTER_WAIT seconds after `since` (time.monotonic(); now if None). A process of a
    world of 1 does not wait."""
    if os.environ.get("WORLD_SIZE", "1").strip() not in ("", "1"):
        time.sleep(max(0.0, (time.monotonic() if since is None else since) + PRINTER_WAIT - time.monotonic()))


def print_warnings(notes: list) -> None:
    """One `warning:` line per note (None: none) from the first rank, also before the process group exists."""
    if launcher_rank() == 0:
        for note in filter(None, notes):
            print(f"warning: {note}", file=sys.stderr, flush=True)


# Rank 0's node stopped before its rendezvous (flags refused, an import that died, a killed rank): the other nodes'
# ranks would wait out --rendezvous-timeout at MASTER_ADDR:MASTER_PORT, where nothing listens. The launch.py of that
# node (deepspeed_command.py) then listens there itself for a while and answers every connection with one line,
# STOP_NOTICE and why; a rank that reads it stops at once (device.rendezvous, device.post_refusal). Whether rank 0
# began its rendezvous (then its store said everything) and its own error line reach launch.py in the file RANK_0_STATE
# names, which launch.py sets for its ranks.
RANK_0_STATE = "MEGATRON_RANK_0_STATE"
RENDEZVOUS_BEGUN = "rendezvous begun"
STOP_NOTICE = b"megatron: rank 0's node stopped before the rendezvous: "  # then why, then a newline
NOTICE_WAIT = 0.3  # seconds a rank reads a listener at MASTER_PORT for STOP_NOTICE: rank 0's store says nothing first
QUIET_SECONDS = 1.0  # serve_stop_notice says nothing for so long: the ranks already waiting connect (every 0.2 s)


def note_rank_0_state(state: str) -> None:
    """On rank 0 of a launch.py that asked for it (RANK_0_STATE): RENDEZVOUS_BEGUN, or its error line before then."""
    path = os.environ.get(RANK_0_STATE, "")
    if not path or launcher_rank() != 0:
        return
    try:
        with open(path, "r+", encoding="utf-8") as state_file:
            if state_file.read() != RENDEZVOUS_BEGUN:
                state_file.seek(0)
                state_file.truncate()
                state_file.write(state)
    except OSError:  # launch.py's file is gone: nothing to tell
        pass


def serve_stop_notice(port: int, why: str, readers: int, seconds: float, waiting=None) -> int:
    """Listens at `port` (all addresses, as rank 0's store would) for `seconds` at most, or until `readers`
    connections were answered, and answers each with STOP_NOTICE + `why`; -> how many were. No torch: the node's
    torch may be what failed. 0 at once when the port cannot be had (another program holds it: rank 0's own error).
    `waiting(seconds_left, readers_left)` is called once if the readers have not all connected within
    QUIET_SECONDS: the node then says why it waits (ranks already waiting connect within it, unsaid)."""
    import socket

    try:
        server = socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True) \
            if socket.has_dualstack_ipv6() else socket.create_server(("", port))
    except OSError:
        return 0
    answered, began = 0, time.monotonic()
    until, said = began + seconds, waiting is None
    with server:
        while answered < readers and (now := time.monotonic()) < until:
            if not said and now >= began + QUIET_SECONDS:
                waiting(until - now, readers - answered)
                said = True
            server.settimeout(max(0.01, (until if said else min(until, began + QUIET_SECONDS)) - now))
            try:
                connection, _ = server.accept()
            except (TimeoutError, OSError):
                continue
            with connection:
                try:
                    connection.sendall(STOP_NOTICE + why.encode() + b"\n")
                    answered += 1
                except OSError:
                    pass
    return answered

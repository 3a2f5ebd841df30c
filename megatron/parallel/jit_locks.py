"""Lock files left by a JIT build that was killed (DeepSpeed's shared-memory op on CPU, FusedAdam,
CPUAdam, Muon's FusedAdam): torch creates `<extensions dir>/<op>/lock` before it builds the op and
removes it after, so a build killed mid-way (SIGKILL, a preempted job) leaves it, and every later
start then waits on it forever without a word. A build holds its lock file open while it runs, so
a lock that no process on this host holds is named at start-up, and removed once it is older than
any build takes (it could still be a build on another node sharing the folder until then).
"""
import contextlib
import os
import time
from pathlib import Path

STALE_AFTER_S = 1800  # no op builds this long: an older lock nobody here holds is left over


def extensions_roots() -> list[Path]:
    """Where torch's cpp_extension builds: $TORCH_EXTENSIONS_DIR, else its default root (whose
    ops sit one folder deeper, under py<version>_<accelerator>)."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root:
        return [Path(root)]
    from torch.utils.cpp_extension import get_default_build_root

    return [path for path in Path(get_default_build_root()).glob("py*") if path.is_dir()]


def held_open() -> set[tuple]:
    """(device, inode) of every file a process on this host that we may inspect holds open (by
    identity, not name: a lock opened through another mount or a symlink is the same file)."""
    held = set()
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            descriptors = list(fd_dir.iterdir())
        except OSError:  # a process that ended, or one of another user
            continue
        for fd in descriptors:
            try:
                status = fd.stat()  # follows the link to the open file
            except OSError:  # closed meanwhile: the others of this process still count
                continue
            held.add((status.st_dev, status.st_ino))
    return held


def clear_left_over() -> list[str]:
    """Removes build locks no process here holds that are older than STALE_AFTER_S; -> one warning
    per lock removed or left (younger: perhaps another node's build)."""
    locks = sorted(lock for root in extensions_roots() for lock in root.glob("*/lock"))
    if not locks or not Path("/proc/self/fd").is_dir():
        return []
    held, now, lines = held_open(), time.time(), []
    for lock in locks:
        try:
            status = lock.stat()
        except FileNotFoundError:  # its build just finished
            continue
        if (status.st_dev, status.st_ino) in held:
            continue
        age, op = now - status.st_mtime, lock.parent.name
        if age > STALE_AFTER_S:
            with contextlib.suppress(FileNotFoundError):
                if lock.stat().st_ino == status.st_ino:  # not a new build's lock since
                    lock.unlink()
            lines.append(f"warning: removed {lock}, left {age / 60:.0f} min ago by a JIT build of {op} that was "
                         "killed (no process of this user here holds it); the op is built again")
        else:
            lines.append(f"warning: {lock} is held by no process of this user on this host: a JIT build of {op} that "
                         f"was killed, or one running elsewhere (another node, user or container); start-up waits "
                         f"until it is gone: remove it if nothing is building {op}")
    return lines

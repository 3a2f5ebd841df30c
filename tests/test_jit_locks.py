"""Lock files of killed JIT builds (parallel/jit_locks.py): torch waits on them forever, so
start-up names them, and removes those older than any build that no process holds. This sees
the files and this host's open descriptors; a build on another node sharing the folder it cannot
see (hence the age rule)."""
import os
import time

from megatron.parallel import jit_locks


def test_left_over_build_locks_are_named_and_old_ones_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    old, young, held = (tmp_path / op / "lock" for op in ("fused_adam", "cpu_adam", "deepspeed_shm_comm"))
    for lock in (old, young, held):
        lock.parent.mkdir()
        lock.touch()
    long_ago = time.time() - jit_locks.STALE_AFTER_S - 60
    os.utime(old, (long_ago, long_ago))
    os.utime(held, (long_ago, long_ago))
    with open(held):  # a build in progress holds its lock open, however old
        lines = jit_locks.clear_left_over()
    assert not old.exists() and young.exists() and held.exists()
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"warning: {young} is held by no process of this user on this host: a JIT build of "
                               "cpu_adam that was killed, or one running elsewhere")
    assert lines[1].startswith(f"warning: removed {old}, left 31 min ago by a JIT build of fused_adam that was killed")
    young.unlink()
    assert jit_locks.clear_left_over()[0].startswith(f"warning: removed {held}")  # its build has ended (killed)
    assert not held.exists() and jit_locks.clear_left_over() == []

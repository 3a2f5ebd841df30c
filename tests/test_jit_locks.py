"""Lock files of killed JIT builds (parallel/jit_locks.py): torch waits on them forever, so
start-up names them, and removes those older than any build that no process holds. This sees
the files and this host's open descriptors; a build on another node sharing the folder it cannot
see (hence the age rule)."""
import os
import time

import pytest

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


def test_every_process_group_start_names_a_left_over_lock_before_deepspeed_builds(tmp_path, monkeypatch, capsys):
    """device.init_distributed, which the trainer and the benchmarks' run_on_ranks ranks (state.initialize) both
    start through: a benchmark interrupted in its first JIT build left a lock its next run waited on in silence,
    as only the trainer looked for one. Said before DeepSpeed's init, where its ops build."""
    import deepspeed

    from megatron.parallel import device

    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(device, "backend", lambda: "gloo")
    lock = tmp_path / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir()
    lock.touch()

    class Building(Exception):
        pass

    def build(**_):
        raise Building

    monkeypatch.setattr(deepspeed, "init_distributed", build)
    with pytest.raises(Building):
        device.init_distributed()
    out, err = capsys.readouterr()
    assert err.startswith(f"warning: {lock} is held by no process of this user on this host: a JIT build of "
                          "deepspeed_shm_comm that was killed"), err
    assert out.splitlines()[-1].startswith("note: building DeepSpeed's deepspeed_shm_comm op"), out
    monkeypatch.setenv("LOCAL_RANK", "1")  # said once per node
    with pytest.raises(Building):
        device.init_distributed()
    assert capsys.readouterr() == ("", "")

"""Faults of the folders a run writes: a full disk at the --save probe, at a checkpoint save and in
the run log is named as such in one line, with no `.partial` or probe file left; a --save folder
is locked by the run writing it (a live holder refuses a second run, a dead one is taken over).

The full disks are real: the run is started in a mount namespace of its own (`unshare`) with the
folder mounted as a small tmpfs, so torch's and DeepSpeed's writers meet the kernel's ENOSPC (torch
reports it only as `basic_ios::clear: iostream error`). That needs root or unprivileged user
namespaces; without them the tests skip, saying so."""
import errno
import json
import os
import shutil
import socket
import subprocess
import threading
import time
from types import SimpleNamespace

import pytest

from megatron import checkpoint, checkpoint_save, locks, run_log
from megatron.data.default_dataset import prepare_default_dataset
from megatron.parallel.launcher_watch import start_time
from megatron.parallel.spawn import free_port

from test_bad_inputs import PYTHON, ROOT, TINY

MOUNT = 'mount -t tmpfs -o size="$1" tmpfs "$0" && {fill} shift && "$@"; code=$?; echo LEFT: $(ls -A "$0"); exit $code'


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> list:
    directory = tmp_path_factory.mktemp("data")
    dataset = prepare_default_dataset(directory, max_bytes=300_000, vocab_size=2000)
    # no test share: the default's 1 in 1000 holds no document of this small corpus (a warning line)
    return ["--data-path", str(dataset.data_prefix), "--vocab-file", str(dataset.vocab_file), "--split", "98,2,0"]


def namespace_prefix() -> list | None:
    """`unshare` arguments that give a command a mount namespace in which it may mount, or None."""
    if shutil.which("unshare") is None:
        return None
    for prefix in (["unshare", "--mount"], ["unshare", "--map-root-user", "--mount"]):
        probe = subprocess.run([*prefix, "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True)
        if probe.returncode == 0:
            return prefix
    return None


NAMESPACE = namespace_prefix()
needs_tmpfs = pytest.mark.skipif(NAMESPACE is None, reason="mounting a small tmpfs needs root or unprivileged user "
                                 "namespaces (unshare --map-root-user --mount), which this machine refuses")


def on_tmpfs(folder, size: str, argv: list, fill: bool = False) -> tuple:
    """pretrain_bert.py (one rank) with `folder` a fresh tmpfs of `size` (`fill`: filled up first);
    returns (exit code, stderr lines, the names left in the folder)."""
    folder.mkdir(parents=True, exist_ok=True)
    script = MOUNT.format(fill='(cat /dev/zero > "$0/filler") 2>/dev/null;' if fill else "")
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run([*NAMESPACE, "sh", "-c", script, str(folder), size, PYTHON, str(ROOT / "pretrain_bert.py"),
                             *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    left = result.stdout.splitlines()[-1].split()[1:]  # the line after LEFT:
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    return result.returncode, errors, left


def run_argv(tmp_path, data, *extra) -> list:
    return [*TINY, *data, "--eval-iters", "1", "--eval-interval", "1000", "--log-dir", str(tmp_path / "log"), *extra]


@needs_tmpfs
def test_full_disk_at_save_is_named_and_leaves_no_partial(tmp_path, data):
    """The probe fits, the first checkpoint does not: one line naming the full disk, exit 2, the
    staging folder removed (it would hold the space), the lock released."""
    save = tmp_path / "ckpt"
    code, errors, left = on_tmpfs(save, "256k", run_argv(tmp_path, data, "--train-iters", "2", "--save", str(save)))
    assert code == 2, errors[-20:]
    assert errors == [f"pretrain_bert.py: error: cannot write checkpoint iter_0000002: the disk is full (--save {save} "
                      f"on {socket.gethostname()}, 0.0 MiB free); free space there or pass another --save, then "
                      "resume; nothing of iter_0000002 was kept and no earlier checkpoint exists"], errors[-20:]
    assert left == []  # no iter_0000002.partial, no .write_probe.*, no .lock


@needs_tmpfs
def test_full_disk_at_the_start_leaves_no_probe_file(tmp_path, data):
    """A --save folder on a disk already full is refused before the first step, naming the full disk;
    the probe file (created before its write failed) is removed."""
    save = tmp_path / "ckpt"
    code, errors, left = on_tmpfs(save, "64k", run_argv(tmp_path, data, "--train-iters", "2", "--save", str(save)),
                                  fill=True)
    assert code == 2 and len(errors) == 1, errors[-20:]
    assert f"--save {save} is not writable on" in errors[0] and "No space left on device): the disk is full" in errors[0]
    assert left == ["filler"]


@needs_tmpfs
def test_full_log_disk_stops_the_run_with_a_checkpoint(tmp_path, data):
    """metrics.jsonl fills its disk mid-run: the run stops at the next step, saves (on another disk)
    and names the full log disk and the checkpoint to resume from, in one line (after the line that
    says that the stop's save begins)."""
    log, save = tmp_path / "log", tmp_path / "ckpt"
    code, errors, _ = on_tmpfs(log, "16k", run_argv(tmp_path, data, "--train-iters", "200", "--log-interval", "1",
                                                    "--save", str(save)))
    latest = checkpoint.latest_tag(str(save))
    iteration = int(latest[len("iter_"):])
    assert code == 2 and len(errors) == 2, errors[-20:]
    assert errors[0] == (f"pretrain_bert.py: stopping after iteration {iteration} (a failed write of the run log): "
                         f"saving checkpoint {save / latest} (the first save of this run); further signals are ignored "
                         "until it is written")
    assert errors[1] == (f"pretrain_bert.py: error: cannot write the run log {log / 'metrics.jsonl'} (the disk is "
                         f"full, 0.0 MiB free); free space there or pass another --log-dir; checkpoint {save / latest} "
                         f"holds iteration {iteration}: resume with --load {save}")
    assert 0 < iteration < 200


@pytest.mark.parametrize("failing_fsync", [1, 2, 3, 4],
                         ids=["staged_file", "folder_after_rename", "latest_pointer", "folder_after_latest"])
def test_a_commit_cut_by_a_full_disk_leaves_no_trace_and_latest_as_it_was(tmp_path, monkeypatch, failing_fsync):
    """The commit's fsyncs are where a full disk often shows (delayed allocation): whichever fails,
    neither the staged folder, nor a renamed one that `latest` does not name, nor `.latest.tmp` is
    left, and the line names the full disk. Emulated ENOSPC: a tmpfs fills at the write, not here."""
    import errno

    (tmp_path / "iter_0000001").mkdir()
    (tmp_path / "latest").write_text("iter_0000001")
    (tmp_path / f"iter_0000002{checkpoint.PARTIAL}").mkdir()
    (tmp_path / f"iter_0000002{checkpoint.PARTIAL}" / "weights.pt").write_bytes(b"weights")
    calls, real_fsync = [], os.fsync

    def fsync(descriptor):
        calls.append(descriptor)
        if len(calls) == failing_fsync:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(descriptor)

    monkeypatch.setattr(os, "fsync", fsync)
    if failing_fsync == 4:  # after `latest` was replaced: the checkpoint is kept, nothing to report
        checkpoint_save._commit(str(tmp_path), "iter_0000002")
        assert sorted(os.listdir(tmp_path)) == ["iter_0000001", "iter_0000002", "latest"]
        assert checkpoint.latest_tag(str(tmp_path)) == "iter_0000002"
        return
    with pytest.raises(OSError) as raised:
        checkpoint_save._commit(str(tmp_path), "iter_0000002")
    assert sorted(os.listdir(tmp_path)) == ["iter_0000001", "latest"]
    assert checkpoint.latest_tag(str(tmp_path)) == "iter_0000001"
    problem, fix = checkpoint_save._write_problem(str(tmp_path), "iter_0000002", raised.value)
    assert problem.startswith("cannot write checkpoint iter_0000002: the disk is full"), problem
    assert fix.endswith("nothing of iter_0000002 was kept and 'latest' still names iter_0000001"), fix


WRITE_UNDER_A_FILE_SIZE_LIMIT = """
import os, resource, sys, torch
from megatron import checkpoint, checkpoint_save
save_dir, writer = sys.argv[1:]
resource.setrlimit(resource.RLIMIT_FSIZE, (2**20, resource.RLIM_INFINITY))  # `ulimit -f 1024`
staging = os.path.join(save_dir, "iter_0000002" + checkpoint.PARTIAL)
os.makedirs(staging)
try:
    if writer == "torch":
        torch.save(torch.zeros(2**19), os.path.join(staging, "weights.pt"))
    else:
        with open(os.path.join(staging, "run_state.json"), "wb") as file:
            file.write(bytes(2**21))
except (OSError, RuntimeError) as error:
    print(" | ".join(checkpoint_save._write_problem(save_dir, "iter_0000002", error)))
"""


@pytest.mark.parametrize("writer", ["torch", "python"])
def test_a_file_size_limit_at_save_is_named_as_efbig(tmp_path, writer):
    """A file-size limit (`ulimit -f`, EFBIG) cuts a checkpoint file: torch's writer says only `[enforce
    fail at inline_container.cc] . unexpected pos`, a Python write `File too large`; both lines name the
    system's reason and the limit, and the fix raises it (not "check the folder and its disk")."""
    done = subprocess.run([PYTHON, "-c", WRITE_UNDER_A_FILE_SIZE_LIMIT, str(tmp_path), writer], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.splitlines()[-1] == (
        f"cannot write checkpoint iter_0000002: a file reached this process's file-size limit of 1.0 MiB (File too "
        f"large, EFBIG; set by ulimit -f) (--save {tmp_path} on {socket.gethostname()}) | raise the limit where the run "
        "starts (ulimit -f unlimited), then resume; nothing of iter_0000002 was kept and no earlier checkpoint "
        "exists"), done.stdout + done.stderr[-2000:]


def test_a_save_folder_turned_unwritable_is_named_and_its_lock_left_with_a_warning(tmp_path, monkeypatch, capsys):
    """--save turns read-only or immutable during the run (a remount, `chattr +i`): DeepSpeed logs and
    drops its makedirs' EPERM, then torch says `Parent directory ... does not exist`; the line names
    the system's reason instead. The lock, which cannot be removed either, is left with one warning
    line (was: release_lock's PermissionError chained to the report, two tracebacks, exit 1). EPERM is
    emulated: a root test process may write into a read-only folder."""
    import errno

    from megatron import training
    from megatron.errors import ConfigError

    def denied(path, *args, **kwargs):
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), str(path))

    staging = tmp_path / f"iter_0000040{checkpoint.PARTIAL}"
    torch_error = RuntimeError(f"Parent directory {staging} does not exist.")
    real_remove = os.remove
    monkeypatch.setattr(os, "mkdir", denied)
    monkeypatch.setattr(os, "remove", lambda path, *a, **k: denied(path) if str(path).endswith(locks.LOCK)
                        else real_remove(path, *a, **k))

    def save_fails(args, start_up, progress):
        assert locks.take_lock(str(tmp_path)) is None
        raise ConfigError(*checkpoint_save._write_problem(str(tmp_path), "iter_0000040", torch_error))

    for name in ("check_flags", "check_flag_combinations"):
        monkeypatch.setattr(training, name, lambda args: None)
    monkeypatch.setattr(training, "pretrain", save_fails)
    assert training.main(["--data-path", "x", "--save", str(tmp_path)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"warning: cannot remove the lock {tmp_path / locks.LOCK} (Operation not permitted); it is left there; a "
        "later run takes it over once this one has ended and the folder is writable",
        f"pretrain_bert.py: error: cannot write checkpoint iter_0000040 into --save {tmp_path} on "
        f"{socket.gethostname()} (Operation not permitted); check the folder and its disk, then resume; nothing of "
        "iter_0000040 was kept and no earlier checkpoint exists"]
    assert locks._held_locks == {}


# ---------------------------------------------------------------- the --save lock

def write_lock(folder, host: str, pid: int, start) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / locks.LOCK).write_text(json.dumps({"host": host, "pid": pid, "start": start}))


def dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_lock_refuses_a_live_holder_and_another_host(tmp_path, capsys):
    host = socket.gethostname()
    write_lock(tmp_path, host, os.getpid(), start_time(os.getpid()))
    problem, fix = locks.take_lock(str(tmp_path))
    assert problem == (f"--save {tmp_path} is in use by a live run: pid {os.getpid()} on this host ({host}) holds "
                       f"{tmp_path / locks.LOCK}")
    assert "choose another --save directory" in fix
    # on this host a live holder is never stale: its heartbeat may wait for the GIL (a long map build)
    stale = time.time() - locks.LOCK_STALE_S - 1
    os.utime(tmp_path / locks.LOCK, (stale, stale))
    assert locks.take_lock(str(tmp_path))[0] == problem
    write_lock(tmp_path, "other-node", 4242, "1")
    problem, fix = locks.take_lock(str(tmp_path))
    assert problem.startswith(f"--save {tmp_path} is locked by pid 4242 on host other-node, whose lock was touched ")
    assert f"remove {tmp_path / locks.LOCK} once that run has ended" in fix
    # another host's lock nobody touched for LOCK_STALE_S: a preempted run (a requeue on another node)
    os.utime(tmp_path / locks.LOCK, (stale, stale))
    assert locks.take_lock(str(tmp_path)) is None
    locks.release_lock()
    # this pid with another start time: the pid was reused after the holder died
    write_lock(tmp_path, host, os.getpid(), "1")
    assert locks.take_lock(str(tmp_path)) is None
    locks.release_lock()
    assert sorted(os.listdir(tmp_path)) == [] and capsys.readouterr().err.count("taking over the lock") == 2


def test_a_process_taking_a_lock_again_keeps_it_and_one_elsewhere_is_given_back(tmp_path):
    """pretrain called twice in one process (tests, a notebook) takes --log-dir's lock again: its own,
    not a live run's; a lock of the same name in another folder is given back first."""
    first, second = tmp_path / "a", tmp_path / "b"
    for folder in (first, first, second):
        folder.mkdir(exist_ok=True)
        assert locks.take_lock(str(folder), (), "--log-dir", locks.LOG_LOCK) is None
    assert not (first / locks.LOG_LOCK).exists() and (second / locks.LOG_LOCK).exists()
    locks.release_lock()
    assert not (second / locks.LOG_LOCK).exists() and locks._held_locks == {}


def test_a_log_dir_whose_lock_cannot_be_written_is_named_with_the_flag(tmp_path, monkeypatch):
    """The lock is placed through a temporary file, which the system's error names: the line names --log-dir
    (the --save lock's is named alike), and the folder made for the lock is removed again."""
    from megatron import training

    def read_only(path, record):
        raise OSError(errno.EROFS, "Read-only file system", f"{path}.host.4242")

    monkeypatch.setattr(locks, "_place_record", read_only)
    log = tmp_path / "runs" / "x"
    assert training.lock_log_dir(str(log)) == (f"--log-dir {log}: cannot write its lock on {socket.gethostname()} "
                                                "(Read-only file system)",
                                                "pass a --log-dir directory this user can write")
    assert list(tmp_path.iterdir()) == [] and locks._held_locks == {}


def test_releasing_a_lock_removes_the_folders_made_for_it_when_left_empty(tmp_path):
    """A run that made --save (and its parent) for the lock and wrote nothing there leaves no empty
    folders behind; a folder it wrote into stays."""
    for kept in (False, True):
        save = tmp_path / "runs" / "save"
        save.mkdir(parents=True)
        assert locks.take_lock(str(save), [str(save), str(save.parent)]) is None  # innermost first
        if kept:
            (save / "iter_0000001").mkdir()
        locks.release_lock(locks.LOCK)
        assert sorted(path.name for path in tmp_path.rglob("*")) == (["iter_0000001", "runs", "save"] if kept else [])


def test_the_lock_holder_removes_the_leftovers_of_killed_saves(tmp_path, capsys):
    """A save killed mid-way (SIGKILL, a lost node) leaves `<tag>.partial`, a killed --keep-last removal
    `<tag>.removing`, each a full checkpoint's size, which a resume seldom replaces (a stop's
    iteration is rarely saved again). The run that takes the lock removes them, with one line; the
    checkpoints, `latest` and anything else stay."""
    for name in ("iter_0000002.partial", "iter_0000001.removing", "iter_0000004", "notes.partial"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model_states.pt").write_bytes(b"weights")
    (tmp_path / "latest").write_text("iter_0000004")
    write_lock(tmp_path, socket.gethostname(), dead_pid(), None)  # the killed run's
    assert locks.take_lock(str(tmp_path)) is None
    checkpoint_save.remove_killed_saves(str(tmp_path))
    locks.release_lock()
    assert sorted(os.listdir(tmp_path)) == ["iter_0000004", "latest", "notes.partial"]
    assert capsys.readouterr().out == (f"--save {tmp_path}: removed iter_0000001.removing, iter_0000002.partial, left "
                                       "by killed saves\n")


def test_a_lock_held_by_a_process_that_ended_unreaped_is_taken_over(tmp_path, capsys):
    """A holder killed under a parent that never reaps it (a zombie) keeps its pid: it has ended."""
    holder = subprocess.Popen(["sleep", "60"])
    try:
        write_lock(tmp_path, socket.gethostname(), holder.pid, start_time(holder.pid))
        assert locks.take_lock(str(tmp_path))[0].endswith(f"holds {tmp_path / locks.LOCK}")  # alive
        holder.kill()
        os.waitid(os.P_PID, holder.pid, os.WEXITED | os.WNOWAIT)  # ended, left unreaped
        assert locks.take_lock(str(tmp_path)) is None
        locks.release_lock()
        assert "taking over the lock" in capsys.readouterr().err
    finally:
        holder.wait()


def test_the_holder_touches_its_lock_and_a_replaced_stale_lock_is_not_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(locks, "LOCK_HEARTBEAT_S", 0.05)
    assert locks.take_lock(str(tmp_path)) is None
    lock = tmp_path / locks.LOCK
    old = time.time() - 1000
    os.utime(lock, (old, old))
    time.sleep(0.3)
    assert time.time() - lock.stat().st_mtime < 1  # the heartbeat touched it again
    # another run took the lock over (this one judged dead): neither touched nor removed by this one
    write_lock(tmp_path, "node-9", 77, "5")
    os.utime(lock, (old, old))
    time.sleep(0.3)
    locks.release_lock()
    assert locks._read_lock(str(lock)) == {"host": "node-9", "pid": 77, "start": "5"}
    assert lock.stat().st_mtime == old
    # two runs judge the same lock stale; the first has replaced it with its own when the second acts
    write_lock(tmp_path, "other-node", 4242, "1")
    stale_holder = locks._read_lock(str(lock))
    write_lock(tmp_path, "node-9", 77, "5")  # the other run's fresh lock
    assert locks._remove_stale(str(lock), stale_holder) is False
    assert locks._read_lock(str(lock)) == {"host": "node-9", "pid": 77, "start": "5"}
    assert sorted(os.listdir(tmp_path)) == [locks.LOCK]


def test_a_folder_without_hard_links_is_locked_by_an_exclusive_create(tmp_path, monkeypatch):
    """Blob FUSE mounts refuse link(2) (EPERM / EOPNOTSUPP): the lock is then created exclusively."""
    import errno

    def no_link(source, target):
        raise OSError(errno.EPERM, os.strerror(errno.EPERM), source, None, target)

    monkeypatch.setattr(os, "link", no_link)
    (tmp_path / locks.LOCK).touch()  # another run's exclusive create, not written yet: not taken over
    assert "was just taken by another run starting there" in locks.take_lock(str(tmp_path))[0]
    (tmp_path / locks.LOCK).unlink()
    assert locks.take_lock(str(tmp_path)) is None
    lock = locks._read_lock(str(tmp_path / locks.LOCK))
    assert (lock["host"], lock["pid"]) == (socket.gethostname(), os.getpid())
    held = locks._held_locks.pop(locks.LOCK)  # as another run sees it
    assert "in use by a live run" in locks.take_lock(str(tmp_path))[0]
    locks._held_locks[locks.LOCK] = held
    locks.release_lock()
    assert os.listdir(tmp_path) == []


def test_a_lock_released_while_being_read_is_taken_and_a_failed_write_leaves_none(tmp_path, monkeypatch):
    """The holder releases its lock between our failed placing and our read: the folder is free, not
    'just taken by another run'. Without hard links, a lock whose write fails (a full disk) is removed
    again: an empty lock would refuse the next run as one starting there."""
    import errno

    place, calls = locks._place, []

    def released_meanwhile(source, path):
        calls.append(path)
        if len(calls) == 1:
            raise FileExistsError(errno.EEXIST, "exists", path)  # and gone by the time it is read
        place(source, path)

    monkeypatch.setattr(locks, "_place", released_meanwhile)
    assert locks.take_lock(str(tmp_path)) is None and len(calls) == 2
    locks.release_lock()
    monkeypatch.setattr(locks, "_place", place)

    def no_link(source, target):
        raise OSError(errno.EPERM, os.strerror(errno.EPERM), source, None, target)

    class FullDisk:
        def __init__(self, file):
            self.file = file

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    real_open = open
    monkeypatch.setattr(os, "link", no_link)
    monkeypatch.setattr("builtins.open", lambda path, mode="r", *a, **k: FullDisk(real_open(path, mode, *a, **k))
                        if mode == "xb" else real_open(path, mode, *a, **k))
    problem, fix = locks.take_lock(str(tmp_path))
    assert "No space left" in problem and fix == "free space there or pass a --save directory on another disk"
    assert os.listdir(tmp_path) == []


def test_stale_lock_is_taken_over_by_a_run(tmp_path, data):
    """A crashed run's lock (its pid gone) is taken over with one line; the run trains, saves and
    releases the lock at its end."""
    save = tmp_path / "ckpt"
    pid = dead_pid()
    write_lock(save, socket.gethostname(), pid, "1")
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run([PYTHON, str(ROOT / "pretrain_bert.py"),
                             *run_argv(tmp_path, data, "--train-iters", "1", "--save", str(save))],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    warnings = [line for line in result.stderr.splitlines() if "lock" in line]
    assert warnings == [f"warning: --save {save}: taking over the lock of pid {pid} on {socket.gethostname()}, which no "
                        "longer runs (a crashed or killed run)"], result.stderr[-3000:]
    assert sorted(os.listdir(save)) == ["iter_0000001", "latest"]
    assert [r["iteration"] for r in run_log.read_metrics(tmp_path / "log" / "metrics.jsonl") if r["kind"] == "train"] == [1]


# ---------------------------------------------------------------- one rank's disk fills inside DeepSpeed's save

def main_with_full_disk_in_save(argv, full_rank: int, tag: str) -> tuple:
    """`main`, where rank `full_rank`'s disk fills while DeepSpeed writes its ZeRO optimizer shard of
    checkpoint `tag` (torch's writer says only `iostream error`); returns (exit code, stderr)."""
    import contextlib
    import io

    import torch
    import torch.distributed as dist

    from megatron import training

    if dist.get_rank() == full_rank:
        original = torch.save

        def save(obj, f, *args, **kwargs):
            if f"{tag}{checkpoint.PARTIAL}" in str(f) and "optim_states" in str(f):
                shutil.disk_usage = lambda path: SimpleNamespace(total=2**30, used=2**30, free=0)
                raise RuntimeError("basic_ios::clear: iostream error")
            return original(obj, f, *args, **kwargs)

        torch.save = save
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = training.main(argv)
    return code, err.getvalue()


def test_full_disk_on_one_rank_inside_deepspeeds_save_stops_every_rank(tmp_path, data):
    """ZeRO 1 on two ranks: rank 1 fails inside engine.save_checkpoint (it misses DeepSpeed's closing
    barrier); both ranks agree, the staging folder goes, `latest` keeps the previous checkpoint."""
    from megatron.parallel.spawn import run_on_ranks

    save = tmp_path / "ckpt"
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 1}}))
    argv = run_argv(tmp_path, data, "--deepspeed", "--deepspeed_config", str(tmp_path / "ds.json"), "--train-iters",
                    "4", "--save-interval", "2", "--save", str(save))
    outcomes = run_on_ranks(main_with_full_disk_in_save, 2, argv, 1, checkpoint.tag_for(4), timeout=240)
    assert [code for code, _ in outcomes] == [2, 2], outcomes[1][1][-3000:]
    errors = [line for _, err in outcomes for line in err.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0].startswith(
        "pretrain_bert.py: error: cannot write checkpoint iter_0000004: the disk is full"), errors
    assert errors[0].endswith("nothing of iter_0000004 was kept and 'latest' still names iter_0000002")
    assert checkpoint.latest_tag(str(save)) == checkpoint.tag_for(2)
    assert not [name for name in os.listdir(save) if name.endswith(checkpoint.PARTIAL)], os.listdir(save)


def test_the_write_probe_of_a_failed_save_makes_no_vanished_save_folder(tmp_path):
    """A --save that vanished mid-run (an unmounted disk, a deleted folder) is the save's reason: the probe
    for it creates the staging folder alone, never the --save above it on the disk below the mount."""
    gone = tmp_path / "gone"
    error = checkpoint_save._unwritable(str(gone / f"iter_0000040{checkpoint.PARTIAL}"))
    assert isinstance(error, FileNotFoundError) and not gone.exists()


def test_a_lock_that_vanishes_is_placed_again_and_one_another_run_took_stops_the_save(tmp_path, monkeypatch, capsys):
    """A --save folder removed while the run trained (a scratch cleaner, a remount, a user's rm -rf): the run
    made it again at its next save with no lock, so a second run was accepted into the folder the first still
    wrote. Now the heartbeat and each save place the lock again (one warning), and a save stops with one line
    when another live run took the lock meanwhile."""
    monkeypatch.setattr(locks, "LOCK_HEARTBEAT_S", 0.05)
    save = tmp_path / "ckpt"
    save.mkdir()
    assert locks.take_lock(str(save)) is None
    try:
        shutil.rmtree(save)
        deadline = time.monotonic() + 10
        while not (save / locks.LOCK).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert locks._read_lock(str(save / locks.LOCK))["pid"] == os.getpid()  # placed by the heartbeat, the folder
        # made again: a second run is refused within a beat, not only from the next save on
        assert "in use by a live run" in locks.held_by_live_run(str(save), "--save")[0]  # a second run is refused
        (save / locks.LOCK).unlink()
        assert locks.keep_held() is None and locks._read_lock(str(save / locks.LOCK))["pid"] == os.getpid()
        assert [line for line in capsys.readouterr().err.splitlines() if "lock" in line] == [
            f"warning: --save {save} lost its lock {save / locks.LOCK} while this run trained (the folder removed, "
            "emptied or remounted): taken again; checkpoints and logs written there before may be gone"]
        monkeypatch.setattr(locks, "LOCK_HEARTBEAT_S", 3600)
        other = subprocess.Popen(["sleep", "60"])
        try:
            (save / locks.LOCK).unlink()
            write_lock(save, socket.gethostname(), other.pid, start_time(other.pid))
            assert locks.keep_held() == (
                f"--save {save}: this run's lock {save / locks.LOCK} is held by pid {other.pid} on this host "
                f"({socket.gethostname()}) now (it vanished while this run trained, or went untouched for 300 s): "
                "this run stops (what it wrote there before may be gone with the folder)",
                "rerun it with another --save (resume from a checkpoint of its own, if one is left)")
        finally:
            other.kill()
            other.wait()
        assert locks.keep_held() is None  # its holder ended: taken over
        assert locks._read_lock(str(save / locks.LOCK))["pid"] == os.getpid()
    finally:
        locks.release_lock()
    assert not (save / locks.LOCK).exists()


@pytest.mark.parametrize("fault", ["removed", "read-only"])
def test_a_run_whose_folders_are_removed_between_saves_takes_their_locks_again(tmp_path, data, fault):
    """The whole path: checkpoint 1 is saved, then the --save and --log-dir folders removed. The log line of step
    2 starts a new metrics.jsonl (the records went into the removed file, silently) and places the log lock
    again, the save of checkpoint 2 makes --save again with its lock, one warning each, and the run ends
    normally. Where the lock cannot be written again (remounted read-only), the save is one line naming --save,
    not the lock's temporary file."""
    save, log = tmp_path / "ckpt", tmp_path / "log"
    hook = ("import errno, shutil, sys\nfrom megatron import checkpoint_save, locks, training\n"
            "locks.LOCK_HEARTBEAT_S = 3600\nsaved = checkpoint_save.save\n"
            "def read_only(path, record):\n    raise OSError(errno.EROFS, 'Read-only file system', path)\n"
            "def save_then_remove(*args, **kwargs):\n    tag = saved(*args, **kwargs)\n"
            f"    if tag.endswith('1'):\n        shutil.rmtree({str(save)!r})\n"
            + (f"        shutil.rmtree({str(log)!r})\n" if fault == "removed" else
               "        locks._place_record = read_only\n") +
            "    return tag\ncheckpoint_save.save = save_then_remove\nsys.exit(training.main(sys.argv[1:]))\n")
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run([PYTHON, "-c", hook, *run_argv(tmp_path, data, "--train-iters", "2", "--save", str(save),
                                                           "--save-interval", "1", "--log-interval", "1")],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    if fault == "read-only":
        assert result.returncode == 2, result.stderr[-3000:]
        assert result.stderr.strip().splitlines()[-1] == (
            f"pretrain_bert.py: error: --save {save}: cannot write its lock again on {socket.gethostname()} "
            "(Read-only file system); pass a --save directory this user can write on every node")
        return
    assert result.returncode == 0, result.stderr[-3000:]
    assert [line for line in result.stderr.splitlines() if "lost its" in line] == [
        f"warning: --log-dir {log} lost its lock {log / locks.LOG_LOCK} while this run trained (the folder removed, "
        "emptied or remounted): taken again; checkpoints and logs written there before may be gone",
        f"warning: --log-dir {log} lost its metrics.jsonl while this run trained (the folder removed or emptied): "
        "this run's records go on in a new one from iteration 2; its earlier records, config.json and "
        "index_maps.json are gone",
        f"warning: --save {save} lost its lock {save / locks.LOCK} while this run trained (the folder removed, "
        "emptied or remounted): taken again; checkpoints and logs written there before may be gone"], result.stderr
    assert sorted(os.listdir(save)) == ["iter_0000002", "latest"]
    records = run_log.read_metrics(log / "metrics.jsonl")
    assert [(r["kind"], r["iteration"]) for r in records][:1] == [("train", 2)]
    assert (log / "loss.png").is_file() and not (log / locks.LOG_LOCK).exists()


def test_a_beat_under_way_when_the_run_ends_does_not_put_its_lock_back(tmp_path, monkeypatch):
    """The heartbeat woke just before release_lock, read the lock after it was removed and placed it again: the
    ended run left its lock (another host's run refused for 5 minutes) and said it had lost it. Forced here by a
    beat whose read waits 0.3 s."""
    monkeypatch.setattr(locks, "LOCK_HEARTBEAT_S", 0.01)
    in_beat, read = threading.Event(), locks._read_lock

    def slow_in_beat(path):
        if threading.current_thread().name == "save-lock-heartbeat" and not in_beat.is_set():
            in_beat.set()
            time.sleep(0.3)
        return read(path)

    monkeypatch.setattr(locks, "_read_lock", slow_in_beat)
    assert locks.take_lock(str(tmp_path)) is None
    assert in_beat.wait(10)
    locks.release_lock()
    time.sleep(0.5)  # a beat going on would have placed it again by now
    assert not (tmp_path / locks.LOCK).exists()


@needs_tmpfs
def test_a_full_dev_shm_is_one_line_naming_it_not_a_segfault(tmp_path, data):
    """DeepSpeed's CPU all-reduce write()s a 66 MiB buffer per rank of a one-node launch into /dev/shm; a write
    that finds no space returns -1, which it maps as a size: the rank died by SIGSEGV in init (Docker's 64 MB
    default took down a 2-rank run about half the time; a /dev/shm filled by killed runs' buffers, every time).
    With one rank on a full 1 MiB /dev/shm in a private mount namespace: filled by another file, one line (this
    exact command exited 139 before); filled by a killed run's buffer of this user, an hour old, which no process
    holds, that buffer is removed with one warning and the run trains."""
    def run_with_shm_filled_by(name):
        script = (f'mount -t tmpfs -o size=1m tmpfs /dev/shm && (cat /dev/zero > /dev/shm/{name}) 2>/dev/null; '
                  f'touch -d "1 hour ago" /dev/shm/{name}; exec "$@"')
        env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_SIZE": "1",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "CUDA_VISIBLE_DEVICES": ""}
        return subprocess.run([*NAMESPACE, "sh", "-c", script, "sh", PYTHON, str(ROOT / "pretrain_bert.py"),
                               *run_argv(tmp_path, data, "--train-iters", "1")],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)

    result = run_with_shm_filled_by("filler")
    assert result.returncode == 2, result.stderr[-3000:]
    assert [line for line in result.stderr.splitlines() if "error" in line] == [
        "pretrain_bert.py: error: /dev/shm has 0 MiB free, but DeepSpeed's CPU all-reduce writes a 66 MiB buffer "
        "there for this node's one rank; give it more (docker run --shm-size=1g, or a larger /dev/shm tmpfs); no "
        "buffer of a killed run is left there: running launches (whose buffers have no name once they started) or "
        "other files fill it"]
    result = run_with_shm_filled_by(f"deepspeed_allreduce_buffer_{os.getuid()}_10.0.0.9_29500_0")
    assert result.returncode == 0, result.stderr[-3000:]
    assert [line for line in result.stderr.splitlines() if "/dev/shm" in line] == [
        "warning: removed 1 DeepSpeed all-reduce buffer of killed runs from /dev/shm (1 MiB), which no process held"]


def test_dev_shm_must_hold_every_ranks_buffer_but_the_last_ones_first_page(tmp_path, monkeypatch):
    """The sizes the check holds (the crash itself is seen above): 2 ranks on Docker's 64 MB default are refused
    (the second rank's write would find no space), 132 MiB + a page is enough, and one rank needs only a page
    (its write may fall short: it maps what was written)."""
    from megatron.parallel import device

    free = {"bytes": 64 * 2**20}
    monkeypatch.setattr(device, "SHM_DIR", str(tmp_path))
    monkeypatch.setattr(device.os, "statvfs", lambda path: SimpleNamespace(f_bavail=free["bytes"] // 4096,
                                                                           f_frsize=4096))
    assert device.shm_problem(2) == (
        f"{tmp_path} has 64 MiB free, but DeepSpeed's CPU all-reduce writes a 66 MiB buffer there for each of this "
        "node's 2 ranks", f"give it more (docker run --shm-size=1g, or a larger {tmp_path} tmpfs) or start fewer "
        "ranks per node; no buffer of a killed run is left there: running launches (whose buffers have no name once "
        "they started) or other files fill it")
    assert device.shm_problem(1) is None
    free["bytes"] = device.SHM_WORKSPACE + 2 * 4096  # its last page partly filled
    assert device.shm_problem(2) is None and device.shm_problem(3) is not None
    assert "--shm-size=2g" in device.shm_problem(17)[1]  # 17 x 66 MiB: more than 1 GiB
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    free["bytes"] = 4096  # this launch's rank 0 wrote its buffer already: only rank 1's is left to fit
    (tmp_path / f"deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_29500_0").write_bytes(b"\1" * device.SHM_WORKSPACE)
    assert device.shm_problem(2) is not None  # rank 1's 66 MiB still missing
    free["bytes"] = device.SHM_WORKSPACE - 8 * 2**20  # what is held counts as space: 58 MiB free + 66 held
    assert device.shm_problem(2) is None


def test_only_buffers_no_process_holds_are_removed(tmp_path, monkeypatch):
    """A starting run holds its buffer open from its creation (DeepSpeed keeps the descriptor): kept; a killed
    run's, held by nobody and an hour old, removed; a young one kept (a launch in another container sharing
    /dev/shm, whose processes do not show here); another user's never looked at."""
    from megatron.parallel import device

    monkeypatch.setattr(device, "SHM_DIR", str(tmp_path))
    names = [f"deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_{port}_0" for port in (29500, 29501)]
    other_user = f"deepspeed_allreduce_buffer_{os.getuid() + 1}_127.0.0.1_29500_0"
    young = f"deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_29502_0"  # perhaps a launch in another container
    for name in (*names, other_user, young):
        (tmp_path / name).write_bytes(b"\0" * 8192)
        if name != young:
            os.utime(tmp_path / name, (time.time() - 3600,) * 2)
    with open(tmp_path / names[0], "rb"):
        assert device.clear_left_over_buffers() == (f"removed 1 DeepSpeed all-reduce buffer of killed runs from "
                                                    f"{tmp_path} (0 MiB), which no process held")
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted([names[0], other_user, young])
    assert device.clear_left_over_buffers() == (f"removed 1 DeepSpeed all-reduce buffer of killed runs from {tmp_path} "
                                                "(0 MiB), which no process held")
    assert device.clear_left_over_buffers() is None

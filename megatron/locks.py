"""The lock files of a run's folders: one run writes into a --save folder (LOCK) and one into a
--log-dir (LOG_LOCK). Rank 0 takes them at start-up (checkpoint_save.check_writable, training's --log-dir
check) and gives them back at the end however the run ends; a heartbeat thread touches each while it
is held, so that a lock left by a dead run (a crash, a kill, a preempted node) is taken over.
"""
import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import threading
import time

from megatron import paths
from megatron.parallel import launcher_watch


LOCK = ".lock"  # the run writing into a --save folder: {"host", "pid", "start"}
LOG_LOCK = ".log.lock"  # the run writing into a --log-dir, alike (a --log-dir may be its --save too)

_held_locks = {}  # the locks this process holds, by name (LOCK, LOG_LOCK): {"path", "record", "created": folders
# made for it, "named": what lines call it, "flag": its flag, "mutex": taken by the heartbeat, keep_held and
# release_lock, "beat": Event, "lost": once it vanished and was placed again}
LOCK_HEARTBEAT_S = 30  # the holder touches its lock this often
LOCK_STALE_S = 300  # a lock of another host untouched this long is a dead run's


def take_lock(save_dir: str, created: list = (), flag: str = "--save", name: str = LOCK,
              named: str = "", fix: str = "") -> tuple[str, str] | None:
    """Writes `save_dir`/`name` naming this host and process, or returns (problem, fix) when a live
    run holds it: two runs saving into one folder would delete each other's `.partial` staging
    folders and interleave their checkpoints; two runs logging into one --log-dir (`flag`) would
    interleave metrics.jsonl and overwrite each other's config.json, index_maps.json and plot. The holder
    touches the lock every LOCK_HEARTBEAT_S;
    a lock whose process no longer runs on this host, or one of another host untouched for
    LOCK_STALE_S (a crashed, killed or preempted run, e.g. a requeued job on another node), is taken
    over with one line. `created`: folders made for the lock, removed again by release_lock when left empty, or at
    once when the lock cannot be written (a read-only folder, a full disk: (problem, `fix`) naming `flag`, not the
    lock's temporary file the system names).
    A process holds one lock of each name: taking it again (pretrain called twice in one process) keeps
    the one it holds there, or gives back the one it holds elsewhere. `named`: what the lines call the
    locked thing (default `flag save_dir`; preprocess_data.py locks an output dataset, not a folder)."""
    named = named or f"{flag} {save_dir}"
    try:
        return _take(save_dir, created, flag, name, named)
    except OSError as error:
        paths.remove_empty(created)
        return paths.unwritable(f"{named}: cannot write its lock on {socket.gethostname()}", flag, error,
                                fix or f"pass a {flag} directory this user can write")


def _take(save_dir: str, created: list, flag: str, name: str, named: str) -> tuple[str, str] | None:
    path, host = os.path.join(save_dir, name), socket.gethostname()
    held = _held_locks.get(name)
    if held and held["path"] == path and _read_lock(path) == held["record"]:
        return None
    release_lock(name)
    record = {"host": host, "pid": os.getpid(), "start": launcher_watch.start_time(os.getpid())}
    for _ in range(3):
        try:
            _place_record(path, record)
            held = _held_locks[name] = dict(path=path, record=record, created=list(created), named=named,
                                            flag=flag, mutex=threading.Lock())
            held["beat"] = _heartbeat(held)
            return None
        except FileExistsError:
            holder, age = _read_lock(path), _age(path)
        if age is None:
            continue  # released since: place it again
        if _being_written(holder, age):
            break
        live = _held_by_live_run(named, flag, path, holder, age)
        if live:
            return live
        if not _remove_stale(path, holder):
            break
        print(f"warning: {named}: taking over the lock of "
              f"""{'pid ' + str(holder['pid']) + ' on ' + str(holder.get('host'))
                   if holder else 'an unknown process'}"""
              ", which no longer runs (a crashed or killed run)", file=sys.stderr, flush=True)
    return (f"{named}: its lock {path} was just taken by another run starting there",
            f"choose another {flag} directory")


def _place_record(path: str, record: dict) -> None:
    """`path` holding `record`, placed whole (_place) only where no `path` exists (else FileExistsError)."""
    staged = f"{path}.{socket.gethostname()}.{os.getpid()}"
    try:
        with open(staged, "w") as file:
            json.dump(record, file)
        _place(staged, path)
    finally:
        with contextlib.suppress(OSError):
            os.remove(staged)


def _being_written(holder: dict | None, age: float | None) -> bool:
    """A lock that cannot be read yet and is younger than LOCK_HEARTBEAT_S: a run starting there is writing it
    (an exclusive create, where the filesystem has no hard links, appears empty first); left alone."""
    return holder is None and age is not None and age < LOCK_HEARTBEAT_S


NO_HARD_LINKS = (errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS, errno.EXDEV)  # blob FUSE mounts (blobfuse2, gcsfuse)


def _place(source: str, path: str) -> None:
    """`path` as a copy of `source`, only if no `path` exists (else FileExistsError): a hard link,
    which appears whole at once, or an exclusive create where the filesystem has no hard links
    (a reader that meets it still empty, and younger than LOCK_HEARTBEAT_S, leaves it: take_lock)."""
    try:
        os.link(source, path)
    except FileExistsError:
        raise
    except OSError as error:
        if error.errno not in NO_HARD_LINKS:
            raise
        with open(source, "rb") as file:
            content = file.read()
        file = open(path, "xb")  # FileExistsError: another's, left alone
        try:
            with file:
                file.write(content)
        except OSError:  # a full disk: no empty lock left to refuse the next run
            with contextlib.suppress(OSError):
                os.remove(path)
            raise


def _age(path: str) -> float | None:
    """Seconds since the lock was last touched; None when it is gone (released meanwhile)."""
    try:
        return max(0.0, time.time() - os.stat(path).st_mtime)
    except OSError:
        return None


def _remove_stale(path: str, holder: dict | None) -> bool:
    """Moves the stale lock aside and removes it, unless another run replaced it meanwhile (then it
    is put back): two runs taking over the same stale lock must not both end up holding it."""
    aside = f"{path}.stale.{socket.gethostname()}.{os.getpid()}"
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return True  # gone already: try to link ours
    if _read_lock(aside) != holder:
        with contextlib.suppress(OSError):
            _place(aside, path)
        os.remove(aside)
        return False
    os.remove(aside)
    return True


def _heartbeat(held: dict) -> threading.Event:
    """Touches the lock every LOCK_HEARTBEAT_S, while it is still this run's, and places it again when it
    vanished, with its folder if that went too (_keep: a second run is refused there within a beat), until the
    returned event is set (release_lock, which takes the lock's mutex too: a beat under way when the run ends
    never puts back the lock it removes)."""
    stop = threading.Event()

    def beat():
        while not stop.wait(LOCK_HEARTBEAT_S):
            with held["mutex"]:
                if stop.is_set():
                    return
                if _read_lock(held["path"]) == held["record"]:
                    with contextlib.suppress(OSError):
                        os.utime(held["path"])
                elif not os.path.lexists(held["path"]):  # with its folder too: made again (the run writes there)
                    with contextlib.suppress(OSError):
                        folder = os.path.dirname(held["path"]) or "."
                        if not os.path.isdir(folder):
                            os.makedirs(folder)
                            held["created"].insert(0, folder)  # removed at the release when the run left it empty
                        _keep(held)

    threading.Thread(target=beat, name="save-lock-heartbeat", daemon=True).start()
    return stop


def keep_held(name: str = LOCK) -> tuple[str, str] | None:
    """Before each save (and when the run log finds its file gone): the lock `name` this process took is still
    its own. One that vanished (its folder removed, emptied or remounted while the run trained; the heartbeat
    notices it too) is placed again with one warning, so that a second run is still refused there; (problem,
    fix) when another live run holds it now: both would write into the folder. OSError: it cannot be placed."""
    held = _held_locks.get(name)
    if held is None:
        return None
    with held["mutex"]:
        return _keep(held)


def _keep(held: dict) -> tuple[str, str] | None:
    path, record = held["path"], held["record"]
    for _ in range(3):
        current, age = _read_lock(path), _age(path)
        if current == record or not os.path.isdir(os.path.dirname(path) or "."):  # gone with its folder: placed
            return None  # once the folder is made again (the next save)
        if _being_written(current, age):
            return None  # another run's, starting there: read again at the next beat or save
        if who := _live(current, age):
            return (f"{held['named']}: this run's lock {path} is held by {who} now (it vanished while this run "
                    f"trained, or went untouched for {LOCK_STALE_S} s): this run stops (what it wrote there before "
                    "may be gone with the folder)",
                    f"rerun it with another {held['flag']} (resume from a checkpoint of its own, if one is left)")
        try:
            if age is not None:  # a dead run's, or unreadable: moved aside first
                _remove_stale(path, current)
            _place_record(path, record)
        except FileExistsError:
            continue  # placed by another run meanwhile: read it again
        if not held.get("lost"):
            held["lost"] = True
            print(f"warning: {held['named']} lost its lock {path} while this run trained (the folder removed, emptied "
                  "or remounted): taken again; checkpoints and logs written there before may be gone",
                  file=sys.stderr, flush=True)
        return None
    return None


def held_by_live_run(folder: str, flag: str, name: str = LOCK, flags: str = "") -> tuple[str, str] | None:
    """(problem, fix) when a live run holds `folder`'s lock `name`, as take_lock would refuse it at start-up:
    for a launch script's check before its launch (a second pretrain_default.sh into the first's runs/default
    otherwise met the first's rendezvous port, whose message named a port, not the folder). `flags`: the
    folder flags the fix names, when several are held (`--save and --log-dir`)."""
    path = os.path.join(folder, name)
    holder, age = _read_lock(path), _age(path)
    return None if age is None else _held_by_live_run(f"{flag} {folder}", flag, path, holder, age, flags or flag)


def live_holder(path: str) -> str | None:
    """"pid N on host H" (or "on this host (H)") of the live run holding the lock `path`; None when it is
    free, or its holder has ended."""
    return _live(_read_lock(path), _age(path))


def held_by_another(path: str) -> str | None:
    """Who holds the lock `path` when it is a live run other than this process (`live_holder`), or a run that
    is writing it now ("a run starting there"); else None."""
    holder, age = _read_lock(path), _age(path)
    if _being_written(holder, age):
        return "a run starting there"
    mine = holder is not None and holder.get("host") == socket.gethostname() and holder["pid"] == os.getpid()
    return None if mine else _live(holder, age)


def _live(holder: dict | None, age: float | None) -> str | None:
    """Who holds a lock that `holder` wrote `age` s ago, when that run still lives: on this host its process
    tells, whatever the lock's age (a live run's heartbeat may wait for the GIL, a long index-map build, longer
    than LOCK_STALE_S); elsewhere the lock's age."""
    if holder is None or age is None:
        return None
    host = socket.gethostname()
    if holder.get("host") != host:
        return live_elsewhere(holder.get("host"), holder["pid"], age)
    return f"pid {holder['pid']} on this host ({host})" if running(holder["pid"], holder.get("start")) else None


def live_elsewhere(host: str, pid: int, age: float) -> str | None:
    """"pid N on host H" of a run on another host whose file (a lock, a partial map) was touched `age` s ago,
    when that is recent enough for the run to live (its process cannot be asked); else None."""
    return f"pid {pid} on host {host}" if age < LOCK_STALE_S else None


def _held_by_live_run(named: str, flag: str, path: str, holder: dict | None, age: float,
                      flags: str = "") -> tuple[str, str] | None:
    """take_lock's refusal of a lock `path` (of `named`, given as `flag`) that `holder` wrote `age` s ago, when
    that run still lives (_live)."""
    flags = flags or flag
    if not (who := _live(holder, age)):
        return None
    if holder.get("host") != socket.gethostname():
        return (f"{named} is locked by {who}, whose lock was touched {age:.0f} s ago (a run's lock is stale after "
                f"{LOCK_STALE_S} s)", f"choose another {flags} directory, or wait, or remove {path} once that run "
                "has ended")
    return (f"{named} is in use by a live run: {who} holds {path}",
            f"wait for that run to end or stop it, or choose another {flags} directory")


def held_record(name: str = LOCK) -> dict | None:
    """The record of the lock `name` this process holds; None: it holds none."""
    held = _held_locks.get(name)
    return held and held["record"]


def holds_lock(folder: str, record: dict, name: str = LOCK, wait_s: float = 0.0) -> bool:
    """Whether `folder` holds the lock `record` another process (another node's rank 0) took in the folder it
    names so: the same folder, shared. A name a network file system cached as missing may show only a while
    after the other node wrote it: it is looked for again for up to `wait_s`."""
    deadline = time.monotonic() + wait_s
    while _read_lock(os.path.join(folder, name)) != record:
        if time.monotonic() >= deadline:
            return False
        time.sleep(1)
    return True


def _read_lock(path: str) -> dict | None:
    try:
        with open(path) as file:
            holder = json.load(file)
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) and isinstance(holder.get("pid"), int) else None


def running(pid: int, start: float | None = None) -> bool:
    """Whether process `pid` (on this host) still runs, with start time `start` when given (not a later process
    given the same pid), and has not ended (a zombie: a rank killed under a parent that never reaps it keeps
    its pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    started = launcher_watch.start_time(pid)
    if started is None:  # ended (a zombie) if its /proc entry can be read; else (no /proc, or another
        # user's process under hidepid) the pid alone tells
        return not os.access(f"/proc/{pid}/stat", os.R_OK)
    return start in (None, started)


def release_lock(*names: str) -> None:
    """Removes the locks of `names` (all when none given) this process holds (rank 0 at the end of
    its run, however it ends), unless another run has taken one over meanwhile, and the folders made
    for them when the run left them empty. A lock that cannot be removed (its folder turned read-only
    or immutable, or vanished with its mount) is left with one warning: the run is ending, often
    reporting that very folder's error, and a later run takes over a lock whose process has ended."""
    for name in names or list(_held_locks):
        held = _held_locks.pop(name, None)
        if held is None:
            continue
        held["beat"].set()
        with held["mutex"]:  # a beat under way ends first
            _remove_held(held)
        paths.remove_empty(held["created"])


def _remove_held(held: dict) -> None:
    if _read_lock(held["path"]) != held["record"]:
        return
    try:
        os.remove(held["path"])
    except FileNotFoundError:
        pass
    except OSError as error:
        print(f"warning: cannot remove the lock {held['path']} ({error.strerror or error}); it is left "
              "there; a later run takes it over once this one has ended and the folder is writable",
              file=sys.stderr, flush=True)


@contextlib.contextmanager
def folder_locked(folder, waiting: str):
    """Runs the block in one process at a time of those that lock `folder` (a read-modify-write of a file in it:
    two at once lost one's change). An flock of the folder itself: no lock file is left behind, and the kernel
    lets it go however its holder ends. `waiting`: the line printed when another process holds it. Where the
    file system has no flock (some network mounts) the block runs unlocked, as before."""
    descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(waiting, file=sys.stderr, flush=True)
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        except OSError:  # no flock here
            pass
        yield
    finally:
        os.close(descriptor)

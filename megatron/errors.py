"""Errors a user can cause, reported as one line that names the problem and the fix."""
import argparse
import atexit
import contextlib
import ctypes
import errno
import functools
import importlib
import os
import signal
import stat
import sys
import threading
import time
import weakref
import warnings

from megatron.held_signals import release_held_signals
from megatron.parallel.launch_env import PRINTER_WAIT, note_rank_0_state, outlive_rank_0, prints_for_its_node


class ConfigError(ValueError):
    """A setting that cannot work. The message is `<problem>; <fix>` on one line."""

    def __init__(self, problem: str, fix: str):
        super().__init__(f"{problem}; {fix}")
        self.problem = problem
        self.fix = fix

    def __reduce__(self):  # pickled whole (a data worker's error): __init__'s arguments are not its args
        return _rebuilt, (type(self), self.args, self.__dict__)


def _rebuilt(cls, args: tuple, fields: dict) -> ConfigError:
    error = Exception.__new__(cls)
    error.args = args
    error.__dict__.update(fields)
    return error


class DataError(ConfigError):
    """A data file or input record that cannot be used (missing, corrupt, malformed). Same
    one-line `<problem>; <fix>` message; a ConfigError so entry points catch both alike."""


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose mistakes (a missing required flag, an unknown one, a bad value) are one
    line naming the fix, as every other mistake is, not argparse's usage block before it."""

    def __init__(self, *args, habits: dict | None = None, **kwargs):
        """`habits`: other programs' flags this one refuses by name, before argparse matches abbreviations,
        each with its equivalent here (megatron.flag_habits)."""
        super().__init__(*args, **kwargs)
        self.habits = habits or {}

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}; see {self.prog} --help\n")

    def refuse(self, problem: str, fix: str):
        """The one line of a mistake whose fix is known (a tool wrapping this parser may raise instead)."""
        self.exit(2, f"{self.prog}: error: {problem}; {fix}\n")

    def parse_known_args(self, args=None, namespace=None):
        if self.habits:
            from megatron.flag_habits import habit_problem

            given = sys.argv[1:] if args is None else list(args)
            if found := habit_problem(given, self._option_string_actions, self.habits):
                self.refuse(*found)
        return super().parse_known_args(args, namespace)


def either(values: list) -> str:
    """'1, 2 or 4': the values a fix lets a setting take."""
    return " or ".join([", ".join(map(str, values[:-1])), str(values[-1])] if len(values) > 1 else map(str, values))


def disk_full(error: BaseException) -> str | None:
    """What a failed write says of its disk ("the disk is full" / "the disk quota is exceeded"), or
    None for another cause: checkpoints, the run log and the --save probe name a full disk alike."""
    return {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded"}.get(
        getattr(error, "errno", None))


WHERE_FIX = "check the path, its permissions and free space (--debug shows where)"  # of a path the run cannot use


def cannot_use(error: OSError, fix: str = "check the path, its permissions and free space") -> ConfigError:
    """The one line of a path that could not be read or written (both paths of a failed rename)."""
    names = " -> ".join(str(name) for name in (error.filename, error.filename2) if name)
    return ConfigError(f"cannot use {names} ({error.strerror or error})", fix)


class GitLfsPointer(DataError):
    """A file that is a Git LFS pointer: a clone of a model or dataset repository made without git-lfs
    holds a ~130-byte text in place of each large file, and copying or cloning it again gives the same."""


LFS_POINTER = b"version https://git-lfs.github.com/spec/v1"  # how every pointer file starts


def refuse_lfs_pointer(path) -> None:
    """Raises GitLfsPointer if the file `path` is a Git LFS pointer (called where a file failed to
    parse: weights, a tokenizer, a Parquet shard), naming it as such rather than as truncated."""
    try:
        with open(path, "rb") as file:
            head = file.read(len(LFS_POINTER))
    except OSError:  # the caller's own error names what is wrong with the path
        return
    if head == LFS_POINTER:
        raise GitLfsPointer(f"{path} is a Git LFS pointer, not the file",
                            f"run git lfs pull in {os.path.dirname(path) or '.'} (after git lfs install)")


class Interrupted(KeyboardInterrupt):
    """SIGTERM, SIGINT or SIGHUP raised as an exception in the main thread, so that the `except
    BaseException` / `finally` clean-ups of a tool remove what it had started."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def stop_signals() -> tuple:
    """The signals that stop a run or a tool: SIGTERM (a scheduler, a launcher), SIGINT (Ctrl-C) and
    SIGHUP (the terminal closed, an SSH session dropped), the last unless it is ignored: a process
    started with `nohup` goes on when its terminal closes, as it was asked to."""
    hangup = () if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN else (signal.SIGHUP,)
    return (signal.SIGTERM, signal.SIGINT, *hangup)


CHILD_IGNORED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # what a worker process leaves to its parent
_forking_parent = None  # (pid, forked from its main thread) of the process whose workers fork in the block
_our_workers = weakref.WeakSet()  # the processes started inside stop_signals_blocked_for_children


@contextlib.contextmanager
def stop_signals_blocked_for_children():
    """Blocks CHILD_IGNORED while worker processes fork inside: a child starts with its parent's handlers
    and would run them (stop the parent's way) until it ignores the signals (ignore_stop_signals_in_child).
    Blocked in this thread only: in a parent with other threads (gloo's, a watch) a signal may still run
    the parent's handler inside the block; in one without, any that arrived meanwhile runs it when this
    ends. So the caller starts its workers inside the try whose finally ends them."""
    global _forking_parent
    import multiprocessing

    _kill_workers_at_exit()
    _forking_parent = (os.getpid(), threading.current_thread() is threading.main_thread())
    before = set(multiprocessing.active_children())
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, CHILD_IGNORED)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        _our_workers.update(set(multiprocessing.active_children()) - before)


def ignore_stop_signals_in_child() -> None:
    """A worker leaves the stop signals (sent to the whole process group) to its parent, which stops
    and ends it; unblocked once ignored (stop_signals_blocked_for_children). As SIGTERM cannot end it,
    it dies with its parent (_die_with_parent)."""
    for signum in CHILD_IGNORED:
        signal.signal(signum, signal.SIG_IGN)
    _die_with_parent()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, CHILD_IGNORED)


def _die_with_parent() -> None:
    """Linux: the kernel SIGKILLs this worker when the thread that forked it ends, even by SIGKILL (the
    out-of-memory killer); a parent that ended before the request (this worker's parent is another
    process by then) ends it here, else it would wait on its parent's queue for ever. Asked only of a
    worker forked by its parent's main thread: one forked by another thread would die with that thread."""
    if sys.platform != "linux" or _forking_parent is None or not _forking_parent[1]:
        return
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != _forking_parent[0]:
        os._exit(1)


@functools.cache
def _kill_workers_at_exit() -> None:
    """Once, before any worker forks: at exit, multiprocessing terminate()s its daemonic processes (SIGTERM,
    which workers ignore) and then joins them without a limit, so a worker stuck in a read, or one a
    failed start left behind, would hold the exit for ever. This hook, registered after multiprocessing's
    (exit hooks run last registered first), kills them before."""
    importlib.import_module("multiprocessing.util")  # registers multiprocessing's exit hook, if not yet
    atexit.register(_kill_live_workers)


def _kill_live_workers() -> None:
    """Our workers only (stop_signals_blocked_for_children's): another library's children keep their own
    way of ending."""
    if _forking_parent is None or _forking_parent[0] != os.getpid():
        return
    live = [worker for worker in list(_our_workers) if worker.is_alive()]
    if live and threading.current_thread() is threading.main_thread():  # the process is leaving: torch's
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # loader, still open, would raise for each worker killed
    for child in live:
        child.kill()


def _ignore(signum, frame):
    """A signal during the clean-up. A handler, not SIG_IGN: one that arrived with the first (a launcher
    passing on Ctrl-C) is then not reported as 'Signal 15 ignored due to race condition'."""


def ignore_signals() -> None:
    """From now on a stop signal changes nothing (a rank that is leaving: its exit hooks, its flush)."""
    if threading.current_thread() is threading.main_thread():
        for signum in stop_signals():
            signal.signal(signum, _ignore)


def _raise_interrupted(signum, frame):
    ignore_signals()  # one clean-up; a repeated signal must not cut it short
    raise Interrupted(signum)


def raise_on_signals() -> dict:
    """From now on the stop signals raise Interrupted in the main thread (signal handlers live there
    only: elsewhere nothing changes); returns the handlers replaced, which the caller puts back
    (restore_signals): each caller owns its own, so nested callers keep theirs."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {signum: signal.signal(signum, _raise_interrupted) for signum in stop_signals()}


def restore_signals(replaced: dict) -> None:
    """Puts back the handlers raise_on_signals replaced (and returned)."""
    for signum, handler in replaced.items():
        signal.signal(signum, handler)


def leave_the_line_to_rank_0(line: str | None = None) -> None:
    """A rank whose start-up error rank 0 prints waits for that line (outlive_rank_0); the launcher ending
    it meanwhile (SIGTERM: it ends every rank once one fails) ends it silently, held signals too. Its `line`
    goes to rank 0's store meanwhile, where its imports loaded torch (device.post_refusal): a node that
    fails alone (a DS_ACCELERATOR it lacks) would leave the ranks at rank 0's rendezvous waiting out its timeout.
    A node's first rank prints the line too (prints_for_its_node): that node's output says why it stopped."""
    release_held_signals()
    if line and prints_for_its_node():
        sys.stderr.write(f"{line}\n")  # one write: another rank's output cannot land inside the line
        sys.stderr.flush()
    for signum in stop_signals():
        signal.signal(signum, signal.SIG_DFL)
    since = time.monotonic()
    if line and "torch" in sys.modules:  # not before the imports (master_address): seconds to load it
        with contextlib.suppress(Exception):
            from megatron.parallel.device import post_refusal

            post_refusal(line, since + PRINTER_WAIT)
    outlive_rank_0(since)


BEFORE_THE_FIRST_STEP = "before the first step; nothing was saved"  # the trainer's start-up (its imports included)
BEFORE_ANY_WORK = "before it read or wrote anything"  # a tool's imports


def stopped_during_start_up(signum: int, prog: str = "pretrain_bert.py", before: str = BEFORE_THE_FIRST_STEP) -> str:
    """The line of a stop during start-up: pretrain_bert.py's before the training loop (imports, checks,
    data, engine); a tool's during its imports (start_up_stops_in_one_line)."""
    return f"{prog}: stopped by {signal.Signals(signum).name} during start-up, {before}"


@contextlib.contextmanager
def start_up_stops_in_one_line(prog: str, before: str = BEFORE_ANY_WORK, tell: bool = True):
    """Around an entry point's imports (torch, DeepSpeed: seconds, before run_tool or main install their
    handlers): a stop signal there (Ctrl-C at once) is one line and exit 128 + signal, not a
    KeyboardInterrupt traceback through the imports; a ConfigError (a DS_ACCELERATOR this machine
    lacks) is `<prog>: error: ...` and exit 2. `tell` False: another process says it (a rank
    other than 0 of a launch). A signal that came while held (held_signals.hold_stop_signals, an
    entry point's first line) is raised again here, inside the block."""
    held = release_held_signals()  # first: the handlers replaced below are then the process' own
    replaced = raise_on_signals()
    try:
        for signum in held:
            signal.raise_signal(signum)
        yield
    except Interrupted as error:
        if tell:
            print(stopped_during_start_up(error.signum, prog, before), file=sys.stderr, flush=True)
        sys.exit(128 + error.signum)  # the stop signals stay ignored: a second Ctrl-C cannot cut the exit short
    except ConfigError as error:
        if tell:
            print(f"{prog}: error: {error}", file=sys.stderr, flush=True)
            note_rank_0_state(f"{prog}: error: {error}")  # rank 0's, which the other nodes read (deepspeed_command)
        else:
            leave_the_line_to_rank_0(f"{prog}: error: {error}")
        sys.exit(2)
    except BaseException:
        restore_signals(replaced)
        raise
    restore_signals(replaced)


LOST_STREAM = (errno.EIO, errno.EPIPE)  # a closed terminal (an SSH drop), a reader that is gone (`| head`)


class LosableStream:
    """stdout or stderr, whose terminal may close under a long run (a closed window, an SSH drop: EIO)
    or whose reader may end (`| head`, a dead `tee`: EPIPE). Such a failed write ends the writing to
    that stream, not the run: its file descriptor then points to /dev/null (the buffered text and
    later writes, C libraries' included, go there), the run's records stay in metrics.jsonl, and for
    a terminal the `other` stream, while it lasts, says so in one line. Only a terminal, pipe or socket is lost so:
    a regular file's EIO (`> run.log` on NFS or Lustre) is the file system's, an error like any
    other. Anything else is the stream's own (isatty, fileno, encoding)."""

    def __init__(self, stream, name: str = "", other: "LosableStream | None" = None):
        self._stream = stream
        self.name, self.other = name or getattr(stream, "name", "a stream"), other
        self.losable = _losable(stream)
        self.lost = False

    def __getattr__(self, name):
        return getattr(self._stream, name)

    def write(self, text: str) -> int:
        self._guarded(self._stream.write, text)
        return len(text)

    def flush(self) -> None:
        self._guarded(self._stream.flush)

    def _guarded(self, call, *args) -> None:
        if self.lost:
            return
        try:
            call(*args)
        except OSError as error:
            if error.errno not in LOST_STREAM or not self.losable:
                raise
            self.losable = False  # /dev/null from now on (the descriptor, the buffer too): nothing more to lose
            try:
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, self._stream.fileno())
                os.close(null)
            except (OSError, ValueError, AttributeError):  # a stream without a descriptor: drop its writes
                self.lost = True
            self._tell_the_other(error.errno)

    def _tell_the_other(self, cause: int) -> None:
        """Only for a terminal: a pipe's reader ending is how `| head` works."""
        if cause == errno.EIO and self.other is not None:
            print(f"{self.name}'s terminal is gone: its output is dropped from now on; metrics.jsonl keeps every "
                  "record", file=self.other, flush=True)


def _losable(stream) -> bool:
    """Whether `stream` is a terminal, a pipe or a socket (by its descriptor; one without a
    descriptor, by isatty)."""
    try:
        mode = os.fstat(stream.fileno()).st_mode
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is both
        return bool(getattr(stream, "isatty", lambda: False)())
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def survive_lost_terminal() -> None:
    """stdout and stderr as LosableStream, each telling the other when it is lost: call before
    anything keeps a reference to them (DeepSpeed's logger, a progress bar)."""
    sys.stdout = LosableStream(sys.stdout, "stdout")
    sys.stderr = LosableStream(sys.stderr, "stderr", other=sys.stdout)
    sys.stdout.other = sys.stderr


def _one_line_warning(message, *_) -> None:
    print(f"warning: {message}", file=sys.stderr)


def _settle_stdout() -> None:
    """Flushes stdout; if that fails too (the closed pipe, the full disk), points it at /dev/null, so
    that the flush at exit does not fail again with Python's `Exception ignored` lines and status 120."""
    try:
        sys.stdout.flush()
    except OSError:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)


def run_tool(prog, main, one_line_warnings: bool = False) -> int:
    """Runs a command-line tool's `main()`: a ConfigError becomes `<prog>: error: <problem>; <fix>`
    on stderr and exit code 2 (argparse's own code for a bad command line), no traceback. SIGINT
    (Ctrl-C), SIGTERM and SIGHUP (stop_signals) stop it the same way: its clean-up runs, one line, exit 128 + signal.
    Output into a closed pipe (`tool | head`) stops quietly with 128 + SIGPIPE, as cat does.
    `one_line_warnings`: a library's Python warning is `warning: <message>`, not its file, line and source.
    `prog` may be a callable, asked when a line is printed: a tool's parsed flags may name another program (a
    launch script's --script-names SCRIPT: its user ran the script, not the tool)."""
    name = prog if callable(prog) else lambda: prog
    replaced = raise_on_signals()
    shown = warnings.showwarning
    if one_line_warnings:
        warnings.showwarning = _one_line_warning
    try:
        code = main() or 0
        sys.stdout.flush()  # here, where a closed pipe or a full disk is caught, not at exit
        return code
    except ConfigError as error:
        print(f"{name()}: error: {error}", file=sys.stderr, flush=True)
        return 2
    except BrokenPipeError:
        _settle_stdout()
        return 128 + signal.SIGPIPE
    except OSError as error:  # a path the tool reads or writes: permissions, a folder for a file, space
        if error.filename:
            print(f"{name()}: error: {cannot_use(error)}", file=sys.stderr, flush=True)
        elif full := disk_full(error):  # a write() or flush: no file name (a tool that knows its output names it)
            _settle_stdout()
            print(f"{name()}: error: a write failed: {full} ({error.strerror or error}); free space on the disk the "
                  "output goes to, or write it to another disk", file=sys.stderr, flush=True)
        else:
            raise
        return 2
    except KeyboardInterrupt as error:
        signum = getattr(error, "signum", signal.SIGINT)
        print(f"{name()}: error: interrupted by {signal.Signals(signum).name}, partial output removed; "
              "rerun the same command to start over", file=sys.stderr, flush=True)
        return 128 + signum
    finally:
        warnings.showwarning = shown
        restore_signals(replaced)  # a caller in the same process keeps its own

"""Errors a user can cause, reported as one line that names the problem and the fix."""
import argparse
import errno
import signal
import sys
import threading


class ConfigError(ValueError):
    """A setting that cannot work. The message is `<problem>; <fix>` on one line."""

    def __init__(self, problem: str, fix: str):
        super().__init__(f"{problem}; {fix}")
        self.problem = problem
        self.fix = fix


class DataError(ConfigError):
    """A data file or input record that cannot be used (missing, corrupt, malformed). Same
    one-line `<problem>; <fix>` message; a ConfigError so entry points catch both alike."""


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose mistakes (a missing required flag, an unknown one, a bad value) are one
    line naming the fix, as every other mistake is, not argparse's usage block before it."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}; see {self.prog} --help\n")


def disk_full(error: BaseException) -> str | None:
    """What a failed write says of its disk ("the disk is full" / "the disk quota is exceeded"), or
    None for another cause: checkpoints, the run log and the --save probe name a full disk alike."""
    return {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded"}.get(
        getattr(error, "errno", None))


def cannot_use(error: OSError, fix: str = "check the path, its permissions and free space") -> ConfigError:
    """The one line of a path that could not be read or written (both paths of a failed rename)."""
    names = " -> ".join(str(name) for name in (error.filename, error.filename2) if name)
    return ConfigError(f"cannot use {names} ({error.strerror or error})", fix)


class Interrupted(KeyboardInterrupt):
    """SIGTERM (or SIGINT) raised as an exception in the main thread, so that the `except
    BaseException` / `finally` clean-ups of a tool remove what it had started."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _ignore(signum, frame):
    """A signal during the clean-up. A handler, not SIG_IGN: one that arrived with the first (a launcher
    passing on Ctrl-C) is then not reported as 'Signal 15 ignored due to race condition'."""


def _raise_interrupted(signum, frame):
    signal.signal(signal.SIGTERM, _ignore)  # one clean-up; a repeated signal must not cut it short
    signal.signal(signal.SIGINT, _ignore)
    raise Interrupted(signum)


def raise_on_signals() -> dict:
    """From now on SIGTERM and SIGINT raise Interrupted in the main thread (signal handlers live there
    only: elsewhere nothing changes); returns the handlers replaced, which the caller puts back
    (restore_signals): each caller owns its own, so nested callers keep theirs."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {signum: signal.signal(signum, _raise_interrupted) for signum in (signal.SIGTERM, signal.SIGINT)}


def restore_signals(replaced: dict) -> None:
    """Puts back the handlers raise_on_signals replaced (and returned)."""
    for signum, handler in replaced.items():
        signal.signal(signum, handler)


def run_tool(prog: str, main) -> int:
    """Runs a command-line tool's `main()`: a ConfigError becomes `<prog>: error: <problem>; <fix>`
    on stderr and exit code 2 (argparse's own code for a bad command line), no traceback. SIGINT
    (Ctrl-C) and SIGTERM stop it the same way: its clean-up runs, one line, exit 128 + signal."""
    replaced = raise_on_signals()
    try:
        return main() or 0
    except ConfigError as error:
        print(f"{prog}: error: {error}", file=sys.stderr, flush=True)
        return 2
    except OSError as error:  # a path the tool reads or writes: permissions, a folder for a file, space
        if not error.filename:
            raise
        print(f"{prog}: error: {cannot_use(error)}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt as error:
        signum = getattr(error, "signum", signal.SIGINT)
        print(f"{prog}: error: interrupted by {signal.Signals(signum).name}, partial output removed; "
              "rerun the same command to start over", file=sys.stderr, flush=True)
        return 128 + signum
    finally:
        restore_signals(replaced)  # a caller in the same process keeps its own

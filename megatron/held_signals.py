"""A stop signal in an entry point's first milliseconds, before megatron.errors and what it imports are
loaded and errors.start_up_stops_in_one_line installs its handlers: Ctrl-C as a launcher spawns the
ranks reaches each of them wherever it is, often there, where Python's own handler printed a
KeyboardInterrupt traceback through the first imports (2 x 10 lines, for 2 ranks). hold_stop_signals,
called first, keeps such a signal; start_up_stops_in_one_line raises it again inside its block, which
then reports it as its one line. Only `signal` is imported: this module is the window's first import.
"""
import signal

_held = []  # the stop signals that arrived while held, in order
_replaced = {}  # signal -> the handler hold_stop_signals replaced, put back by release_held_signals


def _hold(signum, frame):
    _held.append(signum)


def hold_stop_signals() -> None:
    """From now on SIGINT, SIGTERM and SIGHUP (errors.stop_signals) are kept, not acted on, until
    release_held_signals. One the process ignores stays ignored: a SIGHUP under nohup, which
    stop_signals tells by that."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        handler = signal.getsignal(signum)
        if handler is not signal.SIG_IGN and handler is not _hold:
            _replaced[signum] = signal.signal(signum, _hold)


def release_held_signals() -> list:
    """Puts back the handlers hold_stop_signals replaced; returns the signals that arrived meanwhile,
    for the caller to raise again (signal.raise_signal) once its own handlers are installed. Nothing
    without an earlier hold_stop_signals."""
    for signum, handler in _replaced.items():
        signal.signal(signum, handler)
    _replaced.clear()
    held = list(_held)
    _held.clear()
    return held

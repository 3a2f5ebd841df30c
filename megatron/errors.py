"""Errors a user can cause, reported as one line that names the problem and the fix."""
import sys


class ConfigError(ValueError):
    """A setting that cannot work. The message is `<problem>; <fix>` on one line."""

    def __init__(self, problem: str, fix: str):
        super().__init__(f"{problem}; {fix}")
        self.problem = problem
        self.fix = fix


class DataError(ConfigError):
    """A data file or input record that cannot be used (missing, corrupt, malformed). Same
    one-line `<problem>; <fix>` message; a ConfigError so entry points catch both alike."""


def run_tool(prog: str, main) -> int:
    """Runs a command-line tool's `main()`: a ConfigError becomes `<prog>: error: <problem>; <fix>`
    on stderr and exit code 2 (argparse's own code for a bad command line), no traceback."""
    try:
        return main() or 0
    except ConfigError as error:
        print(f"{prog}: error: {error}", file=sys.stderr, flush=True)
        return 2

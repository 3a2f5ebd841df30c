"""Errors a user can cause, reported as one line that names the problem and the fix."""


class ConfigError(ValueError):
    """A setting that cannot work. The message is `<problem>; <fix>` on one line."""

    def __init__(self, problem: str, fix: str):
        super().__init__(f"{problem}; {fix}")
        self.problem = problem
        self.fix = fix


class DataError(ConfigError):
    """A data file or input record that cannot be used (missing, corrupt, malformed). Same
    one-line `<problem>; <fix>` message; a ConfigError so entry points catch both alike."""

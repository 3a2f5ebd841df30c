"""Errors a user can cause, reported as one line that names the problem and the fix."""


class ConfigError(ValueError):
    """A setting that cannot work. The message is `<problem>; <fix>` on one line."""

    def __init__(self, problem: str, fix: str):
        super().__init__(f"{problem}; {fix}")
        self.problem = problem
        self.fix = fix

"""Errors that end a command with a one-line message instead of a traceback."""


class PrimeError(Exception):
    """A failure with a message that says everything; the command exits with `exit_code`."""

    exit_code = 1


class UserError(PrimeError):
    """A problem with what the user gave us (bad input, a missing file). Exit code 2."""

    exit_code = 2


class ConfigError(UserError):
    """A config that cannot be read or does not validate."""


class NonFiniteError(PrimeError):
    """Loss, gradient norm or updated parameters are NaN/inf: nothing of the step is written. Exit code 3: the run's
    own numbers went wrong, and running it again from a checkpoint would repeat them (`rl` does not)."""

    exit_code = 3


def first_line(exc: BaseException) -> str:
    """An exception as one line: its type and its message's first line."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__

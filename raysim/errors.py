import errno

"""The one exception type that reaches the user as a single line (exit code 2)."""


class RaysimError(Exception):
    """A problem with the user's input or environment.

    The message must name the problem and the fix in one line; the CLI prints
    it on stderr without a traceback and exits with code 2.
    """


def need(condition: bool, message: str) -> None:
    """Raise RaysimError(message) unless `condition` holds: the one-line checks of configs, tables and sweeps."""
    if not condition:
        raise RaysimError(message)


def user_message(exc: BaseException) -> str:
    """The message of a RaysimError, also when an actor raised it: Ray then wraps it in a RayTaskError
    (still a RaysimError) whose text is a traceback, and keeps the original as `.cause`."""
    while isinstance(getattr(exc, "cause", None), BaseException):
        exc = exc.cause
    return str(exc)


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def disk_full(exc: BaseException) -> str | None:
    """The file a full disk refused, if that is why `exc` (or what an actor raised under it) happened."""

    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            return exc.filename or "writing the run's files"
        exc = getattr(exc, "cause", None) or exc.__cause__ or exc.__context__
    return None

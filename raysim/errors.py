"""The one exception type that reaches the user as a single line (exit code 2)."""


class RaysimError(Exception):
    """A problem with the user's input or environment.

    The message must name the problem and the fix in one line; the CLI prints
    it on stderr without a traceback and exits with code 2.
    """

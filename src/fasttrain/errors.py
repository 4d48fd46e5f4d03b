"""The one exception type users see: a one-line message, a non-zero exit, no traceback."""


class FasttrainError(Exception):
    """Bad input or a failed precondition. The message is one line naming the problem and,
    where there is a closed set, the valid choices."""

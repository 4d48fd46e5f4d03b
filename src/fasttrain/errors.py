"""The exception types users see: a one-line message, a non-zero exit, no traceback."""


class FasttrainError(Exception):
    """Bad input or a failed precondition. The message is one line naming the problem and,
    where there is a closed set, the valid choices."""

    exit_status = 1


class PeersLost(FasttrainError):
    """A ddp rank whose collective failed because another rank died or stopped answering. Its own
    exit status (EX_PROTOCOL), so the launcher names the rank that failed first on its own, not the
    ranks that only lost it (torchrun's failure times are whole seconds: both often tie)."""

    exit_status = 76


class Preempted(FasttrainError):
    """Stopped by SIGTERM/SIGUSR1 after writing a checkpoint at the step it stopped: run the same
    command again to resume. Its exit status (EX_TEMPFAIL) tells a scheduler to requeue."""

    exit_status = 75  # preemption.EXIT_PREEMPTED

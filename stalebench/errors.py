"""Exceptions that carry a message meant for the user, printed as one line by the CLI."""


class ConfigError(ValueError):
    """Bad input: names the config key, the value and what would be valid."""


class RunDirTaken(ConfigError):
    """run_dir holds a run and neither resume nor overwrite was asked for."""


class BadCheckpoint(RunDirTaken):
    """resume=true, and the run's checkpoint of this config holds a file that cannot be read
    safely: the run is not started, and nothing of its directory is changed."""

    def __init__(self, why: str):
        super().__init__(
            f"resume=true: {why}. Nothing of the run directory was changed: set "
            "resume_unreadable=restart to start over (the run's files moved aside to "
            "previous/), or remove the checkpoint"
        )


class RunError(RuntimeError):
    """A run that cannot go on (dead peer, timeout, deadlock); the message names the culprit."""


def last_line(exc: BaseException) -> str:
    """An exception as its traceback's last line: its type and its message's first line
    (what summary.json's `error` says of an exception raised inside a run)."""
    message = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def write_error(exc: OSError, path: object) -> OSError:
    """A write's OSError (a full disk: ENOSPC) as one naming the file it was writing (a
    failed write or flush of an open file names none)."""
    return OSError(exc.errno, exc.strerror or str(exc), str(path))


def with_traceback(exc: BaseException) -> bool:
    """Whether a log of `exc` shows its traceback: not for an OSError, the machine's (a full
    disk, a file that cannot be written), whose message says all (`write_error` names the
    file); a traceback for anything else, which may be a bug."""
    return not isinstance(exc, OSError)

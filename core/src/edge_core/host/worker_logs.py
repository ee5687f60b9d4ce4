"""Where a worker's stdout and stderr go: never to the controller's stdout.

The controller's stdout carries only its own output (``edge run --json`` prints one JSON
document there). A worker's output therefore goes

* to a log file per worker, ``<directory>/<stage>.g<generation>.log``, when a log
  directory is set (:func:`set_log_directory`, or the ``EDGE_WORKER_LOG_DIR``
  environment variable); the file is named in the execution plan (``worker.log``);
* otherwise to the controller's stderr — both of the worker's streams.

Every command that starts workers (``edge run``, ``plan``, ``profile``, ``conformance``,
``serve``) logs to a fresh directory (or ``EDGE_WORKER_LOG_DIR``'s) unless ``--verbose``
is given, which shows the workers' output on stderr instead
(:func:`edge_core.cli.common.worker_logs`). A fresh directory is removed at exit
(:func:`remove_if_silent`) when every log in it stayed empty, the logs with it; one where
a worker wrote anything is kept whole, empty logs included, and so is one that a command
that failed named as where to look (:func:`keep_log_directory`), whatever its logs.

No worker of the command writes into a removed directory: a command retires and
verifies its workers before it ends, and the removal at exit retires every worker still
running first (:func:`edge_core.host.exit_cleanup.retire_all`: what they write as they
end is in their logs when the directory is judged). What can outlive the command is a
tree whose retirement was not verified (its reservation is quarantined, and the command
says so) or a process a worker started outside its own tree (one that detached itself):
it still holds its log open, and what it writes after the removal is lost with the
unlinked file; nothing fails.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import IO, Any

__all__ = ["LOG_DIR_ENV", "WorkerOutput", "keep_log_directory", "log_directory",
           "open_worker_output", "remove_if_silent", "set_log_directory"]

#: Environment variable naming the directory for per-worker log files.
LOG_DIR_ENV = "EDGE_WORKER_LOG_DIR"
_STDERR_FD = 2
_directory: Path | None = None
#: Every log file this process opened for a worker (one per worker start).
_opened: set[Path] = set()
#: Directories kept at exit whatever their logs (:func:`keep_log_directory`).
_kept: set[Path] = set()


def set_log_directory(directory: Path | None) -> Path | None:
    """Log every worker started from now on into ``directory``.

    ``None`` unsets it: ``EDGE_WORKER_LOG_DIR``'s directory then, else the stderr.

    Returns:
        The directory set before (``None`` when none was), so that a caller that sets
        one for a while can put the previous setting back.
    """
    global _directory
    previous, _directory = _directory, directory
    return previous


def log_directory() -> Path | None:
    """The directory worker logs go to, or ``None`` when they go to stderr."""
    if _directory is not None:
        return _directory
    value = os.environ.get(LOG_DIR_ENV, "").strip()
    return Path(value) if value else None


class WorkerOutput:
    """The stdout/stderr targets for one worker, and the log file if there is one."""

    def __init__(self, target: int | IO[Any], path: Path | None) -> None:
        self.stdout = target
        self.stderr = target
        #: The log file, or ``None`` when the output goes to the controller's stderr.
        self.path = path
        self._file = target if not isinstance(target, int) else None

    def close(self) -> None:
        """Close the controller's handle on the log file (the worker keeps its own)."""
        if self._file is not None:
            self._file.close()
            self._file = None


def open_worker_output(stage_id: str, generation: int) -> WorkerOutput:
    """Open the output targets for a worker of ``stage_id`` at ``generation``."""
    directory = log_directory()
    if directory is None:
        return WorkerOutput(_STDERR_FD, None)
    directory.mkdir(parents=True, exist_ok=True)
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", stage_id) or "stage"
    path = directory / f"{safe}.g{generation}.log"
    handle = path.open("ab")
    _opened.add(path)
    return WorkerOutput(handle, path)


def keep_log_directory(directory: Path) -> None:
    """Keep ``directory`` at exit whatever its logs; made now if it is not there yet.

    For a command that failed and names it as where to look (``edge: worker logs: DIR``,
    ``worker_logs``): a folder removed at exit because every log stayed empty — or never
    made, when no worker started — would make that line point at nothing. Its empty logs
    are kept too: they say that the workers wrote nothing.

    Raises:
        OSError: the directory cannot be made.
    """
    directory.mkdir(parents=True, exist_ok=True)
    _kept.add(directory)


def remove_if_silent(directory: Path) -> bool:
    """Remove ``directory`` and its logs when every one stayed empty; True if it is gone.

    For a directory this process made for its workers' logs, called at exit: the empty
    log files this process opened there (:func:`open_worker_output`) are unlinked, then
    the directory. It is left whole — every log in it, empty or not — as soon as one
    entry is anything else: a log a worker wrote to, a file or folder this process did
    not open as a log, a symbolic link; and when it was kept (:func:`keep_log_directory`).
    A directory already gone counts as removed.
    """
    import contextlib  # at exit only: no import for every command

    if directory in _kept:
        return False
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return True
    except OSError:  # not a directory, not readable: left as it is
        return False
    for entry in entries:
        try:
            silent = (directory / entry.name in _opened
                      and entry.is_file(follow_symlinks=False)
                      and entry.stat(follow_symlinks=False).st_size == 0)
        except OSError:  # gone or unreadable meanwhile: left as it is
            silent = False
        if not silent:
            return False
    for entry in entries:
        with contextlib.suppress(OSError):  # gone meanwhile; else rmdir below says so
            os.unlink(entry.path)
    try:
        os.rmdir(directory)
    except FileNotFoundError:
        return True
    except OSError:  # something new in it meanwhile: left as it is
        return False
    return True

"""The server's open-file limit (``RLIMIT_NOFILE``): raised at start, and what is in use.

Every connection is one of the process's file descriptors, and the soft limit most
systems start a process with (1024) is far below what they let it ask for (the hard
limit: often 524288 or more). :func:`raise_open_file_limit` raises the soft limit to the
hard one, but not past :data:`OPEN_FILES_CEILING` (and never lowers it), before any
worker starts; the server's connection cap (:mod:`edge_serve.connections`) is sized from
the limit then, and :func:`files_in_use`, what the server and its pipelines hold.
Platforms without ``RLIMIT_NOFILE`` (Windows) report ``None`` for every figure.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["OPEN_FILES_CEILING", "OpenFileLimit", "files_in_use", "raise_open_file_limit"]

OPEN_FILES_CEILING: Final = 65536
"""The highest soft limit :func:`raise_open_file_limit` sets by itself: the default
connection cap follows from it (about half of it), and more connections than that are
more than one event loop serves well; a soft limit already above it is kept."""

_FD_FOLDERS: Final = ("/proc/self/fd", "/dev/fd")


@dataclass(frozen=True)
class OpenFileLimit:
    """The soft open-file limit before and after start-up, and the hard limit.

    Attributes:
        before: The soft limit the process started with (None: no such limit here).
        soft: The soft limit now.
        hard: The hard limit (None: unlimited, or no such limit here).
    """

    before: int | None
    soft: int | None
    hard: int | None

    @property
    def raised(self) -> bool:
        """Whether start-up raised the soft limit."""
        return self.before is not None and self.soft is not None and self.soft > self.before

    def to_json(self) -> dict[str, Any]:
        """``{"soft_before": ..., "soft": ..., "hard": ...}``."""
        return {"soft_before": self.before, "soft": self.soft, "hard": self.hard}


def raise_open_file_limit(ceiling: int = OPEN_FILES_CEILING) -> OpenFileLimit:
    """Raise the soft open-file limit to the hard one, at most to ``ceiling``; the limits.

    A soft limit at or above that is left as it is; one the system does not let the
    process raise (macOS caps it below an unlimited hard limit) too.
    """
    try:
        import resource
    except ImportError:  # Windows: no such limit
        return OpenFileLimit(None, None, None)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    infinite = resource.RLIM_INFINITY
    shown_hard = None if hard == infinite else hard
    if soft == infinite:
        return OpenFileLimit(None, None, shown_hard)
    target = ceiling if hard == infinite else min(hard, ceiling)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            return OpenFileLimit(soft, soft, shown_hard)
        return OpenFileLimit(soft, target, shown_hard)
    return OpenFileLimit(soft, soft, shown_hard)


def files_in_use() -> int | None:
    """How many file descriptors the process holds now (None where it cannot be read)."""
    for folder in _FD_FOLDERS:
        try:
            return len(os.listdir(folder)) - 1  # the listing's own descriptor
        except OSError:
            continue
    return None

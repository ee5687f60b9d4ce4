"""CPython's private ``_posixshmem`` module, typed: ``shm_open`` and ``shm_unlink``."""

from __future__ import annotations

import importlib
from typing import Protocol, cast

__all__ = ["PosixShm", "load_posixshmem"]


class PosixShm(Protocol):
    """The two functions of CPython's private ``_posixshmem`` module that are used here."""

    def shm_open(self, path: str, flags: int, mode: int = 0o777) -> int:
        """Open (or create) a POSIX shared-memory object; return its descriptor."""
        ...

    def shm_unlink(self, path: str) -> None:
        """Remove a POSIX shared-memory object's name."""
        ...


def load_posixshmem() -> PosixShm | None:
    """The module where the interpreter has it (CPython on POSIX), else None."""
    try:  # absent on Windows, where shared memory is not offered
        return cast(PosixShm, importlib.import_module("_posixshmem"))
    except ImportError:  # pragma: no cover - exercised only on non-POSIX interpreters
        return None

"""Standard output that a closed pipe cannot turn into a traceback.

``edge probe --json | head -1``: once the reader has gone, a write raises
``BrokenPipeError``. :class:`ClosedPipeGuard` stands in for ``sys.stdout`` while a command
runs: the first broken write points file descriptor 1 at the null device (so the
interpreter's final flush is quiet too) and every later write is dropped. The command
itself runs to its end and keeps its own exit code.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, TextIO

__all__ = ["ClosedPipeGuard"]


class ClosedPipeGuard:
    """A text stream wrapper that swallows writes after the reader closed the pipe."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        #: True once a write found the pipe closed.
        self.broken = False

    def write(self, text: str) -> int:
        """Write ``text``, or drop it when the pipe is closed; returns its length."""
        if not self.broken:
            try:
                self._stream.write(text)
            except BrokenPipeError:
                self._silence()
        return len(text)

    def flush(self) -> None:
        """Flush, unless the pipe is closed."""
        if not self.broken:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._silence()

    def _silence(self) -> None:
        self.broken = True
        try:
            fd = self._stream.fileno()
        except (AttributeError, OSError, ValueError):
            return
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, fd)
        finally:
            os.close(null)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

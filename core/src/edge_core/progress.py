"""A small progress reporter for long work (hashing, loading, qualification), on stderr.

It draws one line, redrawn in place (carriage return) on a terminal, or a plain line per
update (at most one every few seconds) on anything else. Whether it draws at all is
decided once, when it is made:

- ``enabled=False`` (what commands pass under ``--json``): never draws;
- ``enabled=True``: draws even when the stream is not a terminal (forced);
- ``enabled=None``: the environment variable ``EDGE_PROGRESS`` decides when set
  (``1``/``always`` forces, ``0``/``never`` silences), otherwise the stream's
  ``isatty()``.

Nothing is drawn while the total is below ``min_total`` (short work needs no bar).
It has no dependencies and is meant for one thread at a time.
"""

from __future__ import annotations

import os
import sys
import time
from types import TracebackType
from typing import TextIO

__all__ = ["PROGRESS_ENV", "Progress", "progress_wanted"]

PROGRESS_ENV = "EDGE_PROGRESS"
"""Environment variable that forces progress on (``1``, ``always``) or off (``0``, ``never``)."""

_ON = {"1", "always", "yes", "on", "true"}
_OFF = {"0", "never", "no", "off", "false"}
_BAR_WIDTH = 24
_TTY_INTERVAL_S = 0.1
_LOG_INTERVAL_S = 5.0


def progress_wanted(stream: TextIO, enabled: bool | None = None) -> bool:
    """Whether a reporter on ``stream`` should draw, given an explicit choice or none."""
    if enabled is not None:
        return enabled
    setting = os.environ.get(PROGRESS_ENV, "").strip().lower()
    if setting in _ON:
        return True
    if setting in _OFF:
        return False
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if isatty is not None else False
    except (OSError, ValueError):
        return False


def _amount(value: float, unit: str) -> str:
    if unit != "B":
        return f"{value:,.0f}{unit and ' ' + unit}"
    for scale, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if value >= scale:
            return f"{value / scale:.1f} {name}"
    return f"{value:.0f} B"


class Progress:
    """A progress line for one piece of long work.

    Args:
        label: what is being done, e.g. ``hashing``.
        total: the amount of work when known (bytes when ``unit`` is ``B``); may be set
            later with :meth:`set_total`.
        unit: ``B`` for bytes (shown in KiB/MiB/GiB with a rate), else a count noun.
        stream: where to draw; standard error by default.
        enabled: ``True`` forces drawing, ``False`` silences it, ``None`` decides from the
            environment and the stream (see the module docstring).
        min_total: draw nothing while the total is below this.

    """

    def __init__(
        self,
        label: str,
        total: int | None = None,
        *,
        unit: str = "B",
        stream: TextIO | None = None,
        enabled: bool | None = None,
        min_total: int = 0,
    ) -> None:
        self.label = label
        self.total = total
        self.unit = unit
        self.done = 0
        self.note = ""
        self.min_total = min_total
        self._stream = stream if stream is not None else sys.stderr
        self._tty = self._is_tty()
        self._wanted = progress_wanted(self._stream, enabled)
        self._started = time.monotonic()
        self._last_draw = float("-inf")
        self._closed = False

    def _is_tty(self) -> bool:
        isatty = getattr(self._stream, "isatty", None)
        try:
            return bool(isatty()) if isatty is not None else False
        except (OSError, ValueError):
            return False

    @property
    def drawing(self) -> bool:
        """True when this reporter writes to its stream (wanted, and the total is large)."""
        if not self._wanted or self._closed:
            return False
        return self.total is None or self.total >= self.min_total

    def set_total(self, total: int | None) -> None:
        """Set (or change) the total amount of work."""
        self.total = total

    def update(self, amount: int = 1, *, note: str | None = None) -> None:
        """Record ``amount`` more work done; ``note`` names the current item (a file)."""
        self.done += amount
        if note is not None:
            self.note = note
        if not self.drawing:
            return
        now = time.monotonic()
        interval = _TTY_INTERVAL_S if self._tty else _LOG_INTERVAL_S
        if now - self._last_draw >= interval:
            self._draw(now, final=False)

    def line(self, now: float | None = None) -> str:
        """The current progress line, without carriage return or newline."""
        elapsed = max((time.monotonic() if now is None else now) - self._started, 1e-9)
        parts = [self.label]
        if self.total:
            fraction = min(self.done / self.total, 1.0)
            filled = int(fraction * _BAR_WIDTH)
            parts.append("[" + "#" * filled + "-" * (_BAR_WIDTH - filled) + "]")
            parts.append(f"{fraction * 100:3.0f}%")
            parts.append(f"{_amount(self.done, self.unit)}/{_amount(self.total, self.unit)}")
        else:
            parts.append(_amount(self.done, self.unit))
        rate = self.done / elapsed
        if self.unit == "B":
            parts.append(f"{_amount(rate, 'B')}/s")
        if self.total and rate > 0 and self.done < self.total:
            parts.append(f"ETA {(self.total - self.done) / rate:.0f}s")
        if self.note:
            parts.append(self.note)
        return " ".join(parts)

    def _draw(self, now: float, *, final: bool) -> None:
        text = self.line(now)
        try:
            if self._tty:
                end = "\n" if final else ""
                self._stream.write("\r" + text + "\x1b[K" + end)
            else:
                self._stream.write(text + "\n")
            self._stream.flush()
        except (OSError, ValueError):
            self._wanted = False
            return
        self._last_draw = now

    def close(self) -> None:
        """Draw the final line (when drawing) and stop; later updates draw nothing."""
        if self.drawing:
            self._draw(time.monotonic(), final=True)
        self._closed = True

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

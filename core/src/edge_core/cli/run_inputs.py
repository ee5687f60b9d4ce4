"""``edge run --input``: which files a run reads, checking them first, and a progress bar.

``--input`` may be given several times; each value is a file or a directory. A directory
contributes its regular, non-hidden files, sorted by name, keeping only those whose suffix
the pipeline's ``prepare`` callable lists in its ``input_suffixes`` attribute when it has
one (the OCR example lists image suffixes), else all of them.

Every input goes through ``prepare`` *before* the pipeline opens, so a bad one is refused
with exit code 2 and one line naming it, and no worker starts. ``prepare`` signals bad
input by raising ``ValueError`` (a typed subclass names the reason) or ``OSError``; any
other exception is a bug in ``prepare`` and propagates. The first :data:`KEEP_PREPARED`
prepared inputs are kept for the run; later ones are prepared again when their turn comes
(a long batch does not hold every input in memory at once).

Once the pipeline is open, :class:`BufferedInputs` copies each large first-stage tensor
(``--input``, ``--inputs`` or the bundled example) into one of the pipeline's input
buffers, once per input: every ``--repeat`` request then sends it by reference, and a later
input of the same name, shape and dtype reuses the same buffer. Tensors below the
shared-memory threshold, ``carry:*`` inputs and stages without shared memory are sent as
they are.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, TextIO

from edge_core.cli import common

__all__ = ["KEEP_PREPARED", "BufferedInputs", "PreparedInputs", "Progress", "expand_inputs"]

KEEP_PREPARED: Final = 16
"""How many prepared inputs a run keeps from the check before the pipeline opens."""


def expand_inputs(sources: Sequence[str], suffixes: Sequence[str] | None) -> list[str]:
    """Files to read, in order: each ``--input`` value, directories expanded.

    A path that does not exist is kept as given (``prepare`` names what is wrong with it).

    Raises:
        common.CommandFailed: (exit 2) a directory holds no file to read.

    """
    wanted = {s.lower() for s in suffixes} if suffixes else None
    files: list[str] = []
    for source in sources:
        if not os.path.isdir(source):
            files.append(source)
            continue
        found = sorted(
            str(entry) for entry in Path(source).iterdir()
            if entry.is_file() and not entry.name.startswith(".")
            and (wanted is None or entry.suffix.lower() in wanted)
        )
        if not found:
            kinds = f" with a suffix in {sorted(wanted)}" if wanted else ""
            raise common.CommandFailed(
                common.EXIT_USAGE, f"--input {source}: the directory holds no file{kinds}")
        files.extend(found)
    return files


def _refuse(source: str, exc: BaseException) -> common.CommandFailed:
    return common.CommandFailed(
        common.EXIT_USAGE, f"input {source}: {type(exc).__name__}: {exc}",
        {"input": source})


class PreparedInputs:
    """Every input checked through ``prepare``; the first few kept for the run."""

    def __init__(self, prepare: Callable[[str], Any], files: Sequence[str],
                 keep: int = KEEP_PREPARED) -> None:
        """Run ``prepare`` on every file now.

        Raises:
            common.CommandFailed: (exit 2) ``prepare`` refused a file (``ValueError`` or
                ``OSError``); the message names the file and the reason.

        """
        self._prepare = prepare
        self.files = list(files)
        self._kept: dict[int, dict[str, Any]] = {}
        for index, source in enumerate(self.files):
            prepared = self._call(source)
            if index < keep:
                self._kept[index] = prepared

    def _call(self, source: str) -> dict[str, Any]:
        try:
            prepared: Mapping[str, Any] = self._prepare(source)
        except (ValueError, OSError) as exc:
            raise _refuse(source, exc) from exc
        return dict(prepared)

    def get(self, index: int) -> dict[str, Any]:
        """The prepared inputs of file ``index`` (kept, or prepared again)."""
        kept = self._kept.pop(index, None)
        return kept if kept is not None else self._call(self.files[index])


class BufferedInputs:
    """First-stage tensors copied into the pipeline's input buffers (see the module doc)."""

    def __init__(self, pipeline: Any) -> None:
        """Stage inputs for ``pipeline`` (open), through its ``input_buffer``."""
        self._pipeline = pipeline
        self._buffers: dict[tuple[str, tuple[int, ...], str], Any] = {}
        self.copied = 0
        """How many tensors were copied into a buffer (once per input and name)."""

    def stage(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """Return ``inputs`` with each large tensor replaced by a filled input buffer."""
        import numpy as np

        staged = dict(inputs)
        for name, value in inputs.items():
            if (name.startswith("carry:") or not isinstance(value, np.ndarray)
                    or value.dtype.hasobject):
                continue
            key = (name, value.shape, value.dtype.str)
            if key not in self._buffers:
                made = self._pipeline.input_buffer(name, value.shape, value.dtype)
                owned = self._pipeline.owns_input_buffer(made)
                self._buffers[key] = made if owned else None  # None: a private array
            buffer = self._buffers[key]
            if buffer is None:
                continue
            buffer[...] = value
            staged[name] = buffer
            self.copied += 1
        return staged

    def counts(self) -> dict[str, int]:
        """``buffers`` held, ``copied`` tensors and requests ``sent_by_reference``."""
        return {"buffers": sum(b is not None for b in self._buffers.values()),
                "copied": self.copied,
                "sent_by_reference": self._pipeline.input_buffer_counts()["sent"]}


class Progress:
    """A one-line progress bar on a terminal (nothing when the stream is not a terminal)."""

    WIDTH: Final = 30

    def __init__(self, total: int, stream: TextIO | None = None, enabled: bool = True) -> None:
        """Show progress over ``total`` items on ``stream`` (standard error by default)."""
        self.total = total
        self.stream = stream or sys.stderr
        self.enabled = enabled and total > 1 and self.stream.isatty()

    def update(self, done: int, label: str) -> None:
        """Redraw the bar: ``done`` of ``total`` finished, ``label`` being worked on."""
        if not self.enabled:
            return
        filled = round(self.WIDTH * done / self.total)
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        self.stream.write(f"\r[{bar}] {done}/{self.total} {os.path.basename(label)[:40]:40s}")
        self.stream.flush()

    def close(self) -> None:
        """End the bar's line."""
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()

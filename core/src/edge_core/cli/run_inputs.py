"""``edge run --input``: which files a run reads, checking them first, and a progress bar.

``--input`` may be given several times; each value is a file or a directory. A directory
contributes its non-hidden files, sorted by name, keeping only those whose suffix the
pipeline's ``prepare`` callable lists in its ``input_suffixes`` attribute when it has one
(the OCR example lists image suffixes), else all of them (a link whose target is missing
counts as a file, so that it is named, not passed over). Its other entries are listed as
skipped: files of another suffix, subdirectories (not descended into; listed with a
trailing ``/``) and special files. A directory with nothing to read is refused (exit 2),
naming it and what it holds.

Every input goes through ``prepare`` *before* the pipeline opens, so bad input is refused
with exit code 2 and one line naming every bad file with its reason (all of them, not
only the first), and no worker starts. A path that exists but is not a regular file (a
FIFO, a device) is refused without calling ``prepare`` (it could not be read twice).
``prepare`` signals bad input by raising ``ValueError`` (a typed subclass names the
reason) or ``OSError``; any other exception is a bug in ``prepare`` and propagates.
Prepared inputs are kept for the run, in order, while together they hold at most
:data:`KEEP_PREPARED_BYTES` of tensors; later ones are prepared again when their turn
comes (a batch of large pages does not hold them all in memory at once).

Once the pipeline is open, :class:`BufferedInputs` copies each large first-stage tensor
(``--input``, ``--inputs`` or the bundled example) into one of the pipeline's input
buffers, once per input: every ``--repeat`` request then sends it by reference, and a later
input of the same name, shape and dtype reuses the same buffer. One buffer is held per
input name: an input of another shape replaces it (the old one goes back to the
transport's pool), so inputs of varying size never pile up buffers. Tensors below the
shared-memory threshold, ``carry:*`` inputs and stages without shared memory are sent as
they are.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, NamedTuple, TextIO

from edge_contracts.error_copies import whole_reduction
from edge_core.cli import common

__all__ = [
    "KEEP_PREPARED_BYTES",
    "BufferedInputs",
    "ExpandedInputs",
    "PreparedInputs",
    "Progress",
    "RefusedInput",
    "bundled_example",
    "check_readable",
    "expand_inputs",
    "input_options",
    "no_inputs",
    "read_npz_inputs",
    "skipped_line",
    "unread_params",
]

KEEP_PREPARED_BYTES: Final = 32 * 1024 * 1024
"""How many bytes of prepared tensors a run keeps from the check before the pipeline opens."""


class ExpandedInputs(NamedTuple):
    """The files a run reads, and the files of its directories that it skips."""

    files: list[str]
    skipped: list[str]


def expand_inputs(sources: Sequence[str], suffixes: Sequence[str] | None) -> ExpandedInputs:
    """Files to read, in order: each ``--input`` value, directories expanded.

    A path that does not exist is kept as given (``prepare`` names what is wrong with it).
    A directory's entries that are not read are returned as ``skipped``: files whose
    suffix ``prepare`` does not list, subdirectories (with a trailing ``/``) and special
    files; a link whose target is missing is read when its suffix is (and so named as
    missing). Hidden entries are neither read nor listed.

    Raises:
        common.CommandFailed: (exit 2) a directory holds nothing to read: it is empty, or
            it holds only entries that are skipped (each named).

    """
    wanted = {s.lower() for s in suffixes} if suffixes else None
    files: list[str] = []
    skipped: list[str] = []
    for source in sources:
        if not os.path.isdir(source):
            files.append(source)
            continue
        entries = sorted(entry for entry in Path(source).iterdir()
                         if not entry.name.startswith("."))
        found: list[str] = []
        passed: list[str] = []
        for entry in entries:
            dangling = entry.is_symlink() and not entry.exists()
            if (entry.is_file() or dangling) and (wanted is None
                                                  or entry.suffix.lower() in wanted):
                found.append(str(entry))
            else:
                passed.append(str(entry) + ("/" if entry.is_dir() else ""))
        if not found:
            kinds = f" with a suffix in {sorted(wanted)}" if wanted else ""
            holds = (f"; what it holds is not read: {_names(passed)}" if passed
                     else "; it is empty")
            raise common.CommandFailed(
                common.EXIT_USAGE,
                f"--input {source}: the directory holds no file{kinds} to read{holds}",
                {"option": "--input", "input": source, "skipped": passed})
        files.extend(found)
        skipped.extend(passed)
    return ExpandedInputs(files, skipped)


def _names(paths: Sequence[str], shown: int = 10) -> str:
    """``paths`` joined by commas, the first ``shown`` of them and how many more."""
    return ", ".join(paths[:shown]) + (f" and {len(paths) - shown} more"
                                      if len(paths) > shown else "")


def check_readable(option: str, path: str) -> None:
    """Refuse ``path`` (exit 2) unless it is a regular file this process can open to read.

    The message names the option and the value (``--input page.png: No such file or
    directory``); nothing is opened besides the file itself, and nothing is read from it.

    Raises:
        common.CommandFailed: (exit 2) the file is missing, not a regular file (a
            directory, a FIFO, a device) or cannot be opened for reading.

    """
    import stat

    body = {"option": option, "input": path}
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise common.CommandFailed(common.EXIT_USAGE,
                                   f"{option} {path}: {exc.strerror or exc}", body) from exc
    if stat.S_ISDIR(mode):
        raise common.CommandFailed(common.EXIT_USAGE,
                                   f"{option} {path}: is a directory, not a file", body)
    if not stat.S_ISREG(mode):
        raise common.CommandFailed(common.EXIT_USAGE,
                                   f"{option} {path}: not a regular file", body)
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise common.CommandFailed(
            common.EXIT_USAGE, f"{option} {path}: cannot be read ({exc.strerror or exc})",
            body) from exc


def skipped_line(skipped: Sequence[str]) -> str:
    """The notice naming the entries of ``--input`` directories that are not read."""
    return (f"--input: skipped {len(skipped)} entr{'y' if len(skipped) == 1 else 'ies'} "
            f"not read (a suffix the pipeline's prepare does not read, a subdirectory/ or "
            f"a special file): {_names(skipped)}")


def bundled_example(config: Any) -> str | None:
    """The example inputs member a bundle of the first stage names, read from its manifest.

    Every candidate that may serve the first stage is looked at, in order, with its own
    manifest or else the stage's (:meth:`~edge_core.config.model.StageConfig.choices`):
    the first whose manifest names example inputs answers. ``None`` when none does (no
    manifest, one that cannot be read, or none naming example inputs): whichever
    candidate serves, ``edge run`` and ``edge profile`` without inputs would have nothing
    to read, so they refuse before anything starts. Nothing is verified here (opening
    verifies the bundle); where some candidates have example inputs and others not, only
    the open knows which serves.
    """
    for choice in config.stages[0].choices():
        member = _example_member(choice.manifest)
        if member is not None:
            return member
    return None


def no_inputs(config: Any, plugins: Any, params: bool) -> common.CommandFailed | None:
    """Exit 2 for a run without tensors or files that its first stage cannot take.

    Without ``--input`` or ``--inputs`` the first stage's bundled example inputs are read
    (:func:`bundled_example`); with ``--params`` only a stage that generates may run on
    no tensors at all (a prompt-only generate stage). ``None`` when the run may go on:
    some candidate's bundle names example inputs, or ``params`` is given and some
    candidate's backend generates. Read from the manifests and the plugins' declarations
    before anything starts (else the worker started and the request failed, exit 1).
    """
    from edge_core.backend import StageKind

    if bundled_example(config) is not None:
        return None
    stage = config.stages[0]
    if params:
        kinds = [plugins.backends.get(choice.backend.name) for choice in stage.choices()]
        if any(found is None or StageKind.GENERATE in found[0].kinds for found in kinds):
            return None
        backends = ", ".join(dict.fromkeys(c.backend.name for c in stage.choices()))
        return common.CommandFailed(
            common.EXIT_USAGE, f"inputs: give {input_options(config)} (the first "
            f"stage, {stage.id!r}, bundles no example inputs to read instead, and --params "
            f"alone gives no tensors: only a generate stage runs without them; its "
            f"backends: {backends}{_no_prepare(config)})")
    return common.CommandFailed(
        common.EXIT_USAGE, f"inputs: give {input_options(config)} (the first "
        f"stage, {stage.id!r}, bundles no example inputs to read instead"
        f"{_no_prepare(config)})")


def input_options(config: Any) -> str:
    """The input options ``config``'s pipeline takes, as a refusal offers them.

    ``--input FILE`` only where the pipeline names a ``prepare`` function (without one
    ``--input`` is refused); ``--inputs NPZ`` always.
    """
    return "--input FILE or --inputs NPZ" if config.prepare is not None else "--inputs NPZ"


def _no_prepare(config: Any) -> str:
    """Why ``--input`` is not offered: the clause a refusal adds, or ``""``."""
    if config.prepare is not None:
        return ""
    return "; --input FILE needs a 'prepare' function, and the pipeline names none"


def unread_params(config: Any, plugins: Any,
                  params: Mapping[str, Any] | None) -> common.CommandFailed | None:
    """Exit 2 for a ``--params`` name the pipeline's final stage does not read.

    A request's parameters reach the final stage only, whose backend declares the names
    it reads (``BackendInfo.params``; an ONNX graph's reads none): any other name is
    refused by name before anything starts, as ``edge serve`` refuses it (400), so that a
    misspelt parameter is not silently ignored. Where any of the stage's candidates is not
    installed or declares no list, every name is passed on. ``None`` when all are read.
    """
    if not params:
        return None
    stage = config.stages[-1]  # the chain's last: stage i reads stage i-1
    declared = [plugins.backends.get(choice.backend.name) for choice in stage.choices()]
    if any(found is None or found[0].params is None for found in declared):
        return None
    read = sorted({name for found in declared for name in found[0].params})
    unread = sorted((key for key in params if key not in read), key=str)
    if not unread:
        return None
    backends = ", ".join(dict.fromkeys(choice.backend.name for choice in stage.choices()))
    names = ", ".join(repr(key) for key in unread)
    return common.CommandFailed(
        common.EXIT_USAGE, f"--params: not a parameter of this pipeline: {names} (its final "
        f"stage {stage.id!r}, on {backends}, reads: {', '.join(read) or 'none'})",
        {"field": "params", "unread": unread})


def _example_member(manifest: Path | None) -> str | None:
    """The example inputs member the manifest at (or in) ``manifest`` names, if any."""
    import json

    if manifest is None:
        return None
    path = Path(manifest)
    if path.is_dir():
        path = path / "edge-manifest.json"
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        member = document["metadata"]["example_inputs"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return member if isinstance(member, str) else None


def read_npz_inputs(path: str, config: Any) -> dict[str, Any]:
    """The first-stage tensors of ``--inputs``, checked before anything opens.

    The archive is read with pickle disabled; when the first stage's bundle declares the
    shapes it serves (and the stage has no input transform), the tensors' names, dtypes and
    shapes must fit one of them.

    Raises:
        common.CommandFailed: (exit 2) naming the file and what is wrong with it.

    """
    import zipfile

    import numpy as np

    if not os.path.isfile(path):
        raise common.CommandFailed(common.EXIT_USAGE, f"--inputs {path}: no such file")
    if not zipfile.is_zipfile(path):
        raise common.CommandFailed(
            common.EXIT_USAGE, f"--inputs {path}: not an .npz archive (to read an image or "
            "another file through the pipeline's prepare function, use --input)")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: np.array(data[name]) for name in data.files}
    except (ValueError, OSError, zipfile.BadZipFile) as exc:
        raise common.CommandFailed(common.EXIT_USAGE, f"--inputs {path}: {exc}") from exc
    if not arrays:
        raise common.CommandFailed(common.EXIT_USAGE, f"--inputs {path}: the archive holds "
                                   "no array")
    shapes = _declared_shapes(config)
    if shapes is not None:
        from edge_contracts.errors import ContractError
        from edge_core.shapes import specs_of

        try:
            shapes.match(specs_of(arrays), where="inputs")
        except (ContractError, ValueError) as exc:
            raise common.CommandFailed(common.EXIT_USAGE, f"--inputs {path}: does not fit "
                                       f"stage {config.stages[0].id!r}: {exc}") from exc
    return arrays


def _declared_shapes(config: Any) -> Any:
    """The shapes the first stage's bundle serves, read from its manifest (no verification).

    The declared shape set, or for a bundle without one the single shape of its example
    inputs; ``None`` when the stage transforms its inputs or the manifest cannot be read
    (opening then decides).
    """
    import json

    import numpy as np

    from edge_contracts.shapesets import ShapeSet
    from edge_core.shapes import specs_of

    stage = config.stages[0]
    if stage.input_transform is not None or stage.manifest is None:
        return None
    path = Path(stage.manifest)
    if path.is_dir():
        path = path / "edge-manifest.json"
    try:
        metadata = json.loads(path.read_text(encoding="utf-8"))["metadata"]
        declared = (metadata.get("validation") or {}).get("shapes")
        if declared is not None:
            return ShapeSet.from_json([{"name": e.get("name"), "inputs": e.get("inputs")}
                                       for e in declared], "shapes")
        example = path.parent / metadata["example_inputs"]
        with np.load(example, allow_pickle=False) as data:
            return ShapeSet.single(specs_of({name: data[name] for name in data.files}))
    except Exception:  # an unreadable or undeclared shape set: opening decides
        return None


class RefusedInput(NamedTuple):
    """An input ``prepare`` refused (or that is not a regular file), and why."""

    file: str
    error: str
    """The reason, ``TYPE: message`` (``ValueError: ...``), or ``not a regular file``."""


class _Refused(Exception):
    """Raised by :meth:`PreparedInputs._prepared` for one refused input."""

    def __init__(self, refused: RefusedInput) -> None:
        super().__init__(refused.error)
        self.refused = refused

    def __reduce__(self) -> tuple[object, ...]:
        """Rebuild from ``args`` and the attributes: ``copy.copy`` keeps the error whole."""
        return whole_reduction(self)


def _refusal(refused: Sequence[RefusedInput], total: int) -> common.CommandFailed:
    """Exit 2 naming every refused input; ``input`` in the body is the first one.

    Without ``--json`` stderr has one line for the count, then one line per refused
    input; ``--json``'s ``error`` joins them in one line.
    """
    lines = [f"input {r.file}: {r.error}" for r in refused]
    head = f"{len(lines)} of {total} inputs refused"
    message = lines[0] if len(lines) == 1 else f"{head}: " + "; ".join(lines)
    return common.CommandFailed(
        common.EXIT_USAGE, message,
        {"input": refused[0].file, "problems": lines,
         "refused": [{"file": r.file, "error": r.error} for r in refused]},
        lines=[] if len(lines) == 1 else [f"{head}:", *lines])


class PreparedInputs:
    """Every input checked through ``prepare``; the first few kept for the run."""

    def __init__(self, prepare: Callable[[str], Any], files: Sequence[str],
                 keep_bytes: int = KEEP_PREPARED_BYTES, skipped: Sequence[str] = ()) -> None:
        """Run ``prepare`` on every file now; keep the first ones within ``keep_bytes``.

        ``skipped``: entries of directories not read.

        Raises:
            common.CommandFailed: (exit 2) ``prepare`` refused some file (``ValueError``
                or ``OSError``), or one is not a regular file: every such file is named
                with its reason (``refused`` in the body), after every file was tried.

        """
        self._prepare = prepare
        self.files = list(files)
        self.skipped = list(skipped)
        self._kept: dict[int, dict[str, Any]] = {}
        refused: list[RefusedInput] = []
        held = 0
        for index, source in enumerate(self.files):
            try:
                prepared = self._prepared(source)
            except _Refused as exc:
                refused.append(exc.refused)
                continue
            size = sum(int(getattr(value, "nbytes", 0) or 0) for value in prepared.values())
            if held + size <= keep_bytes and len(self._kept) == index:  # a prefix only
                self._kept[index] = prepared
                held += size
        if refused:
            raise _refusal(refused, len(self.files))

    def _prepared(self, source: str) -> dict[str, Any]:
        if os.path.exists(source) and not os.path.isfile(source):  # a FIFO, a device
            raise _Refused(RefusedInput(source, "not a regular file"))
        try:
            prepared: Mapping[str, Any] = self._prepare(source)
        except (ValueError, OSError) as exc:
            raise _Refused(RefusedInput(source, f"{type(exc).__name__}: {exc}")) from exc
        return dict(prepared)

    def _call(self, source: str) -> dict[str, Any]:
        try:
            return self._prepared(source)
        except _Refused as exc:
            raise _refusal([exc.refused], 1) from exc

    def peek(self, index: int) -> dict[str, Any]:
        """The prepared inputs of file ``index``, kept for :meth:`get` if they were."""
        kept = self._kept.get(index)
        return kept if kept is not None else self._call(self.files[index])

    def get(self, index: int) -> dict[str, Any]:
        """The prepared inputs of file ``index`` (kept, or prepared again)."""
        kept = self._kept.pop(index, None)
        return kept if kept is not None else self._call(self.files[index])


class BufferedInputs:
    """First-stage tensors copied into the pipeline's input buffers (see the module doc)."""

    def __init__(self, pipeline: Any) -> None:
        """Stage inputs for ``pipeline`` (open), through its ``input_buffer``."""
        self._pipeline = pipeline
        self._buffers: dict[str, tuple[tuple[tuple[int, ...], str], Any]] = {}
        """Input name -> ((shape, dtype), its buffer): one buffer per name."""
        self._private: set[tuple[str, tuple[int, ...], str]] = set()
        """(name, shape, dtype) the pipeline gives no buffer for: sent as they are."""
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
            key = (value.shape, value.dtype.str)
            held = self._buffers.get(name)
            if held is not None and held[0] == key:
                buffer = held[1]
            elif (name, *key) in self._private:
                continue
            else:
                buffer = self._pipeline.input_buffer(name, value.shape, value.dtype)
                if not self._pipeline.owns_input_buffer(buffer):  # small, or no shared memory
                    self._private.add((name, *key))
                    continue
                self._buffers[name] = (key, buffer)  # the one it replaces is given back
            buffer[...] = value
            staged[name] = buffer
            self.copied += 1
        return staged

    def counts(self) -> dict[str, int]:
        """``buffers`` held, ``copied`` tensors and requests ``sent_by_reference``."""
        return {"buffers": len(self._buffers),
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

"""The external-data references of an ONNX model, read from its protobuf bytes.

Neither ``onnx`` nor ``onnxruntime`` is imported: this is a reader of the protocol-buffer
wire format that walks only the messages that can hold a tensor, and skips every other
field by its length without reading it. The file is memory-mapped, so embedded weights
(``raw_data``) are never read either: only the pages holding message headers are.

Walked (field numbers from ``onnx.proto``):

- ``ModelProto``: graph (7), training_info (20), functions (25)
- ``TrainingInfoProto``: initialization (1), algorithm (2)
- ``FunctionProto``: node (7), attribute_proto (11)
- ``GraphProto``: node (1), initializer (5), sparse_initializer (15); of the model's own
  graph, input (11) and output (12) are also counted (:func:`graph_outline`)
- ``NodeProto``: attribute (5)
- ``AttributeProto``: t (5), g (6), tensors (10), graphs (11), sparse_tensor (22),
  sparse_tensors (23) — so initializers of subgraphs (``If``/``Loop``/``Scan`` bodies)
  are found too
- ``SparseTensorProto``: values (1), indices (2)
- ``TensorProto``: name (8), external_data (13: key 1, value 2), data_location (14)

Deprecated groups are skipped as protobuf parsers skip them, and strings are not
required to be UTF-8 (ONNX is proto2): a file a runtime would parse is parsed here too.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from pathlib import Path

import attrs

from edge_core.artifacts.errors import ReferenceRefused

__all__ = ["MAX_NESTING", "ExternalRef", "GraphOutline", "ModelScan", "external_refs",
           "graph_outline", "model_refs", "scan_model"]

MAX_NESTING = 64
"""Deepest nesting of messages followed (subgraph in subgraph ...) before refusing."""

_VARINT, _I64, _LEN, _SGROUP, _EGROUP, _I32 = 0, 1, 2, 3, 4, 5
_EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL

_Bytes = bytes | mmap.mmap


class _Malformed(Exception):
    """The protobuf bytes cannot be parsed (internal; turned into ReferenceRefused)."""


@attrs.frozen
class ExternalRef:
    """One tensor whose data lives in another file.

    Attributes:
        where: the tensor's position in the model, e.g. ``graph.initializer[2]``.
        tensor: the tensor's name.
        location: the ``location`` entry, relative to the model file's directory
            (``None`` when the tensor is marked external but names no location).
        offset: byte offset in that file (0 when absent).
        length: byte length (``None`` when absent: to the end of the file).

    """

    where: str
    tensor: str
    location: str | None
    offset: int
    length: int | None


def _varint(data: _Bytes, pos: int, end: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise _Malformed(f"truncated varint at byte {pos}")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise _Malformed(f"varint longer than 10 bytes at byte {pos}")


def _fields(data: _Bytes, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """Yield ``(field, wire type, a, b)`` for each field of a message.

    ``a`` holds a varint's value, or ``[a, b)`` a length-delimited field's byte range;
    fixed-width fields are skipped.
    """
    pos = start
    while pos < end:
        key, pos = _varint(data, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise _Malformed(f"field number 0 at byte {pos}")
        if wire == _VARINT:
            value, pos = _varint(data, pos, end)
            yield number, wire, value, 0
        elif wire == _LEN:
            length, pos = _varint(data, pos, end)
            if pos + length > end:
                raise _Malformed(f"field {number} runs past its message at byte {pos}")
            yield number, wire, pos, pos + length
            pos += length
        elif wire in (_I64, _I32):
            pos += 8 if wire == _I64 else 4
            if pos > end:
                raise _Malformed(f"fixed-width field {number} truncated")
        elif wire == _SGROUP:  # a deprecated group: protobuf parses it, so skip it
            pos = _skip_group(data, pos, end, number)
        else:
            raise _Malformed(f"unexpected wire type {wire} at byte {pos}")


def _skip_group(data: _Bytes, pos: int, end: int, number: int) -> int:
    """Return the position after the end-group tag matching ``number`` (nested groups too)."""
    open_groups = [number]
    while open_groups:
        key, pos = _varint(data, pos, end)
        field, wire = key >> 3, key & 7
        if field == 0:
            raise _Malformed(f"field number 0 at byte {pos}")
        if wire == _VARINT:
            _, pos = _varint(data, pos, end)
        elif wire == _LEN:
            length, pos = _varint(data, pos, end)
            pos += length
        elif wire in (_I64, _I32):
            pos += 8 if wire == _I64 else 4
        elif wire == _SGROUP:
            if len(open_groups) >= MAX_NESTING:
                raise _Malformed(f"groups nested deeper than {MAX_NESTING}")
            open_groups.append(field)
        elif wire == _EGROUP and field == open_groups[-1]:
            open_groups.pop()
        else:
            raise _Malformed(f"unexpected wire type {wire} at byte {pos}")
        if pos > end:
            raise _Malformed(f"group field {field} runs past its message")
    return pos


def _text(data: _Bytes, start: int, end: int) -> str:
    # ONNX is proto2: its parsers do not refuse strings that are not UTF-8, so neither
    # does this (a location that is not UTF-8 names no member and is refused as such).
    return bytes(data[start:end]).decode("utf-8", errors="surrogateescape")


@attrs.frozen
class GraphOutline:
    """How much a model file's own graph holds (not its subgraphs or functions).

    Attributes:
        size: the file's size in bytes.
        problem: why its bytes are not a readable protobuf message (``None`` when they are).
        graphs: how many times the model's ``graph`` field occurs (protobuf merges them).
        inputs: the graph's inputs, all occurrences together.
        outputs: the graph's outputs, all occurrences together.
        feeds: the names of the graph's inputs that no initializer of the graph gives a
            value (what a run must be fed), in the graph's order.
        output_names: the names of the graph's outputs, in the graph's order.

    """

    size: int
    problem: str | None
    graphs: int
    inputs: int
    outputs: int
    feeds: tuple[str, ...] = ()
    output_names: tuple[str, ...] = ()


class _Walker:
    def __init__(self, data: _Bytes) -> None:
        self.data = data
        self.refs: list[ExternalRef] = []
        self.graphs = 0
        self.counts = {11: 0, 12: 0}  # the model graph's input and output
        self.input_names: list[str] = []  # the model graph's, in order
        self.output_names: list[str] = []  # the model graph's, in order
        self.initialized: set[str] = set()  # names its initializers give a value

    def _children(self, start: int, end: int, wanted: dict[int, str]) -> Iterator[
        tuple[str, int, int, int]
    ]:
        counts: dict[int, int] = {}
        for number, wire, a, b in _fields(self.data, start, end):
            if number in wanted and wire == _LEN:
                index = counts.get(number, 0)
                counts[number] = index + 1
                yield wanted[number], index, a, b

    def model(self, start: int, end: int) -> None:
        wanted = {7: "graph", 20: "training_info", 25: "functions"}
        for name, index, a, b in self._children(start, end, wanted):
            if name == "graph":
                self.graphs += 1
                self._count(a, b)
                self.graph(a, b, "graph", 1)
            elif name == "training_info":
                for sub, _, c, d in self._children(a, b, {1: "initialization", 2: "algorithm"}):
                    self.graph(c, d, f"training_info[{index}].{sub}", 1)
            else:
                self.function(a, b, f"functions[{index}]")

    def _count(self, start: int, end: int) -> None:
        for number, wire, a, b in _fields(self.data, start, end):
            if wire != _LEN:
                continue
            if number in self.counts:
                self.counts[number] += 1
            if number == 11:  # ValueInfoProto: name is field 1
                self.input_names.extend(self._name(a, b, 1))
            elif number == 12:
                self.output_names.extend(self._name(a, b, 1))
            elif number == 5:  # TensorProto: name is field 8
                self.initialized.update(self._name(a, b, 8))
            elif number == 15:  # SparseTensorProto: its values tensor's name
                for sub, sub_wire, c, d in _fields(self.data, a, b):
                    if sub == 1 and sub_wire == _LEN:
                        self.initialized.update(self._name(c, d, 8))

    def _name(self, start: int, end: int, field: int) -> list[str]:
        """The last ``field`` string of a message (protobuf keeps the last), or none."""
        names = [_text(self.data, a, b) for number, wire, a, b in _fields(self.data, start, end)
                 if number == field and wire == _LEN]
        return names[-1:]

    @property
    def feeds(self) -> tuple[str, ...]:
        """The graph's inputs without an initializer, each once, in order."""
        return tuple(dict.fromkeys(n for n in self.input_names if n not in self.initialized))

    def function(self, start: int, end: int, where: str) -> None:
        for name, index, a, b in self._children(start, end, {7: "node", 11: "attribute_proto"}):
            if name == "node":
                self.node(a, b, f"{where}.node[{index}]", 1)
            else:
                self.attribute(a, b, f"{where}.attribute_proto[{index}]", 1)

    def graph(self, start: int, end: int, where: str, depth: int) -> None:
        if depth > MAX_NESTING:
            raise _Malformed(f"{where}: graphs nested deeper than {MAX_NESTING}")
        wanted = {1: "node", 5: "initializer", 15: "sparse_initializer"}
        for name, index, a, b in self._children(start, end, wanted):
            here = f"{where}.{name}[{index}]"
            if name == "node":
                self.node(a, b, here, depth)
            elif name == "initializer":
                self.tensor(a, b, here)
            else:
                self.sparse(a, b, here)

    def node(self, start: int, end: int, where: str, depth: int) -> None:
        for _, index, a, b in self._children(start, end, {5: "attribute"}):
            self.attribute(a, b, f"{where}.attribute[{index}]", depth)

    def attribute(self, start: int, end: int, where: str, depth: int) -> None:
        wanted = {5: "t", 6: "g", 10: "tensors", 11: "graphs", 22: "sparse_tensor",
                  23: "sparse_tensors"}
        for name, index, a, b in self._children(start, end, wanted):
            here = f"{where}.{name}" if name in ("t", "g", "sparse_tensor") else (
                f"{where}.{name}[{index}]"
            )
            if name in ("t", "tensors"):
                self.tensor(a, b, here)
            elif name in ("g", "graphs"):
                self.graph(a, b, here, depth + 1)
            else:
                self.sparse(a, b, here)

    def sparse(self, start: int, end: int, where: str) -> None:
        for name, _, a, b in self._children(start, end, {1: "values", 2: "indices"}):
            self.tensor(a, b, f"{where}.{name}")

    def tensor(self, start: int, end: int, where: str) -> None:
        name = ""
        entries: dict[str, str] = {}
        external = False
        for number, wire, a, b in _fields(self.data, start, end):
            if number == 8 and wire == _LEN:
                name = _text(self.data, a, b)
            elif number == 13 and wire == _LEN:
                key = value = ""
                for sub, sub_wire, c, d in _fields(self.data, a, b):
                    if sub == 1 and sub_wire == _LEN:
                        key = _text(self.data, c, d)
                    elif sub == 2 and sub_wire == _LEN:
                        value = _text(self.data, c, d)
                entries[key] = value
            elif number == 14 and wire == _VARINT:
                external = a == _EXTERNAL
        if not external and "location" not in entries:
            return
        self.refs.append(ExternalRef(
            where=where,
            tensor=name,
            location=entries.get("location"),
            offset=_decimal(entries.get("offset"), f"{where}.external_data.offset", 0) or 0,
            length=_decimal(entries.get("length"), f"{where}.external_data.length", None),
        ))


def _decimal(text: str | None, where: str, default: int | None) -> int | None:
    if text is None:
        return default
    if not text.isascii() or not text.isdigit():
        raise _Malformed(f"{where} is not a non-negative decimal integer: {text!r}")
    return int(text)


@attrs.frozen
class ModelScan:
    """One read of a model file: what its own graph holds, and its external-data tensors.

    Attributes:
        outline: what the file's own graph holds (:func:`graph_outline`'s answer).
        refs: every tensor read before the walk ended (all of them when
            ``outline.problem`` is ``None``) that keeps its data in another file.

    """

    outline: GraphOutline
    refs: tuple[ExternalRef, ...]


def scan_model(path: Path) -> ModelScan:
    """Read and walk the model at ``path`` once: its outline and its external-data tensors.

    Its ``outline`` is :func:`graph_outline`'s answer, and :func:`model_refs` gives
    :func:`external_refs`'s from it: a caller that needs both reads the file once. Never
    raises for bad bytes (an empty file is walked as nothing; a file that is not a
    readable protobuf message has ``outline.problem`` set); only for a file that cannot
    be opened or mapped.
    """
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size == 0:
            return ModelScan(GraphOutline(0, None, 0, 0, 0), ())
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            walker = _Walker(data)
            problem: str | None = None
            try:
                walker.model(0, size)
            except _Malformed as exc:
                problem = str(exc)
            except RecursionError:
                problem = "messages nested too deeply"
    outline = GraphOutline(size, problem, walker.graphs, walker.counts[11], walker.counts[12],
                           walker.feeds, tuple(dict.fromkeys(walker.output_names)))
    return ModelScan(outline, tuple(walker.refs))


def model_refs(
    scan: ModelScan, name: str, field: str, *, any_file: bool = False
) -> tuple[ExternalRef, ...]:
    """The external-data tensors of a scanned model, as :func:`external_refs` answers.

    ``name`` is the value a refusal names (the file's name); ``field`` and ``any_file``
    are :func:`external_refs`'s.
    """
    outline = scan.outline
    if outline.size == 0:
        return ()
    if any_file and (outline.problem is not None or not outline.graphs):
        return ()
    if outline.problem is not None:
        raise ReferenceRefused(field, f"not a readable ONNX model ({outline.problem})", name)
    return scan.refs


def external_refs(path: Path, field: str, *, any_file: bool = False) -> tuple[ExternalRef, ...]:
    """Every tensor of the ONNX model at ``path`` that keeps its data in another file.

    Raises :class:`ReferenceRefused` (naming ``field``) when the bytes are not a
    well-formed protobuf message of the expected shape. With ``any_file`` (a member
    that is not named as a model), bytes that do not parse as a model with a graph are
    simply not a model: the answer is ``()``. Whatever its name, a file that parses as
    one is checked like a model: a runtime would load it as one. An empty file holds no
    reference (whether it may be a bundle's graph is :func:`graph_outline`'s question).
    """
    return model_refs(scan_model(path), path.name, field, any_file=any_file)


def graph_outline(path: Path) -> GraphOutline:
    """What the model at ``path`` holds in its own graph, read as :func:`external_refs` reads it.

    Never raises for bad bytes: a file that is not a readable protobuf message has its
    ``problem`` set (the counts are then those read before it), an empty file counts
    nothing. Protobuf parses 0 bytes as an empty model, so an empty file *is* a model
    without a graph to a runtime's parser; the caller decides what a graph needs.
    """
    return scan_model(path).outline

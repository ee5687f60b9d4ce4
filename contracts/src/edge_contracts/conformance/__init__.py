"""The conformance fixtures of edge-contracts and the runner that asserts them.

``v1.json`` (beside this module, shipped in the wheel and the sdist) holds
language-independent cases: valid objects of every type, overrides that must be
rejected with a given error class and field, stale state handles that must not be
accepted, feature negotiations, and frames as hex -- valid ones that must decode to a
given header and tensor bytes, malformed ones that must be refused with a given error
class while allocating at most ``max_alloc_bytes``. docs/fixtures.md describes
the format for implementations in other languages.

Run ``python -m edge_contracts.conformance [--json] [--fixtures PATH]``; the exit
status is 0 only when every case passes. Standard library only.
"""

from __future__ import annotations

import argparse
import copy
import json
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

from edge_contracts import errors
from edge_contracts.buffers import BufferDescriptor
from edge_contracts.devices import DeviceDescriptor
from edge_contracts.dtypes import DType
from edge_contracts.manifest import ArtifactManifest, ArtifactMetadata
from edge_contracts.protocol import negotiate
from edge_contracts.requests import ErrorInfo, StageEvent, StageRequest
from edge_contracts.state import StateHandle
from edge_contracts.wire import (
    FrameHeader,
    Limits,
    ShmRef,
    TensorSpec,
    decode_frame,
    encode_frame,
)

__all__ = ["FIXTURE_NAME", "CaseResult", "apply_overrides", "load_fixtures", "main", "run"]

FIXTURE_NAME = "v1.json"
"""The file name of the fixtures of protocol version 1."""


class _ValueType(Protocol):
    def to_dict(self) -> dict[str, Any]: ...


TYPES: dict[str, Callable[[Any], _ValueType]] = {
    "BufferDescriptor": BufferDescriptor.from_dict,
    "StageRequest": StageRequest.from_dict,
    "StageEvent": StageEvent.from_dict,
    "ErrorInfo": ErrorInfo.from_dict,
    "StateHandle": StateHandle.from_dict,
    "DeviceDescriptor": DeviceDescriptor.from_dict,
    "ArtifactMetadata": ArtifactMetadata.from_dict,
    "ArtifactManifest": ArtifactManifest.from_dict,
    "ShmRef": ShmRef.from_dict,
    "TensorSpec": TensorSpec.from_dict,
    "FrameHeader": FrameHeader.from_dict,
    "Limits": Limits.from_dict,
}
"""Fixture type name -> the parser (``from_dict``) of that value type."""


@dataclass(frozen=True, slots=True)
class CaseResult:
    """The outcome of one fixture case.

    Attributes:
        group: the fixture section, e.g. ``types.BufferDescriptor.invalid``.
        name: the case's name.
        passed: whether the implementation behaved as the case demands.
        detail: what happened (the error raised, or why the case failed).

    """

    group: str
    name: str
    passed: bool
    detail: str


class _CaseFailed(Exception):
    """A case's expectation was not met."""


def load_fixtures(path: Path | None = None) -> dict[str, Any]:
    """Return the parsed fixture document (the packaged ``v1.json`` by default)."""
    if path is None:
        text = resources.files(__name__).joinpath(FIXTURE_NAME).read_text(encoding="utf-8")
    else:
        text = path.read_text(encoding="utf-8")
    document: dict[str, Any] = json.loads(text)
    if document.get("format") != "edge-contracts-conformance":
        raise errors.InvalidValue("fixtures.format", document.get("format"), "unknown format")
    return document


def apply_overrides(base: Any, set_: dict[str, Any], delete: Sequence[str] = ()) -> Any:
    """Return a deep copy of ``base`` with RFC 6901 pointers set and deleted."""
    result = copy.deepcopy(base)
    for pointer, value in set_.items():
        parent, key = _locate(result, pointer)
        if isinstance(parent, list):
            parent[int(key)] = copy.deepcopy(value)
        else:
            parent[key] = copy.deepcopy(value)
    for pointer in delete:
        parent, key = _locate(result, pointer)
        del parent[int(key) if isinstance(parent, list) else key]
    return result


def _locate(document: Any, pointer: str) -> tuple[Any, str]:
    if not pointer.startswith("/"):
        raise ValueError(f"not a JSON pointer: {pointer!r}")
    tokens = [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]
    node = document
    for token in tokens[:-1]:
        node = node[int(token)] if isinstance(node, list) else node[token]
    return node, tokens[-1]


def _expect_error(call: Callable[[], object], case: dict[str, Any]) -> str:
    expected = getattr(errors, case["error"], None)
    if not (isinstance(expected, type) and issubclass(expected, errors.ContractError)):
        raise _CaseFailed(f"fixture names unknown error class {case['error']!r}")
    try:
        call()
    except errors.ContractError as exc:
        if not isinstance(exc, expected):
            raise _CaseFailed(
                f"raised {type(exc).__name__} ({exc}), want {case['error']}"
            ) from None
        if "field" in case and exc.field != case["field"]:
            raise _CaseFailed(f"error names field {exc.field!r}, want {case['field']!r}") from None
        return f"{type(exc).__name__}: {exc}"
    raise _CaseFailed(f"accepted, want {case['error']}")


def _types(document: dict[str, Any]) -> Iterator[tuple[str, str, Callable[[], str]]]:
    for type_name, cases in document["types"].items():
        parse = TYPES.get(type_name)
        for index, value in enumerate(cases["valid"]):

            def valid(value: Any = value, parse: Any = parse) -> str:
                if parse is None:
                    raise _CaseFailed("unknown type")
                obj = parse(value)
                if obj.to_dict() != value:
                    raise _CaseFailed(f"round trip changed the value: {obj.to_dict()!r}")
                return "accepted"

            yield f"types.{type_name}.valid", f"#{index}", valid
        for case in cases["invalid"]:

            def invalid(case: Any = case, parse: Any = parse, valid: Any = cases["valid"]) -> str:
                data = apply_overrides(valid[case["base"]], case["set"], case["delete"])
                return _expect_error(lambda: parse(data), case)

            yield f"types.{type_name}.invalid", case["name"], invalid


def _dtypes(document: dict[str, Any]) -> Iterator[tuple[str, str, Callable[[], str]]]:
    for entry in document["dtypes"]["valid"]:

        def valid(entry: Any = entry) -> str:
            size = DType.parse(entry["name"]).itemsize
            if size != entry["itemsize"]:
                raise _CaseFailed(f"itemsize {size}, want {entry['itemsize']}")
            return "accepted"

        yield "dtypes.valid", entry["name"], valid
    for spelling in document["dtypes"]["invalid"]:

        def invalid(spelling: Any = spelling) -> str:
            case = {"error": "InvalidValue", "field": "dtype"}
            return _expect_error(lambda: DType.parse(spelling), case)

        yield "dtypes.invalid", repr(spelling), invalid


def _state(document: dict[str, Any]) -> Iterator[tuple[str, str, Callable[[], str]]]:
    section = document["state"]
    for group, want in (("stale", False), ("accepted", True)):
        for case in section[group]:

            def check(case: Any = case, want: bool = want) -> str:
                current = StateHandle.from_dict(section["current"])
                held = StateHandle.from_dict(apply_overrides(section["current"], case["set"]))
                if held.accepts(current) is not want:
                    raise _CaseFailed(f"accepts() returned {not want}, want {want}")
                return f"accepts() -> {want}"

            yield f"state.{group}", case["name"], check


def _negotiation(document: dict[str, Any]) -> Iterator[tuple[str, str, Callable[[], str]]]:
    for case in document["negotiation"]:

        def check(case: Any = case) -> str:
            def call() -> frozenset[str]:
                return negotiate(case["required"], case["offered"], frozenset(case["supported"]))

            if "error" in case:
                return _expect_error(call, case)
            agreed = sorted(call())
            if agreed != case["agreed"]:
                raise _CaseFailed(f"agreed {agreed}, want {case['agreed']}")
            return f"agreed {agreed}"

        yield "negotiation", case["name"], check


def _frames(document: dict[str, Any]) -> Iterator[tuple[str, str, Callable[[], str]]]:
    for case in document["frames"]["valid"]:

        def valid(case: Any = case) -> str:
            data = bytes.fromhex(case["hex"])
            frame = decode_frame(data, Limits.from_dict(case["limits"]))
            if frame.header.to_dict() != case["header"]:
                raise _CaseFailed(f"header decoded as {frame.header.to_dict()!r}")
            views = {name: bytes(view).hex() for name, view in frame.tensor_views().items()}
            if views != case["tensors"]:
                raise _CaseFailed(f"tensor bytes decoded as {views!r}")
            inline = [
                bytes.fromhex(case["tensors"][spec.name])
                for spec in frame.header.tensors
                if spec.ref is None
            ]
            binary = data[:4] == b"EDGB"
            parts = encode_frame(frame.header, inline, binary=binary)
            if b"".join(bytes(part) for part in parts) != data:
                raise _CaseFailed("re-encoding does not reproduce the frame's bytes")
            return f"decoded {len(data)} bytes"

        yield "frames.valid", case["name"], valid
    for case in document["frames"]["invalid"]:

        def invalid(case: Any = case) -> str:
            data = bytes.fromhex(case["hex"])
            limits = Limits.from_dict(case["limits"])
            detail, peak = _traced(lambda: _expect_error(lambda: decode_frame(data, limits), case))
            if peak > case["max_alloc_bytes"]:
                raise _CaseFailed(f"allocated {peak} bytes, limit {case['max_alloc_bytes']}")
            return f"{detail} (peak {peak} bytes)"

        yield "frames.invalid", case["name"], invalid


def _traced(call: Callable[[], str]) -> tuple[str, int]:
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        detail = call()
        return detail, tracemalloc.get_traced_memory()[1] - base
    finally:
        if started:
            tracemalloc.stop()


def run(path: Path | None = None) -> list[CaseResult]:
    """Run every case of the fixture file; return one result per case."""
    document = load_fixtures(path)
    results: list[CaseResult] = []
    sections = (_dtypes, _types, _state, _negotiation, _frames)
    for section in sections:
        for group, name, check in section(document):
            try:
                results.append(CaseResult(group, name, True, check()))
            except _CaseFailed as failure:
                results.append(CaseResult(group, name, False, str(failure)))
            except Exception as exc:
                results.append(CaseResult(group, name, False, f"{type(exc).__name__}: {exc}"))
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry: print the results; return 0 only if every case passed."""
    parser = argparse.ArgumentParser(
        prog="python -m edge_contracts.conformance",
        description="Assert the edge-contracts conformance fixtures.",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON report")
    parser.add_argument("--fixtures", type=Path, help="fixture file (default: packaged v1.json)")
    args = parser.parse_args(argv)
    results = run(args.fixtures)
    failed = [result for result in results if not result.passed]
    if args.json:
        report = {
            "passed": len(results) - len(failed),
            "failed": len(failed),
            "cases": [asdict(result) for result in results],
        }
        print(json.dumps(report, indent=1))
    else:
        for result in failed:
            print(f"FAIL {result.group} :: {result.name}: {result.detail}")
        print(f"conformance: {len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0

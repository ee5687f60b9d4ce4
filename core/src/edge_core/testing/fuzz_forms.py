"""What the fuzzer feeds edge-core: valid inputs of each form, and how to check one.

A :class:`FrameForm` makes a *valid* encoded frame of one kind from a seeded
``random.Random`` and, optionally, checks an accepted frame above the wire layer (a
control frame's ``meta`` through the parser the worker or controller applies to it). The
fuzzer (:mod:`edge_core.testing.fuzzing`) mutates those bytes and runs them through the
decoder and the stream reader. Adding a frame form (a binary per-request frame, say) is
one more entry in :data:`FRAME_FORMS` — its maker, the decoder of that form when it is
not the JSON-header frame, and the errors its checker may raise.

:class:`ManifestForm` does the same for ``edge-manifest.json`` documents.
"""

from __future__ import annotations

import json
import os
import random
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from edge_contracts.dtypes import DType
from edge_contracts.errors import ContractError
from edge_contracts.headers import FrameHeader, ShmRef, TensorSpec, tensor_features
from edge_contracts.protocol import FEATURE_EVENT_FIELDS, FEATURE_SHM_TENSORS
from edge_contracts.wire import Frame, Limits, decode_frame, encode_frame
from edge_contracts.worker_protocol import BootConfig, parse_ack
from edge_core.errors import EdgeError

__all__ = [
    "FRAME_FORMS",
    "MANIFEST_FORM",
    "FrameForm",
    "ManifestForm",
    "json_value",
]

_ID = string.ascii_letters + string.digits + "_.-"


def _ident(rng: random.Random) -> str:
    return "".join(rng.choice(_ID) for _ in range(rng.randint(1, 12)))


def json_value(rng: random.Random, depth: int = 0) -> Any:
    """A random JSON value (sometimes of a surprising type or size)."""
    pick = rng.randrange(10 if depth < 3 else 7)
    if pick == 0:
        return None
    if pick == 1:
        return rng.random() < 0.5
    if pick == 2:
        return rng.choice([0, 1, -1, 5, 2**31, 2**62, 2**63 - 1, -(2**63), rng.randint(-9, 9)])
    if pick == 3:
        return rng.choice([0.5, -1.25, 1e300, 3.0])
    if pick in (4, 5, 6):
        return rng.choice(["", "x", "edge_seg", "\u00e9\u4e2d", _ident(rng)])
    if pick in (7, 8):
        return [json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {_ident(rng): json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def _tensors(rng: random.Random, max_tensors: int) -> tuple[tuple[TensorSpec, ...], list[bytes]]:
    specs: list[TensorSpec] = []
    payloads: list[bytes] = []
    for index in range(rng.randint(0, max_tensors)):
        dtype = rng.choice(list(DType))
        shape = tuple(rng.randint(0, 5) for _ in range(rng.randint(0, 3)))
        nbytes = dtype.itemsize
        for dim in shape:
            nbytes *= dim
        if rng.random() < 0.25:
            ref = ShmRef(f"edge_{_ident(rng)}", rng.randint(0, 1 << 20), rng.randint(0, 9))
            specs.append(TensorSpec(f"t{index}", dtype, shape, nbytes, ref))
        else:
            specs.append(TensorSpec(f"t{index}", dtype, shape, nbytes))
            payloads.append(rng.randbytes(nbytes))
    return tuple(specs), payloads


def _frame(
    rng: random.Random, op: str, meta: Mapping[str, Any], *, tensors: int = 0,
    binary: bool = False, features: frozenset[str] = frozenset(),
) -> bytes:
    specs, payloads = _tensors(rng, tensors) if tensors else ((), [])
    header = FrameHeader(
        op, _ident(rng) if rng.random() < 0.8 else "", _ident(rng), rng.randint(0, 2**40),
        rng.randint(0, 2**20), specs, meta, tensor_features(specs) | features,
    )
    return b"".join(bytes(part) for part in encode_frame(header, payloads, binary=binary))



@dataclass(frozen=True)
class FrameForm:
    """One kind of frame the fuzzer makes valid instances of.

    Attributes:
        name: a label for reports.
        make: a valid encoded frame from a seeded generator.
        check: applied to an accepted frame: the parsing the receiver does above the
            wire layer (``None``: nothing more).
        check_errors: the typed errors ``check`` may raise; anything else is untyped.
        decode: the in-memory decoder of this form (default: the JSON-header frame's).
        stream: whether the stream reader (``FrameReader``) reads this form too.

    """

    name: str
    make: Callable[[random.Random], bytes]
    check: Callable[[Frame], object] | None = None
    check_errors: tuple[type[BaseException], ...] = (ContractError,)
    decode: Callable[[bytes, Limits], Frame] = field(default=decode_frame)
    stream: bool = True


def _data(rng: random.Random, binary: bool = False) -> bytes:
    params = {_ident(rng): json_value(rng) for _ in range(rng.randint(0, 3))}
    return _frame(rng, rng.choice(["run", "generate"]), params, tensors=4, binary=binary)


def _event(rng: random.Random, binary: bool = False) -> bytes:
    meta = {"seq": rng.randint(0, 99), "kind": rng.choice(["token", "output", "done", "error"]),
            "data": {}, "error": None, "created_ns": rng.randint(0, 2**62)}
    if rng.random() < 0.5:
        meta["acks"] = [[f"edge_{_ident(rng)}", rng.randint(0, 9)]]
    return _frame(rng, "event", meta, tensors=3, binary=binary)


def _event_fields(rng: random.Random) -> bytes:
    """A binary event with the ``event-fields`` block (meta: only what is set)."""
    meta: dict[str, Any] = {"seq": rng.randint(0, 2**63 - 1),
                            "kind": rng.choice(["output", "token", "progress", "done",
                                                "error", "cancelled"]),
                            "created_ns": rng.randint(0, 2**63 - 1)}
    if rng.random() < 0.3:
        meta["data"] = {_ident(rng): json_value(rng) for _ in range(rng.randint(1, 3))}
    if rng.random() < 0.2:
        meta["error"] = {"type": "RuntimeError", "message": "m", "traceback": None}
    if rng.random() < 0.5:
        meta["acks"] = _pairs(rng)
    return _frame(rng, "event", meta, tensors=3, binary=True,
                  features=frozenset({FEATURE_EVENT_FIELDS}))


def _pairs(rng: random.Random) -> list[list[Any]]:
    return [[f"edge_{_ident(rng)}", rng.randint(0, 2**31)] for _ in range(rng.randint(0, 3))]


def _ack(rng: random.Random, binary: bool = False) -> bytes:
    meta: dict[str, Any] = {"segments": _pairs(rng)}
    if rng.random() < 0.5:
        meta["unlink"] = _pairs(rng)
    if rng.random() < 0.5:
        meta["gone"] = [f"edge_{_ident(rng)}" for _ in range(rng.randint(0, 2))]
    return _frame(rng, "ack", meta, binary=binary)


def _cancel(rng: random.Random) -> bytes:
    meta = {"target": rng.choice([None, _ident(rng)]),
            "fence_epoch": rng.choice([None, rng.randint(0, 2**40)])}
    return _frame(rng, "cancel", meta)


def _check_cancel(frame: Frame) -> None:
    """The worker's reading of a cancel: a target id or null, a fence epoch or null."""
    meta = frame.header.meta
    target, fence = meta.get("target"), meta.get("fence_epoch")
    if target is not None and not isinstance(target, str):
        raise ContractError("cancel.target", target, "must be a request id or null")
    if fence is not None and type(fence) is not int:
        raise ContractError("cancel.fence_epoch", fence, "must be an integer or null")


def _boot(rng: random.Random) -> bytes:
    boot = BootConfig(
        token=rng.randbytes(32).hex(), entry="pkg.mod:factory", generation=rng.randint(0, 9),
        shm_prefix=_ident(rng), peer_prefix=_ident(rng), shm_threshold=rng.randint(0, 1 << 20),
        shm_max_bytes=rng.randint(0, 1 << 30), shm_max_buffers=rng.randint(0, 256),
        max_io_bytes=rng.randint(0, 1 << 30), features=(FEATURE_SHM_TENSORS,),
        spin_us=rng.randint(0, 500),
    )
    return _frame(rng, "boot", boot.to_dict())


def _check_boot(frame: Frame) -> BootConfig:
    from edge_contracts.jsonvalues import thaw_json

    return BootConfig.from_dict(thaw_json(frame.header.meta))  # type: ignore[arg-type]


_HELLO_TOKEN = "5" * 64


def _hello(rng: random.Random) -> bytes:
    from edge_contracts.worker_protocol import hello_meta

    meta = hello_meta(_HELLO_TOKEN if rng.random() < 0.8 else "0" * 64,
                      required=frozenset(), offered=frozenset({FEATURE_SHM_TENSORS}),
                      versions={"x": "1"}, shm_prefix=_ident(rng))
    if rng.random() < 0.2:
        meta["error"] = {"type": "RuntimeError", "message": "m"}
    return _frame(rng, "hello", meta)


def _check_hello(frame: Frame) -> object:
    """The controller's verification of a hello (token, error, pid, features)."""
    from edge_contracts.protocol import KNOWN_FEATURES
    from edge_core.host.hello import verify_hello
    from edge_core.host.identity import ProcessIdentity

    global _ROOT
    if _ROOT is None:
        _ROOT = ProcessIdentity.of(os.getpid())
    return verify_hello(frame, _HELLO_TOKEN, _ROOT, frozenset(), KNOWN_FEATURES)


_ROOT: Any = None


def _reply(rng: random.Random) -> bytes:
    ok = rng.random() < 0.5
    meta: dict[str, Any] = {"ok": ok}
    meta["result" if ok else "error"] = (
        {"a": json_value(rng)} if ok else {"type": "ValueError", "message": "m"}
    )
    return _frame(rng, "reply", meta)


def _control(rng: random.Random) -> bytes:
    op = rng.choice(["load", "warmup", "ping", "shutdown"])
    return _frame(rng, op, {_ident(rng): json_value(rng) for _ in range(rng.randint(0, 3))})


def _bootstrap_refused() -> tuple[type[BaseException], ...]:
    from edge_core.host.errors import BootstrapRefused

    return (BootstrapRefused,)


FRAME_FORMS: list[FrameForm] = [
    FrameForm("data", _data),
    FrameForm("event", _event),
    FrameForm("reply", _reply),
    FrameForm("control", _control),
    FrameForm("ack", _ack, check=lambda frame: parse_ack(frame.header.meta)),
    FrameForm("cancel", _cancel, check=_check_cancel),
    FrameForm("boot", _boot, check=_check_boot),
    FrameForm("hello", _hello, check=_check_hello, check_errors=_bootstrap_refused()),
    # the per-request frames again with the binary header (edge_contracts.binary_header)
    FrameForm("data-binary", partial(_data, binary=True)),
    FrameForm("event-binary", partial(_event, binary=True)),
    FrameForm("event-fields-binary", _event_fields),
    FrameForm("ack-binary", partial(_ack, binary=True),
              check=lambda frame: parse_ack(frame.header.meta)),
]
"""Every frame form fuzzed; a new wire form is registered here."""


@dataclass(frozen=True)
class ManifestForm:
    """Valid ``edge-manifest.json`` documents, and the verifier's parser of them."""

    name: str = "manifest"
    errors: tuple[type[BaseException], ...] = (EdgeError,)

    def make(self, rng: random.Random) -> bytes:
        """A valid manifest document, as bytes."""
        files = {f"{_ident(rng)}/{_ident(rng)}.bin": rng.randbytes(32).hex()
                 for _ in range(rng.randint(0, 3))}
        graph = rng.choice(["model.onnx", "g/m.ONNX", "model.onnx.bin"])
        files[graph] = rng.randbytes(32).hex()
        metadata: dict[str, Any] = {"graph": graph}
        if rng.random() < 0.5:
            files["inputs.npz"] = rng.randbytes(32).hex()
            metadata["example_inputs"] = "inputs.npz"
        document = {"schema_version": 1, "component": _ident(rng), "files": files,
                    "metadata": metadata}
        return json.dumps(document, indent=rng.choice([None, 2])).encode()

    def parse(self, raw: bytes) -> object:
        """The verifier's parse of manifest bytes (``ManifestInvalid`` when refused)."""
        from edge_core.artifacts.verify import parse_manifest

        return parse_manifest(raw)

    def roundtrip(self, parsed: object) -> bool:
        """Whether an accepted manifest survives ``to_json`` then parsing unchanged."""
        to_json = getattr(parsed, "to_json")  # noqa: B009 - an ArtifactManifest
        return bool(self.parse(to_json().encode()) == parsed)


MANIFEST_FORM = ManifestForm()
"""The manifest form fuzzed."""

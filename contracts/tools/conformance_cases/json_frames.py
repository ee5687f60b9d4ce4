"""Frames with a JSON header, assembled by hand with ``struct``: valid ones and refused ones."""

from __future__ import annotations

import json
import struct
from typing import Any

from .common import ALL_FEATURES, GiB, KiB, MiB
from .wire_cases import REF

LIMITS = {"max_header_bytes": 65536, "max_io_bytes": MiB, "max_tensors": 1024,
          "supported_features": ALL_FEATURES}


def frame(header: Any, payload: bytes = b"", *, header_len: int | None = None,
          payload_len: int | None = None, magic: bytes = b"EDGW") -> bytes:
    """Assemble a frame by hand: prefix, header (dict -> compact JSON, or raw bytes), payload."""
    if isinstance(header, bytes):
        raw = header
    else:
        raw = json.dumps(header, separators=(",", ":")).encode()
    head_len = len(raw) if header_len is None else header_len
    body_len = len(payload) if payload_len is None else payload_len
    return struct.pack("<4sIQ", magic, head_len, body_len) + raw + payload


def header(tensors: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    """A call header with the given tensors; keyword arguments override fields."""
    out = {"version": 1, "required_features": [], "op": "call", "request_id": "req-0001",
           "stage_id": "ocr.det", "epoch": 4, "generation": 3, "meta": {}, "tensors": tensors}
    out.update(fields)
    return out


def tensor(name: str, dtype: str, shape: list[int], nbytes: int, ref: Any = None) -> dict[str, Any]:
    """One tensor entry."""
    return {"name": name, "dtype": dtype, "shape": shape, "nbytes": nbytes, "ref": ref}


X_BYTES = struct.pack("<4f", 1.0, 2.0, 3.0, 4.0)
X = tensor("x", "float32", [2, 2], 16)
CALL = header([X, tensor("mask", "bool", [3], 3)], meta={"bucket": "b1"})
SCALARS = header([tensor("step", "int64", [], 8), tensor("none", "float16", [0, 3], 0),
                  tensor("bf", "bfloat16", [2], 4)], required_features=["bfloat16"])
SHM = header([tensor("kv", "float16", [2, 1024], 4096, REF), tensor("ids", "uint8", [4], 4)],
             required_features=["shm-tensors"], op="event")
HELLO = header([], op="hello", request_id="", stage_id="", epoch=0, generation=1,
               meta={"offered_features": ALL_FEATURES, "note": "héllo"})

VALID_FRAMES = [
    {"name": "call with two inline tensors", "limits": LIMITS,
     "hex": frame(CALL, X_BYTES + bytes([1, 0, 1])).hex(), "header": CALL,
     "tensors": {"x": X_BYTES.hex(), "mask": "010001"}},
    {"name": "zero-d, empty and bfloat16 tensors", "limits": LIMITS,
     "hex": frame(SCALARS, struct.pack("<q", -1) + struct.pack("<2H", 0x3FC0, 0xC000)).hex(),
     "header": SCALARS,
     "tensors": {"step": "ffffffffffffffff", "none": "", "bf": "c03f00c0"}},
    {"name": "shared-memory tensor beside an inline one", "limits": LIMITS,
     "hex": frame(SHM, b"\x01\x02\x03\x04").hex(), "header": SHM, "tensors": {"ids": "01020304"}},
    {"name": "control frame without tensors", "limits": LIMITS, "hex": frame(HELLO).hex(),
     "header": HELLO, "tensors": {}},
]


def bad(name: str, data: bytes, error: str, field: str | None, *, limits: dict[str, Any] = LIMITS,
        max_alloc: int = 64 * KiB) -> dict[str, Any]:
    """A frame that must be refused with ``error`` while allocating <= ``max_alloc`` bytes."""
    out: dict[str, Any] = {"name": name, "limits": limits, "hex": data.hex(), "error": error}
    if field is not None:
        out["field"] = field
    out["max_alloc_bytes"] = max_alloc
    return out


GOOD = frame(CALL, X_BYTES + bytes([1, 0, 1]))
ONLY_X = header([X])
NESTED = json.dumps(header([], meta="@")).replace('"@"', '{"deep":' + "[" * 40 + "]" * 40 + "}")
BOTTOMLESS = json.dumps(header([], meta="@")).replace('"@"', "[" * 5000 + "]" * 5000)
INVALID_FRAMES = [
    bad("empty input", b"", "StreamClosed", "prefix"),
    bad("truncated prefix", GOOD[:10], "FrameTruncated", "prefix"),
    bad("bad magic", frame(ONLY_X, X_BYTES, magic=b"EDGX"), "HeaderMalformed", "prefix.magic"),
    bad("zero header length", frame(b"", b""), "HeaderMalformed", "prefix.header_len"),
    bad("header length over cap", frame(ONLY_X, X_BYTES, header_len=70000)[:64],
        "HeaderTooLarge", "prefix.header_len", max_alloc=16 * KiB),
    bad("header length at u32 max", frame(b"{}", header_len=2**32 - 1), "HeaderTooLarge",
        "prefix.header_len", max_alloc=16 * KiB),
    bad("header cap lowered by the reader", frame(ONLY_X, X_BYTES), "HeaderTooLarge",
        "prefix.header_len", limits={**LIMITS, "max_header_bytes": 64}),
    bad("truncated header", GOOD[:60], "FrameTruncated", "header"),
    bad("header is not JSON", frame(b"not json{", b""), "HeaderMalformed", "header"),
    bad("header is not UTF-8", frame(b'{"op":"\xff"}'), "HeaderMalformed", "header"),
    bad("header is a JSON array", frame(b"[1,2]"), "HeaderMalformed", "header"),
    bad("header with a repeated key", frame(b'{"version":1,"version":1}'), "HeaderMalformed",
        "header"),
    bad("header with NaN", frame(json.dumps(header([], meta={"x": float("nan")})).encode()),
        "HeaderMalformed", "header"),
    bad("meta nested deeper than 32 levels", frame(NESTED.encode()), "HeaderMalformed", None),
    bad("header nested beyond the JSON parser", frame(BOTTOMLESS.encode()), "HeaderMalformed",
        "header", max_alloc=128 * KiB),
    bad("header without version", frame({k: v for k, v in ONLY_X.items() if k != "version"},
                                        X_BYTES), "HeaderMalformed", "header.version"),
    bad("missing epoch", frame({k: v for k, v in ONLY_X.items() if k != "epoch"}, X_BYTES),
        "HeaderMalformed", "header.epoch"),
    bad("unknown header key", frame({**ONLY_X, "priority": 1}, X_BYTES), "HeaderMalformed",
        "header.priority"),
    bad("epoch beyond int64", frame(header([X], epoch=10**30), X_BYTES), "HeaderMalformed",
        "header.epoch"),
    bad("version 2", frame(header([X], version=2), X_BYTES), "VersionMismatch", "header.version"),
    bad("version as a string", frame(header([X], version="1"), X_BYTES), "VersionMismatch",
        "header.version"),
    bad("unknown required feature", frame(header([X], required_features=["fp8-tensors"]),
                                          X_BYTES), "UnknownRequiredFeature",
        "header.required_features"),
    bad("feature this reader does not support", frame(SHM, b"\x01\x02\x03\x04"),
        "UnknownRequiredFeature", "header.required_features",
        limits={**LIMITS, "supported_features": ["cancel"]}),
    bad("nbytes mismatch", frame(header([tensor("x", "float32", [2, 2], 15)]), X_BYTES[:15]),
        "DescriptorInvalid", "header.tensors[0].nbytes"),
    bad("33 dimensions", frame(header([tensor("x", "uint8", [1] * 33, 1)]), b"\x00"),
        "DescriptorInvalid", "header.tensors[0].shape"),
    bad("negative dimension", frame(header([tensor("x", "uint8", [2, -1], 0)])),
        "DescriptorInvalid", "header.tensors[0].shape[1]"),
    bad("unknown dtype", frame(header([tensor("x", "complex64", [2], 16)]), X_BYTES),
        "DescriptorInvalid", "header.tensors[0].dtype"),
    bad("repeated tensor name", frame(header([X, X]), X_BYTES + X_BYTES), "DescriptorInvalid",
        "header.tensors[1].name"),
    bad("bfloat16 tensor without its feature",
        frame(header([tensor("bf", "bfloat16", [2], 4)]), b"\x00" * 4), "DescriptorInvalid",
        "header.tensors[0].dtype"),
    bad("empty tensor whose other dimension cannot exist",
        frame(header([tensor("x", "float32", [0, 2**62], 0)])), "DescriptorInvalid",
        "header.tensors[0].shape"),
    bad("consistent length lie: prefix and header agree, no payload sent",
        frame(header([tensor("x", "uint8", [MiB], MiB)]), payload_len=MiB), "FrameTruncated",
        "payload", max_alloc=320 * KiB),
    bad("shared-memory tensor without its feature",
        frame(header([tensor("kv", "float16", [2, 1024], 4096, REF)])), "DescriptorInvalid",
        "header.tensors[0].ref"),
    bad("more tensors than max_tensors", GOOD, "HeaderMalformed", "header.tensors",
        limits={**LIMITS, "max_tensors": 1}),
    bad("payload over limit in the prefix", frame(ONLY_X, X_BYTES, payload_len=2**40)[:200],
        "PayloadTooLarge", "prefix.payload_len", max_alloc=16 * KiB),
    bad("inline tensors over limit", frame(header([tensor("x", "uint8", [2, MiB], 2 * MiB)]),
                                           payload_len=0),
        "PayloadTooLarge", "header.tensors", max_alloc=16 * KiB),
    bad("shared-memory bytes over limit",
        frame(header([tensor("kv", "uint8", [GiB], GiB, REF)], required_features=["shm-tensors"])),
        "PayloadTooLarge", "header.tensors", max_alloc=16 * KiB),
    bad("payload length differs from the tensors", frame(ONLY_X, X_BYTES[:8]),
        "PayloadMismatch", "prefix.payload_len"),
    bad("large payload length refused before allocation",
        frame(ONLY_X, payload_len=1000000) + X_BYTES, "PayloadMismatch", "prefix.payload_len",
        max_alloc=16 * KiB),
    bad("truncated payload", GOOD[:-2], "FrameTruncated", "payload"),
    bad("trailing bytes", GOOD + b"\x00", "PayloadMismatch", "frame"),
]

"""Write edge_contracts/conformance/v1.json from the hand-written cases below.

Every case is spelled out literally here -- valid objects as plain JSON data, invalid
ones as named overrides (RFC 6901 JSON pointers) with the error class and field they
must produce, frames as bytes assembled with ``struct`` -- so the fixtures do not
depend on the implementation they test. The script only checks that the valid
objects are accepted before it writes anything.

Usage::

    python contracts/tools/make_fixtures.py           # rewrite the fixture file
    python contracts/tools/make_fixtures.py --check   # exit 1 if the file is stale
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "src/edge_contracts/conformance/v1.json"
KiB, MiB, GiB = 1024, 1024 * 1024, 1024 * 1024 * 1024
SHA_A = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
SHA_B = "60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752"
ALL_FEATURES = ["bfloat16", "cancel", "shm-tensors", "stream-events"]


def case(name: str, error: str, field: str | None, set_: dict[str, Any] | None = None,
         delete: list[str] | None = None, base: int = 0) -> dict[str, Any]:
    """An override of valid object number ``base`` that must raise ``error`` at ``field``."""
    out: dict[str, Any] = {"name": name, "base": base, "set": set_ or {}, "delete": delete or []}
    out["error"] = error
    if field is not None:
        out["field"] = field
    return out


# ---------------------------------------------------------------- value types

BUFFER = {"owner": "ort-cpu.w1", "generation": 3, "dtype": "float32", "shape": [2, 3, 4],
          "nbytes": 96, "domain": "host", "layout": "C", "ready": True}
BUFFERS = {
    "valid": [BUFFER,
              {**BUFFER, "dtype": "bfloat16", "shape": [], "nbytes": 2, "ready": False},
              {**BUFFER, "dtype": "bool", "shape": [0, 5], "nbytes": 0}],
    "invalid": [
        case("nbytes off by one", "InvalidValue", "buffer.nbytes", {"/nbytes": 97}),
        case("nbytes off by one below", "InvalidValue", "buffer.nbytes", {"/nbytes": 95}),
        case("negative dimension", "InvalidValue", "buffer.shape[1]", {"/shape": [2, -3, 4]}),
        case("33 dimensions", "InvalidValue", "buffer.shape", {"/shape": [1] * 33, "/nbytes": 4}),
        case("boolean dimension", "InvalidValue", "buffer.shape[0]",
             {"/shape": [True, 3, 4], "/nbytes": 48}),
        case("fractional dimension", "InvalidValue", "buffer.shape[0]", {"/shape": [2.5, 3, 4]}),
        case("shape is not an array", "InvalidValue", "buffer.shape", {"/shape": "2x3x4"}),
        case("unknown dtype", "InvalidValue", "buffer.dtype", {"/dtype": "float"}),
        case("dtype alias", "InvalidValue", "buffer.dtype", {"/dtype": "bf16"}),
        case("dtype wrong case", "InvalidValue", "buffer.dtype", {"/dtype": "Float32"}),
        case("unknown memory domain", "InvalidValue", "buffer.domain", {"/domain": "cuda"}),
        case("unknown layout", "InvalidValue", "buffer.layout", {"/layout": "F"}),
        case("negative generation", "InvalidValue", "buffer.generation", {"/generation": -1}),
        case("boolean generation", "InvalidValue", "buffer.generation", {"/generation": True}),
        case("generation beyond int64", "InvalidValue", "buffer.generation",
             {"/generation": 2**63}),
        case("empty owner", "InvalidValue", "buffer.owner", {"/owner": ""}),
        case("owner of 129 characters", "InvalidValue", "buffer.owner", {"/owner": "o" * 129}),
        case("nbytes as a string", "InvalidValue", "buffer.nbytes", {"/nbytes": "96"}),
        case("ready as a string", "InvalidValue", "buffer.ready", {"/ready": "yes"}),
        case("missing nbytes", "InvalidValue", "buffer.nbytes", delete=["/nbytes"]),
        case("unknown key", "InvalidValue", "buffer.device", {"/device": "gpu0"}),
    ],
}

REQUEST = {"request_id": "req-0001", "stage_id": "ocr.det", "epoch": 4, "generation": 3,
           "operation": "run", "inputs": [BUFFER],
           "params": {"threshold": 0.25, "labels": ["a", "b"], "nested": {"k": None}},
           "deadline_ns": 123456789}
REQUESTS = {
    "valid": [REQUEST,
              {**REQUEST, "request_id": "chat 7/turn 2", "operation": "generate", "inputs": [],
               "params": {}, "deadline_ns": None}],
    "invalid": [
        case("empty request id", "InvalidValue", "request.request_id", {"/request_id": ""}),
        case("request id of 129 characters", "InvalidValue", "request.request_id",
             {"/request_id": "r" * 129}),
        case("request id with a newline", "InvalidValue", "request.request_id",
             {"/request_id": "a\nb"}),
        case("empty stage id", "InvalidValue", "request.stage_id", {"/stage_id": ""}),
        case("negative epoch", "InvalidValue", "request.epoch", {"/epoch": -1}),
        case("boolean epoch", "InvalidValue", "request.epoch", {"/epoch": False}),
        case("epoch beyond int64", "InvalidValue", "request.epoch", {"/epoch": 2**63}),
        case("negative generation", "InvalidValue", "request.generation", {"/generation": -2}),
        case("unknown operation", "InvalidValue", "request.operation", {"/operation": "train"}),
        case("input nbytes off by one", "InvalidValue", "request.inputs[0].nbytes",
             {"/inputs/0/nbytes": 95}),
        case("input of unknown domain", "InvalidValue", "request.inputs[0].domain",
             {"/inputs/0/domain": "vram"}),
        case("input that is not ready", "InvalidValue", "request.inputs[0].ready",
             {"/inputs/0/ready": False}),
        case("params not an object", "InvalidValue", "request.params", {"/params": [1, 2]}),
        case("negative deadline", "InvalidValue", "request.deadline_ns", {"/deadline_ns": -1}),
        case("missing operation", "InvalidValue", "request.operation", delete=["/operation"]),
        case("unknown key", "InvalidValue", "request.priority", {"/priority": 1}),
    ],
}

ERROR = {"type": "RuntimeError", "message": "kernel failed"}
EVENT = {"request_id": "req-0001", "stage_id": "ocr.det", "epoch": 4, "generation": 3,
         "seq": 0, "kind": "output", "terminal": False, "error": None, "outputs": [BUFFER],
         "data": {"boxes": 3}, "created_ns": 1000}
EVENTS = {
    "valid": [EVENT,
              {**EVENT, "seq": 1, "kind": "token", "outputs": [], "data": {"text": "hé"}},
              {**EVENT, "seq": 2, "kind": "progress", "outputs": [], "data": {}},
              {**EVENT, "seq": 3, "kind": "done", "terminal": True},
              {**EVENT, "seq": 4, "kind": "error", "terminal": True, "error": ERROR,
               "outputs": [], "data": {}},
              {**EVENT, "seq": 5, "kind": "cancelled", "terminal": True, "outputs": [],
               "data": {}}],
    "invalid": [
        case("done that is not terminal", "InvalidValue", "event.terminal",
             {"/kind": "done"}),
        case("token that is terminal", "InvalidValue", "event.terminal",
             {"/kind": "token", "/terminal": True}),
        case("error without error info", "InvalidValue", "event.error",
             {"/outputs": [], "/error": None}, base=4),
        case("error info on a done event", "InvalidValue", "event.error", {"/error": ERROR},
             base=3),
        case("outputs on a cancelled event", "InvalidValue", "event.outputs",
             {"/outputs": [BUFFER]}, base=5),
        case("outputs on an error event", "InvalidValue", "event.outputs",
             {"/outputs": [BUFFER]}, base=4),
        case("unknown kind", "InvalidValue", "event.kind", {"/kind": "finished"}),
        case("negative seq", "InvalidValue", "event.seq", {"/seq": -1}),
        case("empty error type", "InvalidValue", "event.error.type", {"/error/type": ""},
             base=4),
        case("error message over 8192 characters", "InvalidValue", "event.error.message",
             {"/error/message": "m" * 8193}, base=4),
        case("output nbytes off by one", "InvalidValue", "event.outputs[0].nbytes",
             {"/outputs/0/nbytes": 97}),
        case("data not an object", "InvalidValue", "event.data", {"/data": "text"}),
        case("negative created_ns", "InvalidValue", "event.created_ns", {"/created_ns": -5}),
        case("missing terminal", "InvalidValue", "event.terminal", delete=["/terminal"]),
    ],
}
ERRORS = {
    "valid": [ERROR, {"type": "edge.Cancelled", "message": ""}],
    "invalid": [
        case("empty type", "InvalidValue", "error.type", {"/type": ""}),
        case("message not a string", "InvalidValue", "error.message", {"/message": 7}),
        case("missing message", "InvalidValue", "error.message", delete=["/message"]),
    ],
}

STATE = {"session": "chat-7", "backend": "vllm-cuda", "artifact": "tinyllama@3f2a9c",
         "layout": "kv-v1", "epoch": 2, "instance": "w-9", "generation": 5,
         "replayable": False, "migratable": False}
STATES = {
    "valid": [STATE, {**STATE, "replayable": True, "migratable": True}],
    "invalid": [
        case("negative epoch", "InvalidValue", "state.epoch", {"/epoch": -1}),
        case("replayable as a string", "InvalidValue", "state.replayable",
             {"/replayable": "no"}),
        case("empty session", "InvalidValue", "state.session", {"/session": ""}),
        case("missing instance", "InvalidValue", "state.instance", delete=["/instance"]),
    ],
}

CPU = {"physical_id": "cpu0", "kind": "cpu", "name": "x86_64 host CPU",
       "execution_domain": "posix", "integration": "integrated", "pools": ["machine:ram"],
       "package": "socket0", "bandwidth_group": "dram0", "power_domain": None}
DEVICES = {
    "valid": [CPU,
              {"physical_id": "pci-0000:01:00.0", "kind": "gpu", "name": "discrete GPU",
               "execution_domain": "windows", "integration": "discrete",
               "pools": ["machine:vram:pci-0000:01:00.0", "machine:ram"], "package": None,
               "bandwidth_group": None, "power_domain": None},
              {"physical_id": "npu0", "kind": "npu", "name": "NPU", "execution_domain": "wsl",
               "integration": "unknown", "pools": ["wsl:quota", "machine:ram"],
               "package": None, "bandwidth_group": None, "power_domain": None}],
    "invalid": [
        case("unknown kind", "InvalidValue", "device.kind", {"/kind": "tpu"}),
        case("no pools", "InvalidValue", "device.pools", {"/pools": []}),
        case("repeated pool", "InvalidValue", "device.pools",
             {"/pools": ["machine:ram", "machine:ram"]}),
        case("pool without namespace", "InvalidValue", "device.pools[0]", {"/pools": ["ram"]}),
        case("pool with empty segment", "InvalidValue", "device.pools[0]",
             {"/pools": ["machine:vram:"]}),
        case("pool with a space", "InvalidValue", "device.pools[0]",
             {"/pools": ["machine:my ram"]}),
        case("unknown execution domain", "InvalidValue", "device.execution_domain",
             {"/execution_domain": "macos"}),
        case("unknown integration", "InvalidValue", "device.integration",
             {"/integration": "shared"}),
        case("empty physical id", "InvalidValue", "device.physical_id", {"/physical_id": ""}),
        case("physical id with a space", "InvalidValue", "device.physical_id",
             {"/physical_id": "gpu 0"}),
        case("missing pools", "InvalidValue", "device.pools", delete=["/pools"]),
    ],
}

METADATA = {"graph": "model.onnx", "example_inputs": "inputs/example.npz",
            "checkpoint_revision": "v1.2.0", "precision": "float32", "layout": "NCHW",
            "exporter": "torch.onnx 2.13", "calibration": None,
            "validation": {"max_abs_error": 0.001, "samples": 16}}
METADATAS = {
    "valid": [METADATA,
              {"graph": "g.onnx", "example_inputs": None, "checkpoint_revision": None,
               "precision": None, "layout": None, "exporter": None,
               "calibration": {"method": "minmax"}, "validation": None}],
    "invalid": [
        case("absolute graph path", "InvalidValue", "metadata.graph", {"/graph": "/model.onnx"}),
        case("calibration not an object", "InvalidValue", "metadata.calibration",
             {"/calibration": [1]}),
        case("missing graph", "InvalidValue", "metadata.graph", delete=["/graph"]),
    ],
}

MANIFEST = {"schema_version": 1, "component": "ocr-det",
            "files": {"inputs/example.npz": SHA_B, "model.onnx": SHA_A}, "metadata": METADATA}


def files_case(name: str, path: str, digest: str = SHA_A) -> dict[str, Any]:
    """A manifest whose files map holds one bad entry."""
    return case(name, "InvalidValue", f"manifest.files[{json.dumps(path)}]",
                {f"/files/{path.replace('~', '~0').replace('/', '~1')}": digest})


MANIFESTS = {
    "valid": [MANIFEST],
    "invalid": [
        files_case("parent segment", "../evil.onnx"),
        files_case("inner parent segment", "a/../b.onnx"),
        files_case("absolute path", "/etc/passwd"),
        files_case("backslash", "models\\m.onnx"),
        files_case("drive colon", "C:model.onnx"),
        files_case("empty segment", "a//b.onnx"),
        files_case("dot segment", "./m.onnx"),
        files_case("uppercase digest", "w.bin", SHA_A.upper()),
        files_case("short digest", "w.bin", SHA_A[:63]),
        case("graph not among the files", "InvalidValue", "manifest.metadata.graph",
             {"/metadata/graph": "other.onnx"}),
        case("example inputs not among the files", "InvalidValue",
             "manifest.metadata.example_inputs", {"/metadata/example_inputs": "x.npz"}),
        case("unknown schema version", "InvalidValue", "manifest.schema_version",
             {"/schema_version": 2}),
        case("no files", "InvalidValue", "manifest.files", {"/files": {}}),
        case("empty component", "InvalidValue", "manifest.component", {"/component": ""}),
        case("unknown metadata key", "InvalidValue", "manifest.metadata.license",
             {"/metadata/license": "MIT"}),
    ],
}

REF = {"segment": "edge_0badcafe_k3v9", "offset": 4096, "generation": 7}
SPEC = {"name": "image", "dtype": "uint8", "shape": [1, 3, 4, 4], "nbytes": 48, "ref": None}
SHM_SPEC = {"name": "kv", "dtype": "float16", "shape": [2, 1024], "nbytes": 4096, "ref": REF}
HEADER = {"version": 1, "required_features": ["shm-tensors"], "op": "call",
          "request_id": "req-0001", "stage_id": "ocr.det", "epoch": 4, "generation": 3,
          "meta": {"bucket": "640x640"}, "tensors": [SPEC, SHM_SPEC]}
WIRE_TYPES = {
    "ShmRef": {
        "valid": [REF],
        "invalid": [
            case("segment with a slash", "DescriptorInvalid", "ref.segment",
                 {"/segment": "/psm_1"}),
            case("negative offset", "DescriptorInvalid", "ref.offset", {"/offset": -1}),
            case("boolean generation", "DescriptorInvalid", "ref.generation",
                 {"/generation": True}),
        ],
    },
    "TensorSpec": {
        "valid": [SPEC, SHM_SPEC],
        "invalid": [
            case("nbytes off by one", "DescriptorInvalid", "tensor.nbytes", {"/nbytes": 49}),
            case("33 dimensions", "DescriptorInvalid", "tensor.shape",
                 {"/shape": [1] * 33, "/nbytes": 1}),
            case("negative dimension", "DescriptorInvalid", "tensor.shape[0]",
                 {"/shape": [-1, 3, 4, 4]}),
            case("unknown dtype", "DescriptorInvalid", "tensor.dtype", {"/dtype": "complex64"}),
            case("empty name", "DescriptorInvalid", "tensor.name", {"/name": ""}),
            case("missing ref", "DescriptorInvalid", "tensor.ref", delete=["/ref"]),
            case("bad ref offset", "DescriptorInvalid", "tensor.ref.offset",
                 {"/ref/offset": -4}, base=1),
        ],
    },
    "FrameHeader": {
        "valid": [HEADER,
                  {**HEADER, "required_features": [], "op": "hello", "request_id": "",
                   "stage_id": "", "tensors": [], "meta": {"offered_features": ["cancel"]}}],
        "invalid": [
            case("op in capitals", "HeaderMalformed", "header.op", {"/op": "Call"}),
            case("request id with a control character", "HeaderMalformed", "header.request_id",
                 {"/request_id": "a\u0007"}),
            case("negative epoch", "HeaderMalformed", "header.epoch", {"/epoch": -1}),
            case("meta not an object", "HeaderMalformed", "header.meta", {"/meta": [1]}),
            case("malformed feature name", "HeaderMalformed", "header.required_features",
                 {"/required_features": ["Shm Tensors"]}),
            case("repeated tensor name", "DescriptorInvalid", "header.tensors[1].name",
                 {"/tensors/1/name": "image"}),
            case("shared-memory tensor without its feature", "DescriptorInvalid",
                 "header.tensors[1].ref", {"/required_features": []}),
            case("tensor nbytes off by one", "DescriptorInvalid", "header.tensors[0].nbytes",
                 {"/tensors/0/nbytes": 47}),
            case("version 0", "HeaderMalformed", "header.version", {"/version": 0}),
            case("missing meta", "HeaderMalformed", "header.meta", delete=["/meta"]),
        ],
    },
    "Limits": {
        "valid": [{"max_header_bytes": 65536, "max_io_bytes": MiB, "max_tensors": 1024,
                   "supported_features": ALL_FEATURES},
                  {"max_header_bytes": 64, "max_io_bytes": 0, "max_tensors": 0,
                   "supported_features": []}],
        "invalid": [
            case("negative max_io_bytes", "InvalidValue", "limits.max_io_bytes",
                 {"/max_io_bytes": -1}),
            case("zero max_header_bytes", "InvalidValue", "limits.max_header_bytes",
                 {"/max_header_bytes": 0}),
            case("max_header_bytes beyond u32", "InvalidValue", "limits.max_header_bytes",
                 {"/max_header_bytes": 2**32}),
            case("malformed feature", "InvalidValue", "limits.supported_features",
                 {"/supported_features": ["Bad Name"]}),
        ],
    },
}

STALE = [
    {"name": f"other {key}", "set": {f"/{key}": value}}
    for key, value in [("session", "chat-8"), ("backend", "ort-cpu"),
                       ("artifact", "tinyllama@000000"), ("layout", "kv-v2"), ("epoch", 3),
                       ("instance", "w-10"), ("generation", 6)]
] + [{"name": "older epoch", "set": {"/epoch": 1}},
     {"name": "older generation", "set": {"/generation": 4}}]
ACCEPTED = [{"name": "identical", "set": {}},
            {"name": "replayable flag differs", "set": {"/replayable": True}},
            {"name": "migratable flag differs", "set": {"/migratable": True}}]

NEGOTIATION = [
    {"name": "nothing required", "required": [], "offered": [], "supported": ALL_FEATURES,
     "agreed": []},
    {"name": "offered features are used when supported", "required": ["shm-tensors"],
     "offered": ["cancel", "future-x"], "supported": ALL_FEATURES,
     "agreed": ["cancel", "shm-tensors"]},
    {"name": "unknown required feature", "required": ["shm-tensors", "future-x"],
     "offered": [], "supported": ALL_FEATURES, "error": "UnknownRequiredFeature",
     "field": "features.required"},
    {"name": "known feature this side does not support", "required": ["bfloat16"],
     "offered": [], "supported": ["cancel"], "error": "UnknownRequiredFeature",
     "field": "features.required"},
    {"name": "malformed feature name", "required": ["Shm Tensors"], "offered": [],
     "supported": ALL_FEATURES, "error": "InvalidValue", "field": "features.required"},
]

DTYPES = {
    "valid": [{"name": n, "itemsize": s} for n, s in [
        ("bool", 1), ("int8", 1), ("int16", 2), ("int32", 4), ("int64", 8), ("uint8", 1),
        ("uint16", 2), ("uint32", 4), ("uint64", 8), ("float16", 2), ("float32", 4),
        ("float64", 8), ("bfloat16", 2)]],
    "invalid": ["float", "f4", "FLOAT32", "bf16", "complex64", "int", "float8", ""],
}

# ---------------------------------------------------------------- frames

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


# ---------------------------------------------------------------- binary headers
# Per-request frames (run, generate, event, ack) with the fixed binary header of
# edge_contracts.binary_header, prefix magic b"EDGB", assembled field by field here.

BINARY_LIMITS = {**LIMITS, "supported_features": sorted([*ALL_FEATURES, "binary-header"])}
OP_CODES = {"run": 1, "generate": 2, "event": 3, "ack": 4}
DTYPE_CODES = {name: code for code, name in enumerate(
    ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
     "float16", "float32", "float64", "bfloat16"])}
FEATURE_BITS = {"shm-tensors": 1, "stream-events": 2, "bfloat16": 4, "cancel": 8}


def bin_tensor(name: str, dtype: str, shape: list[int], nbytes: int, ref: Any = None, *,
               dtype_code: int | None = None, ref_flag: int | None = None,
               name_bytes: bytes | None = None) -> bytes:
    """One binary tensor entry: "<HBBBQ", the dimensions as u64, the name, the ref."""
    raw_name = name.encode() if name_bytes is None else name_bytes
    code = DTYPE_CODES[dtype] if dtype_code is None else dtype_code
    flag = (ref is not None) if ref_flag is None else ref_flag
    out = struct.pack("<HBBBQ", len(raw_name), code, len(shape), flag, nbytes)
    out += struct.pack(f"<{len(shape)}Q", *shape) + raw_name
    if ref is not None:
        segment = ref["segment"].encode()
        out += struct.pack("<HQQ", len(segment), ref["offset"], ref["generation"]) + segment
    return out


def bin_header(op: str, tensors: list[bytes], meta: Any = None, *, request_id: str = "req-0001",
               stage_id: str = "ocr.det", epoch: int = 4, generation: int = 3,
               features: int = 0, version: int = 1, op_code: int | None = None,
               count: int | None = None, meta_len: int | None = None,
               request_bytes: bytes | None = None, request_len: int | None = None,
               tensors_len: int | None = None) -> bytes:
    """A binary header: "<HBBHHHIIQQ" fixed part, ids, tensor entries, meta JSON."""
    request = request_id.encode() if request_bytes is None else request_bytes
    stage = stage_id.encode()
    raw_meta = b"" if meta is None else (
        meta if isinstance(meta, bytes) else json.dumps(meta, separators=(",", ":")).encode())
    entries = b"".join(tensors)
    fixed = struct.pack(
        "<HBBHHHIIQQ", version, OP_CODES[op] if op_code is None else op_code, features,
        len(request) if request_len is None else request_len, len(stage),
        len(tensors) if count is None else count,
        len(entries) if tensors_len is None else tensors_len,
        len(raw_meta) if meta_len is None else meta_len, epoch, generation)
    return fixed + request + stage + entries + raw_meta


def bin_frame(raw: bytes, payload: bytes = b"", *, payload_len: int | None = None) -> bytes:
    """Prefix with the binary magic, the header, the payload."""
    body_len = len(payload) if payload_len is None else payload_len
    return struct.pack("<4sIQ", b"EDGB", len(raw), body_len) + raw + payload


BIN_X = bin_tensor("x", "float32", [2, 2], 16)
BIN_RUN = bin_header("run", [BIN_X], {"bucket": "b1"})
BIN_EVENT = bin_header("event", [bin_tensor("kv", "float16", [2, 1024], 4096, REF),
                                 bin_tensor("ids", "uint8", [4], 4)],
                       {"seq": 0, "kind": "done", "data": {}, "error": None,
                        "created_ns": 7, "acks": [["edge_0badcafe_k3v9", 7]]},
                       features=FEATURE_BITS["shm-tensors"])
BIN_ACK = bin_header("ack", [], {"segments": [["edge_0badcafe_k3v9", 7]]}, request_id="",
                     stage_id="", epoch=0)
BIN_GENERATE = bin_header("generate", [bin_tensor("ids", "int64", [], 8)],
                          features=FEATURE_BITS["stream-events"])

VALID_FRAMES += [
    {"name": "binary request with an inline tensor and params", "limits": BINARY_LIMITS,
     "hex": bin_frame(BIN_RUN, X_BYTES).hex(),
     "header": header([X], op="run", meta={"bucket": "b1"}), "tensors": {"x": X_BYTES.hex()}},
    {"name": "binary event with a shared-memory tensor beside an inline one",
     "limits": BINARY_LIMITS, "hex": bin_frame(BIN_EVENT, b"\x01\x02\x03\x04").hex(),
     "header": header([tensor("kv", "float16", [2, 1024], 4096, REF),
                       tensor("ids", "uint8", [4], 4)], op="event",
                      required_features=["shm-tensors"],
                      meta={"seq": 0, "kind": "done", "data": {}, "error": None,
                            "created_ns": 7, "acks": [["edge_0badcafe_k3v9", 7]]}),
     "tensors": {"ids": "01020304"}},
    {"name": "binary ack without tensors", "limits": BINARY_LIMITS,
     "hex": bin_frame(BIN_ACK).hex(),
     "header": header([], op="ack", request_id="", stage_id="", epoch=0,
                      meta={"segments": [["edge_0badcafe_k3v9", 7]]}), "tensors": {}},
    {"name": "binary generate with a zero-d tensor and empty meta", "limits": BINARY_LIMITS,
     "hex": bin_frame(BIN_GENERATE, struct.pack("<q", 5)).hex(),
     "header": header([tensor("ids", "int64", [], 8)], op="generate",
                      required_features=["stream-events"]),
     "tensors": {"ids": "0500000000000000"}},
]


def bin_bad(name: str, raw: bytes, error: str, field: str | None, payload: bytes = b"", *,
            limits: dict[str, Any] = BINARY_LIMITS, payload_len: int | None = None,
            max_alloc: int = 64 * KiB) -> dict[str, Any]:
    """A binary-header frame that must be refused (see :func:`bad`)."""
    return bad(name, bin_frame(raw, payload, payload_len=payload_len), error, field,
               limits=limits, max_alloc=max_alloc)


INVALID_FRAMES += [
    bad("binary header without the feature", bin_frame(BIN_RUN, X_BYTES),
        "UnknownRequiredFeature", "prefix.magic"),
    bin_bad("binary header shorter than its fixed part", BIN_RUN[:20], "HeaderMalformed",
            "header"),
    bin_bad("binary version 2", bin_header("run", [BIN_X], version=2), "VersionMismatch",
            "header.version", X_BYTES),
    bin_bad("binary unknown feature bit", bin_header("run", [BIN_X], features=0x80),
            "UnknownRequiredFeature", "header.required_features", X_BYTES),
    bin_bad("binary feature this reader does not support",
            bin_header("run", [BIN_X], features=FEATURE_BITS["bfloat16"]),
            "UnknownRequiredFeature", "header.required_features", X_BYTES,
            limits={**LIMITS, "supported_features": ["binary-header", "cancel"]}),
    bin_bad("binary tensor count over max_tensors", bin_header("run", [BIN_X], count=2000),
            "HeaderMalformed", "header.tensors", X_BYTES),
    bin_bad("binary op code 0", bin_header("run", [BIN_X], op_code=0), "HeaderMalformed",
            "header.op", X_BYTES),
    bin_bad("binary control op code", bin_header("run", [BIN_X], op_code=9), "HeaderMalformed",
            "header.op", X_BYTES),
    bin_bad("binary epoch beyond int64", bin_header("run", [BIN_X], epoch=2**63),
            "HeaderMalformed", "header.epoch", X_BYTES),
    bin_bad("binary request id runs past the header", bin_header("run", [], request_len=400),
            "HeaderMalformed", "header.request_id"),
    bin_bad("binary request id over 512 bytes", bin_header("run", [], request_len=60000),
            "HeaderMalformed", "header.request_id"),
    bin_bad("binary request id not UTF-8", bin_header("run", [], request_bytes=b"r\xff"),
            "HeaderMalformed", "header.request_id"),
    bin_bad("binary request id with a newline", bin_header("run", [], request_id="a\nb"),
            "HeaderMalformed", "header.request_id"),
    bin_bad("binary tensor entry cut short", bin_header("run", [BIN_X[:6]], {"a": 1}),
            "DescriptorInvalid", "header.tensors[0]"),
    bin_bad("binary dimensions past the header",
            bin_header("run", [struct.pack("<HBBBQ", 1, 10, 200, 0, 16)]),
            "DescriptorInvalid", "header.tensors[0].shape"),
    bin_bad("binary tensor entry bytes past the header",
            bin_header("run", [BIN_X], tensors_len=5000), "HeaderMalformed", "header.tensors",
            X_BYTES),
    bin_bad("binary tensor entry bytes longer than the entries",
            bin_header("run", [BIN_X], {"a": 1}, tensors_len=len(BIN_X) + 2),
            "HeaderMalformed", "header.tensors", X_BYTES),
    bin_bad("binary tensor entry bytes without entries", bin_header("run", [], tensors_len=3),
            "HeaderMalformed", "header.tensors"),
    bin_bad("binary unknown dtype code",
            bin_header("run", [bin_tensor("x", "float32", [2, 2], 16, dtype_code=13)]),
            "DescriptorInvalid", "header.tensors[0].dtype", X_BYTES),
    bin_bad("binary nbytes mismatch", bin_header("run", [bin_tensor("x", "float32", [2, 2], 15)]),
            "DescriptorInvalid", "header.tensors[0].nbytes", X_BYTES[:15]),
    bin_bad("binary 33 dimensions", bin_header("run", [bin_tensor("x", "uint8", [1] * 33, 1)]),
            "DescriptorInvalid", "header.tensors[0].shape", b"\x00"),
    bin_bad("binary dimension beyond int64",
            bin_header("run", [bin_tensor("x", "uint8", [2**63, 0], 0)]),
            "DescriptorInvalid", "header.tensors[0].shape[0]"),
    bin_bad("binary tensor name not UTF-8",
            bin_header("run", [bin_tensor("x", "float32", [2, 2], 16, name_bytes=b"\xc3")]),
            "DescriptorInvalid", "header.tensors[0].name", X_BYTES),
    bin_bad("binary repeated tensor name", bin_header("run", [BIN_X, BIN_X]),
            "DescriptorInvalid", "header.tensors[1].name", X_BYTES + X_BYTES),
    bin_bad("binary ref flag 2",
            bin_header("run", [bin_tensor("x", "float32", [2, 2], 16, ref_flag=2)]),
            "DescriptorInvalid", "header.tensors[0].ref", X_BYTES),
    bin_bad("binary ref cut short",
            bin_header("event", [bin_tensor("kv", "float16", [2, 1024], 4096, ref_flag=1)],
                       features=1), "DescriptorInvalid", "header.tensors[0].ref"),
    bin_bad("binary segment with a slash",
            bin_header("event", [bin_tensor("kv", "float16", [2, 1024], 4096,
                                            {**REF, "segment": "/psm_1"})], features=1),
            "DescriptorInvalid", "header.tensors[0].ref.segment"),
    bin_bad("binary shared-memory tensor without its feature",
            bin_header("event", [bin_tensor("kv", "float16", [2, 1024], 4096, REF)]),
            "DescriptorInvalid", "header.tensors[0].ref"),
    bin_bad("binary meta length differs from what is left",
            bin_header("run", [BIN_X], {"a": 1}, meta_len=3), "HeaderMalformed", "header.meta",
            X_BYTES),
    bin_bad("binary meta is not JSON", bin_header("run", [BIN_X], b"{nope"), "HeaderMalformed",
            "header.meta", X_BYTES),
    bin_bad("binary meta is an array", bin_header("run", [BIN_X], b"[1]"), "HeaderMalformed",
            "header.meta", X_BYTES),
    bin_bad("binary meta with a repeated key", bin_header("run", [BIN_X], b'{"a":1,"a":2}'),
            "HeaderMalformed", "header.meta", X_BYTES),
    bin_bad("binary meta with NaN", bin_header("run", [BIN_X], b'{"a":NaN}'), "HeaderMalformed",
            "header.meta", X_BYTES),
    bin_bad("binary inline tensors over limit",
            bin_header("run", [bin_tensor("x", "uint8", [2, MiB], 2 * MiB)]), "PayloadTooLarge",
            "header.tensors", payload_len=0, max_alloc=16 * KiB),
    bin_bad("binary shared-memory bytes over limit",
            bin_header("event", [bin_tensor("kv", "uint8", [GiB], GiB, REF)], features=1),
            "PayloadTooLarge", "header.tensors", max_alloc=16 * KiB),
    bin_bad("binary payload length differs from the tensors", BIN_RUN, "PayloadMismatch",
            "prefix.payload_len", X_BYTES[:8]),
    bin_bad("binary large payload length refused before allocation", BIN_RUN,
            "PayloadMismatch", "prefix.payload_len", payload_len=1000000, max_alloc=16 * KiB),
    bin_bad("binary truncated payload", BIN_RUN, "FrameTruncated", "payload", X_BYTES[:-2],
            payload_len=16),
    bad("binary trailing bytes", bin_frame(BIN_RUN, X_BYTES) + b"\x00", "PayloadMismatch",
        "frame", limits=BINARY_LIMITS),
]


def build() -> dict[str, Any]:
    """Return the fixture document."""
    types = {"BufferDescriptor": BUFFERS, "StageRequest": REQUESTS, "StageEvent": EVENTS,
             "ErrorInfo": ERRORS, "StateHandle": STATES, "DeviceDescriptor": DEVICES,
             "ArtifactMetadata": METADATAS, "ArtifactManifest": MANIFESTS, **WIRE_TYPES}
    return {
        "format": "edge-contracts-conformance",
        "format_version": 1,
        "protocol_version": 1,
        "generated_by": "contracts/tools/make_fixtures.py",
        "dtypes": DTYPES,
        "types": types,
        "state": {"current": STATE, "stale": STALE, "accepted": ACCEPTED},
        "negotiation": NEGOTIATION,
        "frames": {"valid": VALID_FRAMES, "invalid": INVALID_FRAMES},
    }


def render(document: dict[str, Any]) -> str:
    """Serialise deterministically (sorted keys, ASCII, one-space indent, final newline)."""
    return json.dumps(document, indent=1, sort_keys=True, ensure_ascii=True, allow_nan=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check`` verify) the fixture file; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the file is out of date")
    parser.add_argument("--out", type=Path, default=OUT, help="fixture file to write or check")
    args = parser.parse_args(argv)
    text = render(build())
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is out of date: run {Path(__file__).name}", file=sys.stderr)
            return 1
        print(f"{args.out} is up to date")
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out} ({len(text)} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

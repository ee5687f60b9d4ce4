"""Frames with the fixed binary header, assembled field by field with ``struct``.

Per-request frames (run, generate, event, ack) with the fixed binary header of
edge_contracts.binary_header, prefix magic b"EDGB": valid ones and refused ones.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from .common import ALL_FEATURES, GiB, KiB, MiB
from .json_frames import LIMITS, X_BYTES, X, bad, header, tensor
from .wire_cases import REF

BINARY_LIMITS = {**LIMITS, "supported_features": sorted([*ALL_FEATURES, "binary-header"])}
OP_CODES = {"run": 1, "generate": 2, "event": 3, "ack": 4}
DTYPE_CODES = {name: code for code, name in enumerate(
    ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
     "float16", "float32", "float64", "bfloat16"])}
FEATURE_BITS = {"shm-tensors": 1, "stream-events": 2, "bfloat16": 4, "cancel": 8,
                "event-fields": 16}
EVENT_LIMITS = {**LIMITS, "supported_features": sorted([*ALL_FEATURES, "binary-header",
                                                         "event-fields"])}
KIND_CODES = {"output": 0, "token": 1, "progress": 2, "done": 3, "error": 4, "cancelled": 5}


def event_block(seq: int, created_ns: int, kind: int) -> bytes:
    """The event-fields block: "<QQB" seq, created_ns, kind code."""
    return struct.pack("<QQB", seq, created_ns, kind)


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
               tensors_len: int | None = None, block: bytes = b"") -> bytes:
    """A binary header: "<HBBHHHIIQQ" fixed part, ids, event block, tensor entries, meta."""
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
    return fixed + request + stage + block + entries + raw_meta


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

EVENT_FIELDS = FEATURE_BITS["event-fields"]
BIN_EVENT_FIELDS = bin_header("event", [bin_tensor("ids", "uint8", [4], 4)],
                              {"acks": [["edge_0badcafe_k3v9", 7]]}, features=EVENT_FIELDS,
                              block=event_block(3, 9, KIND_CODES["done"]))
BIN_TOKEN_FIELDS = bin_header("event", [], features=EVENT_FIELDS,
                              block=event_block(0, 2**63 - 1, KIND_CODES["token"]))

BINARY_VALID_FRAMES = [
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
    {"name": "binary event with its fields in the event block", "limits": EVENT_LIMITS,
     "hex": bin_frame(BIN_EVENT_FIELDS, b"\x01\x02\x03\x04").hex(),
     "header": header([tensor("ids", "uint8", [4], 4)], op="event",
                      required_features=["event-fields"],
                      meta={"seq": 3, "kind": "done", "created_ns": 9,
                            "acks": [["edge_0badcafe_k3v9", 7]]}),
     "tensors": {"ids": "01020304"}},
    {"name": "binary token event with only the event block", "limits": EVENT_LIMITS,
     "hex": bin_frame(BIN_TOKEN_FIELDS).hex(),
     "header": header([], op="event", required_features=["event-fields"],
                      meta={"seq": 0, "kind": "token", "created_ns": 2**63 - 1}),
     "tensors": {}},
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


BINARY_INVALID_FRAMES = [
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
    bin_bad("binary event block the reader does not support", BIN_TOKEN_FIELDS,
            "UnknownRequiredFeature", "header.required_features"),
    bin_bad("binary event block on a request",
            bin_header("run", [BIN_X], features=EVENT_FIELDS, block=event_block(0, 0, 3)),
            "HeaderMalformed", "header.required_features", X_BYTES, limits=EVENT_LIMITS),
    bin_bad("binary event block cut short",
            bin_header("event", [], features=EVENT_FIELDS, block=b"\x00" * 5),
            "HeaderMalformed", "header.event", limits=EVENT_LIMITS),
    bin_bad("binary event kind code 6",
            bin_header("event", [], features=EVENT_FIELDS, block=event_block(0, 0, 6)),
            "HeaderMalformed", "header.meta.kind", limits=EVENT_LIMITS),
    bin_bad("binary event seq beyond int64",
            bin_header("event", [], features=EVENT_FIELDS, block=event_block(2**63, 0, 3)),
            "HeaderMalformed", "header.meta.seq", limits=EVENT_LIMITS),
    bin_bad("binary event created_ns beyond int64",
            bin_header("event", [], features=EVENT_FIELDS, block=event_block(0, 2**64 - 1, 3)),
            "HeaderMalformed", "header.meta.created_ns", limits=EVENT_LIMITS),
    bin_bad("binary event meta repeating a field of the block",
            bin_header("event", [], {"data": {}, "seq": 1}, features=EVENT_FIELDS,
                       block=event_block(1, 0, 3)),
            "HeaderMalformed", "header.meta", limits=EVENT_LIMITS),
]

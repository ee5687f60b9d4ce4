"""Measure the frame header as JSON (what edge_contracts.wire uses) against a binary layout.

Both encodings carry the same header: version, required features, op, request id,
stage id, epoch, generation, meta (op-specific JSON, so it stays JSON inside the
binary layout too) and each tensor's name, dtype, shape, nbytes and optional
shared-memory reference. Both decoders end in the same validated FrameHeader, so the
numbers compare the whole per-call header path, not just the codec.

Run: .venv/bin/python benchmarks/wire_header.py [--quick]
Prints per-operation times (best of several repeats), sizes and the JSON/binary ratio; the
last line is one JSON object with the same figures.
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from edge_contracts.dtypes import DType
from edge_contracts.errors import (
    HeaderMalformed,
    PayloadTooLarge,
    UnknownRequiredFeature,
    VersionMismatch,
)
from edge_contracts.protocol import PROTOCOL_VERSION
from edge_contracts.wire import (
    FrameHeader,
    Limits,
    ShmRef,
    TensorSpec,
    decode_frame,
    encode_frame,
    encode_header,
    parse_header,
)

LIMITS = Limits(max_io_bytes=1 << 30)
DTYPE_CODES = {member: index for index, member in enumerate(DType)}
DTYPES_BY_CODE = list(DType)

# ---- binary layout: u8 version | u8 nfeatures | u16 ntensors | u64 epoch | u64 generation
#      | str op | str request_id | str stage_id | features (str each) | bytes meta-json
#      | per tensor: str name | u8 dtype | u8 ndim | u64 dims... | u64 nbytes | u8 has_ref
#      | [str segment | u64 offset | u64 generation]; str = u16 length + UTF-8
FIXED = struct.Struct("<BBHQQ")
U16 = struct.Struct("<H")
U32 = struct.Struct("<I")
U64 = struct.Struct("<Q")
TENSOR_FIXED = struct.Struct("<BB")
REF_FIXED = struct.Struct("<QQ")


def _put_str(out: bytearray, text: str) -> None:
    raw = text.encode()
    out += U16.pack(len(raw))
    out += raw


def encode_binary(header: FrameHeader) -> bytes:
    out = bytearray(
        FIXED.pack(
            header.version,
            len(header.required_features),
            len(header.tensors),
            header.epoch,
            header.generation,
        )
    )
    _put_str(out, header.op)
    _put_str(out, header.request_id)
    _put_str(out, header.stage_id)
    for name in sorted(header.required_features):
        _put_str(out, name)
    meta = json.dumps(header.to_dict()["meta"], separators=(",", ":")).encode()
    out += U32.pack(len(meta))
    out += meta
    for spec in header.tensors:
        _put_str(out, spec.name)
        out += TENSOR_FIXED.pack(DTYPE_CODES[spec.dtype], len(spec.shape))
        out += struct.pack(f"<{len(spec.shape)}Q", *spec.shape)
        out += U64.pack(spec.nbytes)
        if spec.ref is None:
            out.append(0)
        else:
            out.append(1)
            _put_str(out, spec.ref.segment)
            out += REF_FIXED.pack(spec.ref.offset, spec.ref.generation)
    return bytes(out)


def parse_binary(raw: bytes, limits: Limits) -> FrameHeader:
    """Decode the binary layout with the same checks parse_header makes."""
    try:
        version, nfeatures, ntensors, epoch, generation = FIXED.unpack_from(raw, 0)
        at = FIXED.size

        def take_str() -> str:
            nonlocal at
            (length,) = U16.unpack_from(raw, at)
            at += 2
            text = raw[at : at + length].decode()
            at += length
            return text

        if version != PROTOCOL_VERSION:
            raise VersionMismatch("header.version", version, f"must be {PROTOCOL_VERSION}")
        op, request_id, stage_id = take_str(), take_str(), take_str()
        features = [take_str() for _ in range(nfeatures)]
        unknown = sorted(set(features) - limits.supported_features)
        if unknown:
            raise UnknownRequiredFeature("header.required_features", unknown, "not supported")
        if ntensors > limits.max_tensors:
            raise HeaderMalformed("header.tensors", ntensors, "too many")
        (meta_len,) = U32.unpack_from(raw, at)
        at += 4
        meta = json.loads(raw[at : at + meta_len])
        at += meta_len
        specs = []
        for _ in range(ntensors):
            name = take_str()
            code, ndim = TENSOR_FIXED.unpack_from(raw, at)
            at += 2
            shape = struct.unpack_from(f"<{ndim}Q", raw, at)
            at += 8 * ndim
            (nbytes,) = U64.unpack_from(raw, at)
            at += 8
            has_ref = raw[at]
            at += 1
            ref = None
            if has_ref:
                segment = take_str()
                offset, ref_generation = REF_FIXED.unpack_from(raw, at)
                at += 16
                ref = ShmRef(segment, offset, ref_generation)
            specs.append(TensorSpec(name, DTYPES_BY_CODE[code], shape, nbytes, ref))
    except (struct.error, IndexError, UnicodeDecodeError, ValueError) as exc:
        raise HeaderMalformed("header", raw[:64], str(exc)) from None
    header = FrameHeader(
        op, request_id, stage_id, epoch, generation, tuple(specs), meta, frozenset(features)
    )
    if header.total_nbytes > limits.max_io_bytes:
        raise PayloadTooLarge("header.tensors", header.total_nbytes, "over max_io_bytes")
    return header


def sample_headers() -> dict[str, FrameHeader]:
    image = TensorSpec("image", DType.FLOAT32, (1, 3, 640, 640), 4 * 3 * 640 * 640)
    scale = TensorSpec("scale", DType.FLOAT32, (2,), 8)
    ids = TensorSpec("ids", DType.INT64, (1, 32), 256)
    kv = TensorSpec(
        "kv", DType.BFLOAT16, (2, 32, 128), 16384, ShmRef("edge_0badcafe_k3v9", 4096, 7)
    )
    return {
        "one tensor, empty meta": FrameHeader("call", "req-000001", "ocr.det", 4, 3, (image,)),
        "three tensors + meta": FrameHeader(
            "call",
            "req-000001",
            "ocr.det",
            4,
            3,
            (image, scale, ids),
            {"bucket": "640x640", "deadline_ms": 250},
        ),
        "generate event, shm tensor": FrameHeader(
            "event",
            "chat-7/turn-2",
            "llm",
            9,
            2,
            (ids, kv),
            {"text": "hello", "finish": None},
            frozenset({"shm-tensors", "bfloat16"}),
        ),
    }


def best_ns(call: Callable[[], Any], number: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter_ns()
        for _ in range(number):
            call()
        best = min(best, (time.perf_counter_ns() - start) / number)
    return best


ECHO = """
import socket, sys
sock = socket.socket(fileno=int(sys.argv[1]))
buf = bytearray(65536)
while True:
    n = sock.recv_into(buf)
    if not n:
        break
    sock.sendall(memoryview(buf)[:n])
"""


def echo_round_trip_us(frame: bytes, rounds: int) -> float:
    """Median round trip of ``frame`` to an echoing child process over a socketpair."""
    mine, theirs = socket.socketpair()
    child = subprocess.Popen(
        [sys.executable, "-c", ECHO, str(theirs.fileno())], pass_fds=[theirs.fileno()]
    )
    theirs.close()
    samples = []
    back = bytearray(len(frame))
    try:
        for _ in range(rounds):
            start = time.perf_counter_ns()
            mine.sendall(frame)
            got = 0
            while got < len(frame):
                got += mine.recv_into(memoryview(back)[got:])
            samples.append(time.perf_counter_ns() - start)
    finally:
        mine.close()
        child.wait(timeout=10)
    samples.sort()
    return samples[len(samples) // 2] / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    args = parser.parse_args()
    number, repeat = (2000, 3) if args.quick else (20000, 7)
    print(
        f"{'header':30} {'codec':7} {'bytes':>6} {'encode µs':>10} {'parse µs':>9} {'total µs':>9}"
    )
    ratios = []
    totals: dict[str, dict[str, float]] = {}
    for label, header in sample_headers().items():
        json_raw, binary_raw = encode_header(header), encode_binary(header)
        assert parse_header(json_raw, LIMITS) == header
        assert parse_binary(binary_raw, LIMITS) == header
        rows = {}
        for codec, encode, parse, raw in (
            ("json", encode_header, parse_header, json_raw),
            ("binary", encode_binary, parse_binary, binary_raw),
        ):
            enc = best_ns(lambda: encode(header), number, repeat) / 1000  # noqa: B023
            dec = best_ns(lambda: parse(raw, LIMITS), number, repeat) / 1000  # noqa: B023
            rows[codec] = enc + dec
            print(f"{label:30} {codec:7} {len(raw):6d} {enc:10.2f} {dec:9.2f} {enc + dec:9.2f}")
        ratios.append(rows["json"] / rows["binary"])
        totals[label] = {f"{codec}_us": round(value, 2) for codec, value in rows.items()}
        print(f"{'':30} json/binary time ratio: {ratios[-1]:.2f}")
    small = FrameHeader("call", "r1", "s1", 0, 0, (TensorSpec("x", DType.FLOAT32, (16,), 64),))
    payload = bytes(64)
    frame = b"".join(bytes(p) for p in encode_frame(small, [payload]))
    whole = best_ns(
        lambda: decode_frame(b"".join(bytes(p) for p in encode_frame(small, [payload])), LIMITS),
        number,
        repeat,
    )
    print(
        f"whole frame encode+decode, one 64-byte tensor ({len(frame)} bytes): {whole / 1000:.2f} µs"
    )
    rtt = echo_round_trip_us(frame, 2000 if args.quick else 20000)
    print(f"same frame, socketpair round trip to a child process (median): {rtt:.2f} µs")
    print(f"mean json/binary ratio over the samples: {sum(ratios) / len(ratios):.2f}")
    print(json.dumps({"headers": totals, "whole_frame_us": round(whole / 1000, 2),
                      "socketpair_rtt_us": round(rtt, 2),
                      "json_over_binary": round(sum(ratios) / len(ratios), 3)}))


if __name__ == "__main__":
    main()

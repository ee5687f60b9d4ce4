"""A seeded mutation fuzzer for frames, control frames and manifests.

Each case takes a valid input of one form (:mod:`edge_core.testing.fuzz_forms`), applies
one or two mutations — byte flips, truncation, splices, appended bytes, length lies in
the prefix (consistent with the header or not), JSON-level edits of the header or the
document (a value replaced by one of another type or size, a key deleted, added or
*duplicated*, a tensor's dims or dtype changed) — and runs the result through:

- frames: ``decode_frame`` and the stream reader (``FrameReader`` over a ``recv_into``
  handing out random chunk sizes), then, when accepted, the receiver's own parsing of
  the frame's ``meta`` (``parse_ack``, ``BootConfig.from_dict``, hello verification);
- manifests: the verifier's ``parse_manifest``.

It counts, in a :class:`Campaign`:

``untyped_errors``
    an exception that is not the layer's typed error (``WireError``/``ContractError``
    for frames, ``BootstrapRefused`` for a hello, ``ManifestInvalid`` for a manifest);
``hangs``
    a case still running after :data:`HANG_S` (interrupted by ``SIGALRM`` where there
    is one);
``accepted_roundtrip_mismatches``
    an accepted input that does not survive re-encoding and decoding unchanged, or that
    the decoder and the stream reader read differently;
``max_alloc_bytes_before_payload``
    the ``tracemalloc`` peak while a frame's prefix and header have been delivered to
    the stream reader and no payload byte yet (measured on every
    :data:`ALLOC_SAMPLE_EVERY`-th frame case and on every length lie).

Everything follows from the seed: a failing case is reproduced by its index.
"""

from __future__ import annotations

import contextlib
import json
import random
import signal
import struct
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from edge_contracts.binary_header import BINARY_MAGIC, FIXED
from edge_contracts.dtypes import DType
from edge_contracts.errors import WireError
from edge_contracts.frame_reader import FrameReader
from edge_contracts.headers import FrameHeader, TensorSpec
from edge_contracts.protocol import FEATURE_BFLOAT16, FEATURE_SHM_TENSORS, KNOWN_FEATURES
from edge_contracts.wire import (
    PREFIX,
    PREFIX_SIZE,
    Frame,
    Limits,
    decode_frame,
    encode_frame,
    encode_header,
)
from edge_core.testing.fuzz_forms import FRAME_FORMS, MANIFEST_FORM, FrameForm, json_value

__all__ = ["ALLOC_SAMPLE_EVERY", "HANG_S", "LIMITS", "Campaign", "run_campaign"]

HANG_S = 2.0
"""A case running longer than this counts as a hang."""

ALLOC_SAMPLE_EVERY = 64
"""Every this many frame cases, the allocation before the payload is measured."""

LIMITS = (
    Limits(max_io_bytes=1 << 30, max_tensors=16),
    Limits(max_io_bytes=1 << 16, max_tensors=4,
           supported_features=KNOWN_FEATURES - {FEATURE_BFLOAT16, FEATURE_SHM_TENSORS}),
)
"""The readers' limits: a generous channel, and a small one that negotiated no features."""


class _Hang(Exception):
    """Raised by the alarm inside a case that ran past :data:`HANG_S`."""


class _Stalled(Exception):
    """The measuring stream has delivered prefix and header, and nothing more."""


@dataclass
class Campaign:
    """The counters of one fuzzing run (see the module docstring)."""

    cases: int = 0
    untyped_errors: int = 0
    hangs: int = 0
    max_alloc_bytes_before_payload: int = 0
    accepted_roundtrip_mismatches: int = 0
    accepted: int = 0
    failures: list[str] = field(default_factory=list)

    def result(self) -> dict[str, int]:
        """The JSON summary (the benchmark's last line)."""
        return {
            "cases": self.cases,
            "untyped_errors": self.untyped_errors,
            "hangs": self.hangs,
            "max_alloc_bytes_before_payload": self.max_alloc_bytes_before_payload,
            "accepted_roundtrip_mismatches": self.accepted_roundtrip_mismatches,
        }

    def fail(self, kind: str, index: int, detail: str) -> None:
        """Record one failure (the first 20 keep their detail)."""
        if len(self.failures) < 20:
            self.failures.append(f"case {index}: {kind}: {detail}")


# -- mutations ---------------------------------------------------------------------------


def _mutate_bytes(rng: random.Random, data: bytearray) -> bytearray:
    pick = rng.randrange(6)
    at = rng.randrange(len(data)) if data else 0
    if pick == 0 and data:
        data[at] ^= rng.randint(1, 255)
    elif pick == 1:
        del data[at:]
    elif pick == 2:
        end = rng.randint(at, len(data))
        data[at:end] = rng.randbytes(rng.randint(0, 16))
    elif pick == 3:
        data += rng.randbytes(rng.randint(1, 32))
    elif pick == 4 and len(data) >= PREFIX_SIZE:  # a length lie in the prefix
        header_len = struct.unpack_from("<I", data, 4)[0]
        lie = rng.choice([0, 1, 1 << 20, 1 << 30, 2**64 - 1, rng.randint(0, 1 << 24)])
        if rng.random() < 0.3:
            header_len = rng.choice([0, 1, 1 << 16, 2**32 - 1, header_len + 1])
        data[:PREFIX_SIZE] = PREFIX.pack(bytes(data[:4]), header_len & 0xFFFFFFFF, lie)
    elif data:
        data.insert(at, rng.randint(0, 255))
    return data


def _edit_document(rng: random.Random, document: Any) -> Any:
    """A JSON-level edit somewhere in ``document`` (an object)."""
    target = document
    for _ in range(rng.randint(0, 3)):  # walk down a little
        children = [v for v in (target.values() if isinstance(target, dict) else target)
                    if isinstance(v, dict | list) and v] if isinstance(target, dict | list) else []
        if not children:
            break
        target = rng.choice(children)
    if isinstance(target, list):
        if target and rng.random() < 0.5:
            target[rng.randrange(len(target))] = json_value(rng)
        else:
            target.append(json_value(rng))
        return document
    if not isinstance(target, dict):
        return document
    keys = sorted(target)
    pick = rng.randrange(4)
    if pick == 0 and keys:
        target[rng.choice(keys)] = json_value(rng)
    elif pick == 1 and keys:
        del target[rng.choice(keys)]
    elif pick == 2:
        target[rng.choice([*keys, "x"])] = json_value(rng)
    else:
        target[rng.choice(keys or ["x"])] = rng.choice(
            [[0, 2**62], [2**40, 2**40], -1, 2**64, "bfloat16", "float32", 1.5, True]
        )
    return document


def _duplicate_key(rng: random.Random, text: str) -> str:
    """Repeat one ``"key": value`` pair textually (json.dumps cannot make duplicates)."""
    starts = [i for i, char in enumerate(text) if char == "{" and text[i + 1 : i + 2] == '"']
    if not starts:
        return text
    at = rng.choice(starts) + 1
    colon = text.find(":", at)
    return text[:at] + text[at:colon] + ':"dup",' + text[at:]


# (offset, size) of each field of the binary header's fixed part, "<HBBHHHIIQQ" (see
# edge_contracts.binary_header.FIXED): version, op code, feature bits, request and stage id
# lengths, tensor count, tensor-entry and meta lengths, epoch, generation
_BINARY_FIELDS = tuple(
    zip(
        (0, 2, 3, 4, 6, 8, 10, 14, 18, 26),
        (2, 1, 1, 2, 2, 2, 4, 4, 8, 8),
        strict=True,
    )
)


def _edit_binary_header(rng: random.Random, raw: bytearray) -> bytes:
    """The binary header with one field of its fixed part set to another value."""
    if len(raw) < FIXED.size:
        return bytes(raw)
    at, size = rng.choice(_BINARY_FIELDS)
    top = (1 << (8 * size)) - 1
    raw[at : at + size] = rng.choice([0, 1, rng.randint(0, top), top]).to_bytes(size, "little")
    return bytes(raw)


def _mutate_frame(rng: random.Random, valid: bytes) -> bytes:
    if rng.random() < 0.45 and len(valid) >= PREFIX_SIZE:
        header_len, payload_len = struct.unpack_from("<IQ", valid, 4)
        raw = valid[PREFIX_SIZE : PREFIX_SIZE + header_len]
        payload = valid[PREFIX_SIZE + header_len :]
        magic = valid[:4]
        if magic == BINARY_MAGIC:  # no JSON to edit: a field of the fixed part lies
            new = _edit_binary_header(rng, bytearray(raw))
        elif rng.random() < 0.25:
            new = _duplicate_key(rng, raw.decode()).encode()
        else:
            new = json.dumps(_edit_document(rng, json.loads(raw)), separators=(",", ":")).encode()
        if rng.random() < 0.2:  # a consistent lie: prefix and header agree, payload missing
            payload = b""
        valid = PREFIX.pack(magic, len(new), payload_len) + new + payload
    data = bytearray(valid)
    for _ in range(rng.choice([0, 1, 1, 2])):
        data = _mutate_bytes(rng, data)
    return bytes(data)


# -- running one case --------------------------------------------------------------------


def _chunked(data: bytes, rng: random.Random) -> Callable[[memoryview], int]:
    position = 0
    sizes = [rng.choice([1, 3, 16, 100, 4096, 1 << 20]) for _ in range(4)]
    calls = 0

    def recv_into(view: memoryview) -> int:
        nonlocal position, calls
        count = min(len(view), sizes[calls % 4], len(data) - position)
        calls += 1
        view[:count] = data[position : position + count]
        position += count
        return count

    return recv_into


def _same(a: Frame, b: Frame) -> bool:
    return a.header == b.header and a.payload == b.payload


def _reencoded(frame: Frame, limits: Limits) -> Frame:
    parts = encode_frame(frame.header, list(frame.tensor_views().values()))
    return decode_frame(b"".join(bytes(part) for part in parts), limits)


def alloc_before_payload(data: bytes, limits: Limits) -> int | None:
    """The tracemalloc peak of the stream reader fed ``data``'s prefix and header only.

    ``None`` when ``data`` has no complete prefix or no payload to withhold.
    """
    if len(data) < PREFIX_SIZE:
        return None
    header_len, payload_len = struct.unpack_from("<IQ", data, 4)
    if not payload_len:
        return None
    head = data[: PREFIX_SIZE + header_len]
    position = 0

    def recv_into(view: memoryview) -> int:
        nonlocal position
        if position >= len(head):
            raise _Stalled
        count = min(len(view), len(head) - position)
        view[:count] = head[position : position + count]
        position += count
        return count

    reader = FrameReader(recv_into, limits)  # its receive buffer exists before the frame
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        with contextlib.suppress(_Stalled, WireError):
            reader.read()
        return max(0, tracemalloc.get_traced_memory()[1] - base)
    finally:
        tracemalloc.stop()


def _frame_case(campaign: Campaign, index: int, rng: random.Random, form: FrameForm) -> None:
    data = _mutate_frame(rng, form.make(rng))
    limits = rng.choice(LIMITS)
    try:
        decoded: Frame | None = form.decode(data, limits)
    except WireError:
        decoded = None
    trailing = False
    streamed: Frame | None = None
    if form.stream:
        try:
            streamed = FrameReader(_chunked(data, rng), limits).read()
        except WireError:
            streamed = None
        if decoded is not None and (streamed is None or not _same(decoded, streamed)):
            campaign.accepted_roundtrip_mismatches += 1
            campaign.fail("decoder and stream reader differ", index, data[:80].hex())
        trailing = decoded is None and streamed is not None
    if decoded is not None:
        campaign.accepted += 1
        if not _same(_reencoded(decoded, limits), decoded):
            campaign.accepted_roundtrip_mismatches += 1
            campaign.fail("re-encoding changed the frame", index, data[:80].hex())
        if form.check is not None:
            with contextlib.suppress(*form.check_errors):
                form.check(decoded)
    elif trailing and streamed is not None:
        header_len, payload_len = struct.unpack_from("<IQ", data, 4)
        with contextlib.suppress(WireError):  # only trailing bytes may separate them
            form.decode(data[: PREFIX_SIZE + header_len + payload_len], limits)
            return
        campaign.accepted_roundtrip_mismatches += 1
        campaign.fail("stream reader accepted what the decoder refused", index, data[:80].hex())


def _manifest_case(campaign: Campaign, index: int, rng: random.Random) -> None:
    raw = MANIFEST_FORM.make(rng)
    if rng.random() < 0.3:
        raw = _duplicate_key(rng, raw.decode()).encode()
    elif rng.random() < 0.7:
        raw = json.dumps(_edit_document(rng, json.loads(raw))).encode()
    else:
        raw = bytes(_mutate_bytes(rng, bytearray(raw)))
    try:
        parsed = MANIFEST_FORM.parse(raw)
    except MANIFEST_FORM.errors:
        return
    campaign.accepted += 1
    if not MANIFEST_FORM.roundtrip(parsed):
        campaign.accepted_roundtrip_mismatches += 1
        campaign.fail("manifest changed by a round trip", index, raw[:80].hex())


def _on_alarm(_signum: int, _frame: Any) -> None:
    raise _Hang


@contextlib.contextmanager
def _alarm() -> Iterator[bool]:
    """Arm SIGALRM for hang detection when this thread can (main thread, POSIX)."""
    try:
        previous = signal.signal(signal.SIGALRM, _on_alarm)
    except (ValueError, AttributeError):  # not the main thread, or no SIGALRM
        yield False
        return
    try:
        yield True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_campaign(
    cases: int,
    *,
    seed: int = 0,
    first: int = 0,
    manifests: float = 0.1,
    forms: list[FrameForm] | None = None,
    progress: Callable[[Campaign], None] | None = None,
) -> Campaign:
    """Run ``cases`` cases of ``seed`` from index ``first``; return the counters.

    A ``manifests`` share of the cases are manifests; case ``i`` of a seed is always the
    same input, so a failure is replayed by its index.

    ``forms`` defaults to :data:`~edge_core.testing.fuzz_forms.FRAME_FORMS`.
    """
    forms = FRAME_FORMS if forms is None else forms
    campaign = Campaign()
    with _alarm() as armed:
        for index in range(first, first + cases):
            rng = random.Random(f"{seed}:{index}")  # noqa: S311 - reproducible, not secret
            started = time.monotonic()
            if armed:
                signal.setitimer(signal.ITIMER_REAL, HANG_S)
            try:
                if rng.random() < manifests:
                    _manifest_case(campaign, index, rng)
                else:
                    form = forms[index % len(forms)]
                    _frame_case(campaign, index, rng, form)
            except _Hang:
                campaign.hangs += 1
                campaign.fail("hang", index, f"over {HANG_S} s")
            except Exception as exc:
                campaign.untyped_errors += 1
                campaign.fail("untyped error", index, f"{type(exc).__name__}: {exc}")
            finally:
                if armed:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            if not armed and time.monotonic() - started > HANG_S:
                campaign.hangs += 1
            if index % ALLOC_SAMPLE_EVERY == 0:
                sampler = random.Random(f"{seed}:alloc:{index}")  # noqa: S311 - reproducible
                _sample_alloc(campaign, sampler, forms)
            campaign.cases += 1
            if progress is not None and campaign.cases % 10_000 == 0:
                progress(campaign)
    return campaign


def _sample_alloc(campaign: Campaign, rng: random.Random, forms: list[FrameForm]) -> None:
    """Measure the allocation before the payload for a valid frame and a length lie."""
    form = rng.choice(forms)
    valid = bytearray(form.make(rng))
    candidates = [bytes(valid)]
    if len(valid) >= PREFIX_SIZE:  # the same header claiming the channel's whole cap
        header_len = struct.unpack_from("<I", valid, 4)[0]
        candidates.append(PREFIX.pack(b"EDGW", header_len, LIMITS[0].max_io_bytes)
                          + bytes(valid[PREFIX_SIZE : PREFIX_SIZE + header_len]))
    cap = LIMITS[0].max_io_bytes  # a consistent lie: prefix and header agree on the cap
    lie = FrameHeader("run", "r", "s", 0, 1, (TensorSpec("x", DType.UINT8, (cap,), cap),))
    raw = encode_header(lie)
    candidates.append(PREFIX.pack(b"EDGW", len(raw), cap) + raw)
    for data in candidates:
        peak = alloc_before_payload(data, LIMITS[0])
        if peak is not None:
            campaign.max_alloc_bytes_before_payload = max(
                campaign.max_alloc_bytes_before_payload, peak
            )

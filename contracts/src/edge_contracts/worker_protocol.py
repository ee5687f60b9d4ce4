"""The worker channel's handshake and control payloads: boot configuration, hello, acks, spin.

Shared by the controller (edge-core's host layer) and the worker serve loop
(:mod:`edge_contracts.worker`); standard library only. The frame ops and what each
carries are listed in :mod:`edge_contracts.protocol`; this module builds and checks the
payloads of four of them: the ``boot`` frame's :class:`BootConfig`, the ``hello``'s
meta (:func:`hello_meta`), an ``ack``'s meta (:func:`parse_ack`) and a ``spin``'s
(:func:`spin_meta`, :func:`parse_spin`).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

from edge_contracts.errors import HeaderMalformed, InvalidValue
from edge_contracts.headers import FrameHeader, Limits
from edge_contracts.jsonvalues import JSONObject, strict_loads
from edge_contracts.protocol import OP_BOOT
from edge_contracts.validation import check_keys
from edge_contracts.waiting import MAX_SPIN_US

__all__ = [
    "BootConfig",
    "boot_frame",
    "hello_meta",
    "parse_ack",
    "parse_spin",
    "process_create_time",
    "process_start_time",
    "read_boot",
    "spin_meta",
]

@dataclass(frozen=True, slots=True)
class BootConfig:
    """What the controller tells a new worker in its first frame (:func:`boot_frame`).

    Attributes:
        token: the secret the worker repeats in its hello.
        entry: ``package.module:factory`` of the handler.
        generation: the worker generation stamped on every event.
        shm_prefix: prefix of the segments this worker produces.
        peer_prefix: prefix of the segments the controller produces.
        shm_threshold: outputs of at least this many bytes go through shared memory.
        shm_max_bytes: the worker producer's cap on retained bytes.
        shm_max_buffers: the worker producer's cap on retained buffers.
        max_io_bytes: most tensor bytes in one frame, both ways.
        max_header_bytes: longest frame header, both ways.
        features: features the controller supports.
        spin_us: the worker's spin budget while waiting for its next frame
            (:class:`~edge_contracts.waiting.ReadableWait`; 0: block at once).
        shm_fds: descriptor of the worker's end of the sealed-segment channel
            (:class:`~edge_contracts.sealed.FdChannel`); 0: named segments only. A worker
            that uses it says ``"sealed_segments": true`` in its hello.

    """

    token: str
    entry: str
    generation: int
    shm_prefix: str
    peer_prefix: str
    shm_threshold: int
    shm_max_bytes: int
    shm_max_buffers: int
    max_io_bytes: int
    max_header_bytes: int = 65536
    features: tuple[str, ...] = field(default=())
    spin_us: int = 0
    shm_fds: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-ready form (the ``meta`` of the boot frame)."""
        return asdict(self)

    def to_json(self) -> str:
        """Return the JSON text of :meth:`to_dict`."""
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: object) -> BootConfig:
        """Check the boot configuration's JSON form and build it.

        Raises:
            InvalidValue: naming ``boot.<key>`` for a missing, unknown or mistyped key.

        """
        mapping: Mapping[str, Any] = check_keys(data, "boot", _BOOT_REQUIRED, _BOOT_OPTIONAL)
        for name in _BOOT_STRINGS:
            if not isinstance(mapping[name], str):
                raise InvalidValue(f"boot.{name}", mapping[name], "must be a string")
        for name in _BOOT_COUNTS:
            value = mapping.get(name, 0)
            if type(value) is not int or value < 0:
                raise InvalidValue(f"boot.{name}", value, "must be an integer >= 0")
        features = mapping.get("features", ())
        if not isinstance(features, list | tuple) or not all(
            isinstance(name, str) for name in features
        ):
            raise InvalidValue("boot.features", features, "must be a list of feature names")
        values = dict(mapping)
        values["features"] = tuple(features)
        return cls(**values)

    @classmethod
    def from_json(cls, text: str) -> BootConfig:
        """Parse and check the boot configuration's JSON text."""
        try:
            data = strict_loads(text)
        except (ValueError, RecursionError) as exc:
            raise InvalidValue("boot", text[:64], f"must be JSON ({exc})") from None
        return cls.from_dict(data)


_BOOT_FIELDS = fields(BootConfig)
_BOOT_REQUIRED = frozenset(f.name for f in _BOOT_FIELDS
                           if f.default is MISSING and f.default_factory is MISSING)
"""The keys every boot configuration carries: the fields without a default."""
_BOOT_OPTIONAL = frozenset(f.name for f in _BOOT_FIELDS) - _BOOT_REQUIRED
_BOOT_STRINGS = tuple(f.name for f in _BOOT_FIELDS if f.type == "str")
"""The fields that are text, checked by name (the annotations, under postponed evaluation)."""
_BOOT_COUNTS = tuple(f.name for f in _BOOT_FIELDS if f.type == "int")
"""The fields that are integers >= 0."""


def read_boot(recv_into: Callable[[memoryview], int]) -> BootConfig:
    """Read the controller's ``boot`` frame (no tensors, no features) and check it.

    Raises:
        ContractError: a frame that is not a well-formed ``boot`` (``WireError``,
            ``HeaderMalformed`` naming ``boot.op``, ``InvalidValue`` naming ``boot.*``).

    """
    from edge_contracts.jsonvalues import thaw_json
    from edge_contracts.wire import read_frame

    frame = read_frame(recv_into, Limits(max_io_bytes=0, supported_features=frozenset()))
    if frame.header.op != OP_BOOT:
        raise HeaderMalformed("boot.op", frame.header.op, f"first frame must be {OP_BOOT!r}")
    return BootConfig.from_dict(thaw_json(frame.header.meta))  # type: ignore[arg-type]


def boot_frame(boot: BootConfig) -> FrameHeader:
    """The controller's first frame to a new worker: ``boot`` with the configuration."""
    return FrameHeader(OP_BOOT, "", "", 0, boot.generation, meta=boot.to_dict())


def process_create_time() -> float | None:
    """Return this process's creation time as psutil computes it on Linux, else None.

    For display only: it moves with steps of the wall clock (:mod:`edge_contracts.owners`).
    """
    from edge_contracts.owners import create_time_of

    return create_time_of(os.getpid())


def process_start_time() -> float | None:
    """Return this process's start time in seconds since boot (Linux ``/proc``), else None.

    ``/proc/self/stat`` field 22 over ``CLK_TCK``; the controller compares it with its own
    reading of the started process, which no step of the wall clock can make disagree.
    """
    from edge_contracts.owners import start_time_of

    return start_time_of(os.getpid())


def hello_meta(
    token: str,
    *,
    required: frozenset[str],
    offered: frozenset[str],
    versions: Mapping[str, str],
    shm_prefix: str | None,
) -> dict[str, Any]:
    """Build the ``meta`` of the worker's hello frame."""
    from edge_contracts import __version__

    return {
        "token": token,
        "pid": os.getpid(),
        "create_time": process_create_time(),
        "start_time": process_start_time(),
        "features": {"required": sorted(required), "offered": sorted(offered)},
        "versions": {
            "python": ".".join(map(str, sys.version_info[:3])),
            "edge_contracts": __version__,
            **{str(k): str(v) for k, v in versions.items()},
        },
        "shm_prefix": shm_prefix,
    }


_Pairs = list[tuple[str, int]]


def parse_ack(meta: Mapping[str, Any]) -> tuple[list[str], _Pairs, _Pairs]:
    """Check an ``ack`` frame's ``meta``; return ``(gone, segments, unlink)``.

    Raises:
        InvalidValue: naming ``ack.<key>[index]`` for anything but a list of names
            (``gone``) or of ``[segment, generation]`` pairs with an integer generation.

    """
    items = meta.view() if type(meta) is JSONObject else meta  # lookups in C
    gone = items.get("gone", ())
    if not isinstance(gone, tuple | list) or (
            gone and not all(isinstance(v, str) for v in gone)):
        raise InvalidValue("ack.gone", gone, "must be a list of segment names")
    unlink = items.get("unlink", ())
    return list(gone), _pairs(items.get("segments", ()), "ack.segments"), (
        _pairs(unlink, "ack.unlink") if unlink != () else [])


def _pairs(value: object, field: str) -> _Pairs:
    if not isinstance(value, tuple | list):
        raise InvalidValue(field, value, "must be a list of [segment, generation] pairs")
    pairs = []
    for index, item in enumerate(value):
        if (
            not isinstance(item, tuple | list)
            or len(item) != 2
            or not isinstance(item[0], str)
            or type(item[1]) is not int
        ):
            raise InvalidValue(f"{field}[{index}]", item, "must be [segment, generation]")
        pairs.append((item[0], item[1]))
    return pairs


def spin_meta(cap_us: int, follow_us: int | None = None) -> dict[str, Any]:
    """The ``meta`` of a ``spin`` frame: the most the worker may spin for its next frame.

    With ``follow_us`` (only to a worker that offered ``spin-follow``) also what it spins
    within that cap: the controller's choice, which the worker follows instead of
    measuring its own waits.
    """
    if follow_us is None:
        return {"cap_us": cap_us}
    return {"cap_us": cap_us, "follow_us": follow_us}


def parse_spin(meta: Mapping[str, Any]) -> tuple[int, int | None]:
    """Check a ``spin`` frame's ``meta``; return its cap and what to follow (µs; None: none).

    Raises:
        InvalidValue: naming ``spin.cap_us`` (or ``spin.follow_us``) when it is missing
            (``cap_us`` only) or not an integer in ``0..MAX_SPIN_US``, or ``spin`` for any
            other key.

    """
    items = meta.view() if type(meta) is JSONObject else meta
    unknown = sorted(set(items) - {"cap_us", "follow_us"})
    if unknown:
        raise InvalidValue("spin", unknown, "unknown keys")
    cap = items.get("cap_us")
    if type(cap) is not int or not 0 <= cap <= MAX_SPIN_US:
        raise InvalidValue("spin.cap_us", cap, f"must be an integer in 0..{MAX_SPIN_US}")
    if "follow_us" not in items:
        return cap, None
    follow = items["follow_us"]
    if type(follow) is not int or not 0 <= follow <= MAX_SPIN_US:
        raise InvalidValue("spin.follow_us", follow, f"must be an integer in 0..{MAX_SPIN_US}")
    return cap, follow

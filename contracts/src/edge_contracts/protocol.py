"""The worker channel's protocol constants: version, frame ops, features and negotiation.

Ops, controller to worker:
    ``boot``: the very first frame, written before the worker starts: ``meta`` is the
    :class:`~edge_contracts.worker_protocol.BootConfig` (token included), so the secret
    is never in the worker's environment or command line.
    ``load`` / ``warmup``: control calls, ``meta`` is a JSON config; answered by ``reply``.
    ``run`` / ``generate``: data requests, ``meta`` is the request params, tensors are the
    inputs; answered by ``event`` frames ending with a terminal one.
    ``cancel``: ``meta`` has ``target`` (one request id or null) and ``fence_epoch`` (every
    request of the frame's stage with an older epoch, or null); no answer.
    ``ack``: ``meta.segments`` lists ``[segment, generation]`` pairs of worker-produced
    shared memory the controller is done with (pooled for reuse); the optional
    ``meta.unlink`` lists pairs the controller still has views of: the worker unlinks
    them instead of reusing them. ``meta.gone`` (see below) may come alone. No answer.
    ``ping``: answered by ``reply`` (``in_flight``, ``pid`` and ``spin``: the worker's
    spin for its next frame). ``shutdown``: the worker closes its handler and exits.
    ``query``: a question to the loaded handler that takes no slot (``meta`` is the
    handler's own JSON question, e.g. a generate stage's "how many tokens is this
    prompt?"); answered by ``reply`` at once, between frames, like ``ping`` — never
    queued behind the requests waiting in the worker — with the handler's JSON answer,
    or an error when the handler has no ``query`` (see
    :meth:`edge_contracts.worker_handler.BaseHandler.query`).
    ``spin`` (only with the ``worker-spin`` feature): ``meta.cap_us`` is the most the
    worker may spin while it waits for its next frame (µs, 0: block at once), and with
    the ``spin-follow`` feature ``meta.follow_us``, when present, what it spins within
    that cap (it then measures nothing itself); checked by
    :func:`~edge_contracts.worker_protocol.parse_spin`; sent right after the hello,
    whenever the controller's core rule changes the cap and whenever the controller's
    own measuring or decision changes what the worker follows; no answer (see
    :mod:`edge_contracts.worker_spin`).

Ops, worker to controller:
    ``hello`` (first frame, see :func:`~edge_contracts.worker_protocol.hello_meta`; the
    serve loop adds ``sealed_segments``: true when its shared memory is sealed memfd
    segments passed over the descriptor channel of ``BootConfig.shm_fds``); ``heartbeat``
    (no meta, no answer: sent while the worker has work, when the ``heartbeat`` feature is
    in use; see :mod:`edge_contracts.worker_heartbeat`); ``event`` (``meta`` carries
    ``seq``, ``kind``, ``data``, ``error``, ``created_ns`` and, on a terminal event, ``acks``: the
    controller-produced segments of that request's inputs; with the ``event-fields``
    feature the first three travel in the binary header's event block and ``data``,
    ``error`` and ``acks`` appear only when set), ``reply``
    (``meta.ok`` plus ``result`` or ``error``).

Frames whose ``meta`` this protocol defines (``ack``, ``event``, ``reply``) may carry
``meta.gone``: shared-memory segments its sender has unlinked, so that the receiver can
drop its mappings. Data and control frames never do: their ``meta`` belongs to the stage
(request params, load config), so the controller sends the names in an ``ack`` frame
written just before the request.

Two peers agree on the features of a connection by :func:`negotiate`: every feature
the other side *requires* must be supported here, or the connection is refused with
:class:`~edge_contracts.errors.UnknownRequiredFeature`; features it merely *offers*
are used when supported and silently ignored otherwise.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from edge_contracts.errors import InvalidValue, UnknownRequiredFeature

__all__ = [
    "CONTROL_OPS",
    "DATA_OPS",
    "FEATURE_BFLOAT16",
    "FEATURE_BINARY_HEADER",
    "FEATURE_CANCEL",
    "FEATURE_EVENT_FIELDS",
    "FEATURE_HEARTBEAT",
    "FEATURE_SHM_TENSORS",
    "FEATURE_SPIN_FOLLOW",
    "FEATURE_STREAM_EVENTS",
    "FEATURE_WORKER_SPIN",
    "KNOWN_FEATURES",
    "OP_ACK",
    "OP_BOOT",
    "OP_CANCEL",
    "OP_EVENT",
    "OP_GENERATE",
    "OP_HEARTBEAT",
    "OP_HELLO",
    "OP_LOAD",
    "OP_PING",
    "OP_QUERY",
    "OP_REPLY",
    "OP_RUN",
    "OP_SHUTDOWN",
    "OP_SPIN",
    "OP_WARMUP",
    "PROTOCOL_VERSION",
    "negotiate",
    "validate_feature_name",
]

PROTOCOL_VERSION: int = 1
"""The wire protocol version this implementation speaks."""

OP_BOOT = "boot"
OP_HELLO = "hello"
OP_LOAD = "load"
OP_WARMUP = "warmup"
OP_RUN = "run"
OP_GENERATE = "generate"
OP_CANCEL = "cancel"
OP_ACK = "ack"
OP_PING = "ping"
OP_QUERY = "query"
OP_SHUTDOWN = "shutdown"
OP_EVENT = "event"
OP_REPLY = "reply"
OP_HEARTBEAT = "heartbeat"
OP_SPIN = "spin"

DATA_OPS = frozenset({OP_RUN, OP_GENERATE})
"""Ops that carry a stage request and are answered by events."""

CONTROL_OPS = frozenset({OP_LOAD, OP_WARMUP})
"""Ops that run in order with data ops and are answered by one reply."""

FEATURE_SHM_TENSORS = "shm-tensors"
"""Tensors may travel through shared memory (a header entry carries an ``ShmRef``)."""

FEATURE_STREAM_EVENTS = "stream-events"
"""A request may be answered by a stream of events rather than one reply."""

FEATURE_BFLOAT16 = "bfloat16"
"""Tensors of dtype ``bfloat16`` may appear."""

FEATURE_CANCEL = "cancel"
"""The peer understands cancel frames that fence an epoch."""

FEATURE_HEARTBEAT = "heartbeat"
"""The worker sends ``heartbeat`` frames while it has work, from a thread of its own."""

FEATURE_BINARY_HEADER = "binary-header"
"""Per-request frames (request, event, ack) may carry the fixed binary header
(:mod:`edge_contracts.binary_header`, prefix magic ``EDGB``) instead of JSON."""

FEATURE_EVENT_FIELDS = "event-fields"
"""An event's ``seq``, ``kind`` and ``created_ns`` travel in a fixed block of the binary
header, and its ``meta`` JSON holds only what is left (``data``, ``error``, ``acks``,
``gone``, each left out when empty); see :mod:`edge_contracts.binary_header`."""

FEATURE_WORKER_SPIN = "worker-spin"
"""The worker takes ``spin`` frames: the most it may spin for its next frame, within which
its own measured waits decide (:mod:`edge_contracts.worker_spin`)."""

FEATURE_SPIN_FOLLOW = "spin-follow"
"""The worker takes ``follow_us`` in ``spin`` frames: its spin for its next frame then
follows the controller's, which measures both ends blocking against both spinning
(:mod:`edge_contracts.worker_spin`)."""

KNOWN_FEATURES: frozenset[str] = frozenset(
    {
        FEATURE_SHM_TENSORS,
        FEATURE_STREAM_EVENTS,
        FEATURE_BFLOAT16,
        FEATURE_CANCEL,
        FEATURE_HEARTBEAT,
        FEATURE_BINARY_HEADER,
        FEATURE_EVENT_FIELDS,
        FEATURE_WORKER_SPIN,
        FEATURE_SPIN_FOLLOW,
    }
)
"""Every feature this implementation supports."""

_FEATURE_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{0,63}")


def validate_feature_name(name: object, field: str = "feature") -> str:
    """Return ``name`` if it is a valid feature name (``[a-z0-9][a-z0-9.-]*``, <= 64)."""
    if not isinstance(name, str) or _FEATURE_NAME.fullmatch(name) is None:
        raise InvalidValue(field, name, "must match [a-z0-9][a-z0-9.-]* and be <= 64 characters")
    return name


def negotiate(
    required: Iterable[str],
    offered: Iterable[str] = (),
    supported: frozenset[str] = KNOWN_FEATURES,
) -> frozenset[str]:
    """Return the features both peers will use.

    Args:
        required: features the peer cannot work without.
        offered: features the peer can use when this side supports them.
        supported: the features of this side.

    Returns:
        ``required`` plus the supported subset of ``offered``.

    Raises:
        UnknownRequiredFeature: naming every required feature not in ``supported``.
        InvalidValue: when a feature name is malformed.

    """
    needed = frozenset(
        validate_feature_name(name, "features.required") for name in _names(required)
    )
    extra = frozenset(validate_feature_name(name, "features.offered") for name in _names(offered))
    unknown = needed - supported
    if unknown:
        raise UnknownRequiredFeature(
            "features.required",
            sorted(unknown),
            f"not supported here (supported: {', '.join(sorted(supported)) or 'none'})",
        )
    return needed | (extra & supported)


def _names(values: Iterable[str]) -> Iterable[str]:
    if isinstance(values, str):
        raise InvalidValue("features", values, "must be a collection of names, not one string")
    if not isinstance(values, list | tuple | set | frozenset):  # e.g. a number from a peer
        raise InvalidValue("features", values, "must be a collection of names")
    return values

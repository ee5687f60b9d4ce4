"""The worker's hello as the controller verifies it: who it is and what it speaks.

A new worker's first frame must be a hello (:func:`edge_contracts.worker_protocol.hello_meta`)
carrying the token of its boot frame, the PID and start time of the process the
controller started, and the features it requires and offers; :func:`verify_hello` checks
each, refusing with :class:`~edge_core.host.errors.BootstrapRefused` naming the field,
and returns the features negotiated for the channel.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Any

from edge_contracts.errors import ContractError
from edge_contracts.protocol import OP_HELLO, negotiate
from edge_contracts.wire import Frame
from edge_core.host.errors import BootstrapRefused
from edge_core.host.identity import CREATE_TIME_TOLERANCE_S, ProcessIdentity

__all__ = ["verify_hello"]


def verify_hello(
    frame: Frame,
    token: str,
    root: ProcessIdentity,
    required: frozenset[str],
    supported: frozenset[str],
) -> frozenset[str]:
    """Check a new worker's first frame; the features in use on its channel.

    Args:
        frame: The first frame the worker wrote.
        token: The token the controller gave it in its boot frame.
        root: The process the controller started (its pid and start time).
        required: Features the controller cannot do without.
        supported: Features the controller supports.

    Raises:
        BootstrapRefused: naming ``hello.<field>``: not a hello, a wrong token (never
            shown), the worker's entry failed, another pid or start time, features that
            cannot be negotiated or a required one missing.
    """
    header = frame.header
    meta = header.meta
    if header.op != OP_HELLO:
        raise BootstrapRefused("hello.op", "first frame must be a hello", header.op)
    got = meta.get("token")
    if not isinstance(got, str) or not hmac.compare_digest(got.encode(), token.encode()):
        raise BootstrapRefused(
            "hello.token", "does not match the token given to the worker", "<redacted>"
        )
    error = meta.get("error")
    if error is not None:
        if isinstance(error, Mapping):
            error = {str(k): str(v)[:512] for k, v in list(error.items())[:8]}
        raise BootstrapRefused("hello.error", "worker entry failed", error)
    if meta.get("pid") != root.pid:
        raise BootstrapRefused(
            "hello.pid", f"must be the started process {root.pid}", meta.get("pid")
        )
    _verify_start(meta, root)
    features = meta.get("features")
    if not isinstance(features, Mapping):
        raise BootstrapRefused("hello.features", "must be an object", features)
    try:
        in_use = negotiate(features.get("required", ()), features.get("offered", ()), supported)
    except ContractError as exc:
        raise BootstrapRefused(f"hello.{exc.field}", exc.reason, exc.value) from None
    missing = sorted(required - in_use)
    if missing:
        raise BootstrapRefused("hello.features", "worker does not offer required features", missing)
    return in_use


def _verify_start(meta: Mapping[str, Any], root: ProcessIdentity) -> None:
    """The hello's start time (since boot) must be the started process's.

    A worker that reads no start time (no ``/proc``) sends None and is not checked; one
    that sends only ``create_time`` (an older worker) is checked by it as before, which a
    step of the wall clock between its reading and the controller's can make fail.
    """
    started = meta.get("start_time")
    if started is not None:
        if not isinstance(started, int | float) or not root.matches(float(started)):
            raise BootstrapRefused(
                "hello.start_time", f"must match the started process ({root.start_time})",
                started,
            )
        return
    created = meta.get("create_time")
    if created is not None and (
        not isinstance(created, int | float)
        or abs(float(created) - root.create_time) > CREATE_TIME_TOLERANCE_S
    ):
        raise BootstrapRefused(
            "hello.create_time", f"must match the started process ({root.create_time})", created
        )

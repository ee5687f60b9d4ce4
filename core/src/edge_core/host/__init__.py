"""The host layer: worker processes, their identity and retirement, and tensor transport.

Start a worker with :func:`start_worker` from a :class:`Route`; talk to it through the
returned :class:`WorkerClient`; retire it with :meth:`WorkerClient.retire`, which
reports a :class:`RetireOutcome`. See docs/host.md.
"""

from __future__ import annotations

from importlib import import_module

TYPE_CHECKING = False  # not typing's: a probe's light path imports no typing
if TYPE_CHECKING:
    from typing import Any

    from edge_core.host.bootstrap import DEFAULT_HELLO_TIMEOUT_S, DEFAULT_MAX_IO_BYTES, start_worker
    from edge_core.host.calls import Call, CallCancelled, Delivery
    from edge_core.host.client import WorkerClient
    from edge_core.host.devlock import DeviceLock
    from edge_core.host.errors import (
        BootstrapRefused,
        DeviceLockTimeout,
        ProtocolViolation,
        RemoteError,
        RouteRefused,
        TransportCapExceeded,
        WorkerGone,
    )
    from edge_core.host.health import Health
    from edge_core.host.identity import ProcessIdentity
    from edge_core.host.retire import DEFAULT_RETIRE_DEADLINE_S, ProcessTree, RetireOutcome
    from edge_core.host.routes import Route

_EXPORTS = {
    "BootstrapRefused": "edge_core.host.errors",
    "Call": "edge_core.host.calls",
    "CallCancelled": "edge_core.host.calls",
    "DEFAULT_HELLO_TIMEOUT_S": "edge_core.host.bootstrap",
    "DEFAULT_MAX_IO_BYTES": "edge_core.host.bootstrap",
    "DEFAULT_RETIRE_DEADLINE_S": "edge_core.host.retire",
    "Delivery": "edge_core.host.calls",
    "DeviceLock": "edge_core.host.devlock",
    "DeviceLockTimeout": "edge_core.host.errors",
    "Health": "edge_core.host.health",
    "ProcessIdentity": "edge_core.host.identity",
    "ProcessTree": "edge_core.host.retire",
    "ProtocolViolation": "edge_core.host.errors",
    "RemoteError": "edge_core.host.errors",
    "RetireOutcome": "edge_core.host.retire",
    "Route": "edge_core.host.routes",
    "RouteRefused": "edge_core.host.errors",
    "TransportCapExceeded": "edge_core.host.errors",
    "WorkerClient": "edge_core.host.client",
    "WorkerGone": "edge_core.host.errors",
    "start_worker": "edge_core.host.bootstrap",
}

__all__ = [
    "DEFAULT_HELLO_TIMEOUT_S",
    "DEFAULT_MAX_IO_BYTES",
    "DEFAULT_RETIRE_DEADLINE_S",
    "BootstrapRefused",
    "Call",
    "CallCancelled",
    "Delivery",
    "DeviceLock",
    "DeviceLockTimeout",
    "Health",
    "ProcessIdentity",
    "ProcessTree",
    "ProtocolViolation",
    "RemoteError",
    "RetireOutcome",
    "Route",
    "RouteRefused",
    "TransportCapExceeded",
    "WorkerClient",
    "WorkerGone",
    "start_worker",
]


def __getattr__(name: str) -> Any:
    """Import the exported names lazily.

    ``edge_core.host.routes`` alone then stays light (no numpy), which probes and option
    validation rely on.
    """
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'edge_core.host' has no attribute {name!r}")
    return getattr(import_module(module), name)

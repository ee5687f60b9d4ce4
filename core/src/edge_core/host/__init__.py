"""The host layer: worker processes, their identity and retirement, and tensor transport.

Start a worker with :func:`start_worker` from a :class:`Route`; talk to it through the
returned :class:`WorkerClient`; retire it with :meth:`WorkerClient.retire`, which
reports a :class:`RetireOutcome`. See docs/host.md.
"""

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

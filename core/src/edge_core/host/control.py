"""Control calls on a worker channel: ``load``, ``warmup``, ``ping``, each answered by a reply.

Kept apart from :mod:`edge_core.host.client` (which mixes :class:`ControlCalls` in): a
control call waits for one reply frame, bounded by ``timeout_s``; a late reply ends in
:class:`~edge_core.errors.DeadlineExceeded`, and a ping that is not answered in time in
:class:`~edge_core.host.errors.WorkerUnresponsive` — never the built-in ``TimeoutError``.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from edge_contracts.headers import FrameHeader
from edge_contracts.jsonvalues import thaw_json
from edge_contracts.worker_protocol import OP_LOAD, OP_PING, OP_WARMUP
from edge_core.errors import DeadlineExceeded
from edge_core.host.calls import Call
from edge_core.host.devlock import DEFAULT_LOCK_TIMEOUT_S, DeviceLock
from edge_core.host.errors import RemoteError, WorkerUnresponsive

if TYPE_CHECKING:
    from edge_core.host.identity import ProcessIdentity
    from edge_core.host.reading import ChannelReader

__all__ = ["ControlCalls"]


class ControlCalls:
    """The control-call half of a :class:`~edge_core.host.client.WorkerClient`."""

    generation: int
    identity: ProcessIdentity
    _lock: threading.Lock
    _replies: dict[str, Call]
    _control_ids: itertools.count[int]
    _reader: ChannelReader

    def _refuse_if_down(self) -> None:
        raise NotImplementedError

    def _send(self, header: FrameHeader) -> None:
        raise NotImplementedError

    def control(
        self, op: str, meta: Mapping[str, Any], *, timeout_s: float | None = None
    ) -> dict[str, Any]:
        """Send a control op (``load``, ``warmup``, ``ping``) and wait for its reply."""
        self._refuse_if_down()
        request_id = f"ctl-{next(self._control_ids)}"
        waiter = Call(request_id, "", 0, lambda _: None, self._reader.wait)
        with self._lock:
            self._replies[request_id] = waiter
        try:
            self._send(FrameHeader(op, request_id, "", 0, self.generation, meta=meta))
            delivery = waiter.next(timeout_s)
        except DeadlineExceeded:
            if op != OP_PING:
                raise
            raise WorkerUnresponsive(
                "worker.ping", f"no answer within {timeout_s} s", self.identity.pid
            ) from None
        finally:
            with self._lock:
                self._replies.pop(request_id, None)
        if delivery.error is not None:
            raise RemoteError(f"worker.{op}", delivery.error.type, delivery.error.message)
        return thaw_json(delivery.data)  # type: ignore[return-value,arg-type]

    def load(self, config: Mapping[str, Any], *, timeout_s: float | None = None) -> dict[str, Any]:
        """Ask the worker's handler to load; return its report."""
        return self.control(OP_LOAD, config, timeout_s=timeout_s)

    def warmup(
        self, config: Mapping[str, Any], *, timeout_s: float | None = None
    ) -> dict[str, Any]:
        """Ask the worker's handler to warm up; return its report (e.g. node -> provider)."""
        return self.control(OP_WARMUP, config, timeout_s=timeout_s)

    def initialise(
        self,
        load_config: Mapping[str, Any],
        warmup_config: Mapping[str, Any],
        *,
        device_id: str | None = None,
        lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
        timeout_s: float | None = None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Load then warm up, holding the device's initialisation lock across both.

        ``device_id`` is the physical identity of the device the worker initialises
        (None: no lock). Waiting for the lock is bounded by ``lock_timeout_s`` and ends
        in :class:`~edge_core.host.errors.DeviceLockTimeout` naming the holder's PID.
        """
        if device_id is None:
            return self.load(load_config, timeout_s=timeout_s), self.warmup(
                warmup_config, timeout_s=timeout_s
            )
        with DeviceLock(device_id, timeout_s=lock_timeout_s):
            loaded = self.load(load_config, timeout_s=timeout_s)
            return loaded, self.warmup(warmup_config, timeout_s=timeout_s)

    def ping(self, *, timeout_s: float = 5.0) -> dict[str, Any]:
        """Round-trip a ping through the worker's loop; return its answer.

        Raises :class:`WorkerUnresponsive` when no answer comes within ``timeout_s`` (the
        loop answers between requests: a ping behind a long graph call waits for it).
        """
        return self.control(OP_PING, {}, timeout_s=timeout_s)

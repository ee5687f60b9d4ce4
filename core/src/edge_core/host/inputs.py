"""Input buffers: arrays in the controller's shared memory that travel by reference.

A caller that produces a large input (an image batch, a 64 MiB tensor) asks for an
:meth:`InputBuffers.allocate` d array, fills it in place and passes *that array object*
as an input: the request then carries a reference to its segment instead of a copy.
Smaller arrays (below the channel's shared-memory threshold), or any array on a channel
without shared memory, are private arrays that travel as usual.

Ownership follows the rules of retained results:

* while a request that carries the buffer is in flight, the worker holds it: the array
  is read-only (a write raises), and sending it again raises :class:`InputBufferBusy`;
* the worker's terminal event acknowledges it: the array is writable again, and the
  next request that carries it stamps a new generation on the segment, so a reference
  to the old one is refused as stale;
* the segment stays the buffer's for as long as the array lives: it is given back to
  the producer's pool when the array is collected (or, if a request still holds it
  then, when that request is acknowledged). A cancelled request is acknowledged by the
  worker like any other; a dead worker's channel is closed and every segment this
  controller produced is unlinked at retirement, so nothing is left after a crash.

Views made of the array before it was sent stay writable: write only through the array
until the request has ended.

A claim names its claimant (the request's :class:`~edge_core.host.calls.Call`), recorded
with the buffer's busy mark in one run of statements without a call (where a
``KeyboardInterrupt`` cannot act): a request cut short by a Ctrl-C before it was
registered, even as the claim returned, undoes what it claimed with :meth:`InputBuffers.
unclaim` without knowing it. A claim cut short itself, after the producer stamped the new
generation on the segment, takes that generation as the buffer's before the interrupt
goes on: the buffer is sent by reference again, and given back to the pool when
collected.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from edge_contracts.shm import Lease, SegmentProducer
from edge_contracts.worker_transport import Packed, TensorPacker
from edge_core.host.errors import InputBufferBusy

__all__ = ["InputBuffers"]

_NO_VIEW = memoryview(b"")


class _Buffer:
    """What is known of one buffer: its lease and whether a request holds it."""

    __slots__ = ("array", "busy", "claimant", "collected", "lease")

    def __init__(self, array: np.ndarray[Any, Any], lease: Lease) -> None:
        self.array = weakref.ref(array)
        self.lease = replace(lease, view=_NO_VIEW)  # only the array keeps the mapping
        self.busy = False
        self.claimant: object = None  # whose claim made it busy (see unclaim)
        self.collected = False


def _busy(name: str, buffer: _Buffer) -> InputBufferBusy:
    return InputBufferBusy(
        f"inputs.{name}", "still held by the worker (request in flight)", buffer.lease.segment
    )


class InputBuffers:
    """The input buffers of one worker channel (see the module docstring). Thread-safe.

    Attributes:
        by_id: ``id(array)`` → each buffer alive (read it, never change it); empty while
            the channel has none, which a request's usual path reads without the lock.
    """

    def __init__(self, packer: TensorPacker) -> None:
        self._packer = packer
        self._lock = threading.Lock()
        self.by_id: dict[int, _Buffer] = {}
        self._by_segment: dict[str, _Buffer] = {}
        self._sent = 0

    def allocate(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray[Any, Any]:
        """Return a writable array of ``shape`` and ``dtype`` to fill and send as an input.

        Raises:
            ShmCapExceeded: never; at the producer's cap the array is private memory.
            TypeError, ValueError: numpy's, for a dtype or shape it cannot make.

        """
        array, lease = self._packer.allocate(tuple(shape), dtype)
        if lease is None:
            return array
        buffer = _Buffer(array, lease)
        with self._lock:
            self.by_id[id(array)] = buffer
            self._by_segment[lease.segment] = buffer
        weakref.finalize(array, self._collected, id(array), buffer)
        return array

    @property
    def held(self) -> int:
        """Number of buffers alive or still held by a request."""
        with self._lock:
            return len(self._by_segment)

    @property
    def sent(self) -> int:
        """Number of times a buffer was sent by reference (a claim stamped a generation)."""
        return self._sent

    def owns(self, value: Any) -> bool:
        """True when ``value`` is the very array of one of these buffers (not a view of it)."""
        buffer = self.by_id.get(id(value))
        return buffer is not None and buffer.array() is value

    def check(self, inputs: Any) -> None:
        """Raise :class:`InputBufferBusy` when a buffer among ``inputs`` is held by a request."""
        if not inputs or not self.by_id:
            return
        by_id = self.by_id
        with self._lock:  # a loop, not a generator: no call per input
            for name, value in inputs.items():
                buffer = by_id.get(id(value))
                if buffer is not None and buffer.busy and buffer.array() is value:
                    raise _busy(name, buffer)

    def claim(self, inputs: Any, claimant: object = None) -> dict[int, tuple[Any, Lease]]:
        """Mark the buffers among ``inputs`` as sent; return them for the packer.

        Each gets a fresh generation (on its second and later sends) and turns
        read-only, claimed by ``claimant`` (see :meth:`unclaim`). Raises
        :class:`InputBufferBusy` (claiming nothing) when one is still held by a request.
        """
        if not inputs or not self.by_id:
            return {}
        claimed: dict[int, tuple[Any, Lease]] = {}
        by_id = self.by_id
        with self._lock:
            found: list[tuple[np.ndarray[Any, Any], _Buffer]] = []
            for name, value in inputs.items():
                buffer = by_id.get(id(value))
                if buffer is None:
                    continue
                held = buffer.array()
                if held is not None and held is value:
                    if buffer.busy:  # before any is renewed: a refusal claims nothing
                        raise _busy(name, buffer)
                    found.append((held, buffer))
            producer = self._packer.producer
            for array, buffer in found:
                if producer is None:  # pragma: no cover - a buffer's packer has one
                    continue
                lease = self._renewed(producer, buffer)
                if lease is None:  # the producer was closed: the worker is gone
                    continue
                buffer.claimant = claimant  # with its mark: no call between (see unclaim)
                buffer.busy = True
                self._sent += 1
                array.flags.writeable = False
                claimed[id(array)] = (array, lease)
        return claimed

    def claim_lone(self, name: str, value: Any, claimant: object = None) -> Lease | None:
        """:meth:`claim` for a request's lone input: its buffer's new lease, else None.

        None when ``value`` is not one of these buffers (nothing claimed). Raises
        :class:`InputBufferBusy` when it is one still held by a request. The claim is
        recorded as :meth:`claim` records it; :meth:`unsent` with
        ``{id(value): (value, lease)}`` undoes it (or :meth:`unclaim` by ``claimant``).
        """
        buffer = self.by_id.get(id(value))
        if buffer is None:
            return None
        with self._lock:
            held = buffer.array()
            if held is None or held is not value or self.by_id.get(id(value)) is not buffer:
                return None
            if buffer.busy:
                raise _busy(name, buffer)
            producer = self._packer.producer
            if producer is None:  # pragma: no cover - a buffer's packer has one
                return None
            lease = self._renewed(producer, buffer)
            if lease is None:  # the producer was closed: the worker is gone
                return None
            buffer.claimant = claimant  # with its mark: no call between (see unclaim)
            buffer.busy = True
            self._sent += 1
            held.flags.writeable = False
        return lease

    def _renewed(self, producer: SegmentProducer, buffer: _Buffer) -> Lease | None:
        """Stamp a new generation on ``buffer``'s segment (under the lock); its new lease.

        None when the producer was closed. Cut short (a Ctrl-C) after the producer
        stamped it, the buffer's lease takes that generation before the interrupt goes
        on: the buffer's lease and the producer's stay one.
        """
        lease = buffer.lease
        try:
            generation = producer.renew(lease.segment, lease.generation)
            if generation is None:
                return None
            lease = buffer.lease = Lease(lease.segment, generation, lease.offset, _NO_VIEW)
        except BaseException:
            stamped = producer.leased_generation(lease.segment)
            if stamped is not None and stamped != buffer.lease.generation:
                buffer.lease = Lease(lease.segment, stamped, lease.offset, _NO_VIEW)
            raise
        return lease

    def unclaim(self, inputs: Any, claimant: object) -> None:
        """Undo the claims of ``claimant`` among ``inputs`` that are still held.

        For a request that was not sent, whatever its sender knows of its claims: one
        cut short by a ``KeyboardInterrupt`` (even as :meth:`claim` returned) calls it
        on its way out. A buffer claimed since by another request, or acknowledged, is
        left as it is.
        """
        if not self.by_id or not isinstance(inputs, Mapping):
            return
        undone: list[np.ndarray[Any, Any]] = []
        with self._lock:
            for value in inputs.values():
                buffer = self.by_id.get(id(value))
                if buffer is None or not buffer.busy or buffer.claimant is not claimant:
                    continue
                held = buffer.array()
                if held is not None and held is value:
                    buffer.busy = False
                    buffer.claimant = None
                    self._sent -= 1
                    undone.append(held)
        for array in undone:
            array.flags.writeable = True

    def pack_claimed(self, inputs: Any, claimed: dict[int, tuple[Any, Lease]]) -> Packed:
        """Pack ``inputs`` whose buffers among them were claimed already (``claimed``).

        Raises what the packer raises; the claim is the caller's to undo then.
        """
        return self._packer.pack(inputs, dict(claimed))

    def pack(self, inputs: Any,
             claimant: object = None) -> tuple[Packed, dict[int, tuple[Any, Lease]]]:
        """Pack ``inputs`` for a request; return the frame parts and the claimed buffers.

        Buffers go by reference (:meth:`claim`, by ``claimant``), the rest as the
        packer does.
        """
        if not self.by_id:  # no input buffer alive on this channel: nothing to claim
            return self._packer.pack(inputs), {}
        claimed = self.claim(inputs, claimant)
        try:
            return self._packer.pack(inputs, dict(claimed)), claimed
        except BaseException:
            self.unsent(claimed)
            raise

    def take_back(
        self, leases: list[tuple[str, int]], claimed: dict[int, tuple[Any, Lease]]
    ) -> None:
        """Give back the leases of a request that was not sent; buffers stay their own."""
        with self._lock:
            others = [lease for lease in leases if lease[0] not in self._by_segment]
        self._packer.take_back(others)
        self.unsent(claimed)

    def unsent(self, claimed: dict[int, tuple[Any, Lease]]) -> None:
        """Undo :meth:`claim` for a request that was not sent."""
        for value, lease in claimed.values():
            self.acknowledged(lease.segment, lease.generation)
            value.flags.writeable = True
        if claimed:
            with self._lock:
                self._sent -= len(claimed)

    def acknowledged(self, segment: str, generation: int) -> bool:
        """Handle the worker's acknowledgement of an input; False if not a buffer's.

        The buffer is free again (writable); a buffer whose array was collected while
        the worker held it goes back to the producer's pool now. Handled again (its frame
        delivered again after a Ctrl-C cut the first handling short), it makes the buffer
        writable, if the first did not get that far, and nothing more.
        """
        with self._lock:
            buffer = self._by_segment.get(segment)
            if buffer is None:
                return False
            if buffer.lease.generation != generation:
                return True  # stale: the buffer was sent again since
            buffer.busy = False  # (not busy: handled again; a buffer not busy is writable)
            buffer.claimant = None
            array = buffer.array()
            if buffer.collected:
                del self._by_segment[segment]
        if array is not None:
            array.flags.writeable = True
        if buffer.collected:
            self._release(buffer)
        return True

    def _collected(self, key: int, buffer: _Buffer) -> None:
        with self._lock:
            if self.by_id.get(key) is buffer:
                del self.by_id[key]
            buffer.collected = True
            if buffer.busy:  # the request's acknowledgement gives it back
                return
            self._by_segment.pop(buffer.lease.segment, None)
        self._release(buffer)

    def _release(self, buffer: _Buffer) -> None:
        producer = self._packer.producer
        if producer is not None:
            producer.release(buffer.lease.segment, buffer.lease.generation)

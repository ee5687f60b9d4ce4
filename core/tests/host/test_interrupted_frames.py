"""Ctrl-C as replies that arrive together are read and delivered: none lost, none twice.

Two replies in the socket before anyone reads it are taken by one receive: that is not
the usual reply (one frame alone in its receive), so the client reads them through its
frame reader (``FrameReader.read_into``) into its frames read and not yet delivered, and
delivers the first. The main thread's wait for one of them (the first in the receive, or
the second: the main thread then delivers the other call's reply first) is interrupted
at each point where CPython can act on a signal, in turn, as
``core/tests/runtime/test_interrupted_calls.py`` does (see its module docstring), on a
real echo worker. After each: both calls have their end queued exactly once, with their
own outputs (the main thread's own may have been taken out of its queue by the
interrupted wait itself: it then has nothing queued, and is never queued twice), the
client holds no frame undelivered and owes nothing, and the next call completes.

A zero-copy reply alone in its receive (a DONE whose output is in shared memory) is
delivered by the client without the frame reader, its receive still counted as taken:
:func:`test_ctrl_c_as_a_zero_copy_reply_is_delivered_loses_nothing` interrupts the main
thread's wait for one at each point in the same way.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import numpy as np
import pytest

from edge_contracts.requests import EventKind, Operation, StageRequest
from edge_contracts.wire import PREFIX
from edge_core.host import WorkerClient
from edge_core.host.calls import Call
from edge_core.host.reading import HANDOVER
from edge_core.testing.interrupts import Interrupter, run_interrupted, until

from .conftest import request

BOUND_S = 3.0  # the bound on what must complete after an interrupt


def _whole_frames(client: WorkerClient) -> int:
    """How many whole frames wait in the client's socket (peeked: nothing is taken)."""
    try:
        data = client._sock.recv(1 << 16, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return 0
    count = at = 0
    while at + PREFIX.size <= len(data):
        _, header_len, payload_len = PREFIX.unpack_from(data, at)
        at += PREFIX.size + header_len + payload_len
        if at > len(data):
            break
        count += 1
    return count


def _nothing_queued(call: Call) -> bool:
    """No delivery waits in ``call``'s queue (a reader's handover marker is none: one left
    by an interrupted wait is taken as any is, by the next wait)."""
    items = []
    while not call._queue.empty():
        items.append(call._queue.get_nowait())
    for item in items:  # put back, in order
        call._queue.put(item)
    return all(item is HANDOVER for item in items)


def _ended_once(call: Call, x: np.ndarray, mine: bool) -> str:
    """'' when ``call``'s end was queued once, with ``x`` echoed; else what is wrong."""
    if not until(lambda: call.last_seq >= 0, BOUND_S):
        return f"{call.request_id}: its end was never delivered"
    if call.ended or (mine and _nothing_queued(call)):  # taken (by the interrupted wait)
        return "" if _nothing_queued(call) else f"{call.request_id}: delivered twice"
    try:
        delivery = call.next(timeout=BOUND_S)
    except Exception as exc:
        return f"{call.request_id}: {type(exc).__name__}: {exc}"
    if delivery.kind is not EventKind.DONE or not np.array_equal(delivery.arrays["x"], x):
        return f"{call.request_id}: ended {delivery.kind} with {delivery.arrays}"
    return "" if _nothing_queued(call) else f"{call.request_id}: delivered twice"


def _together(client: WorkerClient, n: int, tracer: Interrupter,
              mine_first: bool) -> tuple[bool, str]:
    """Two replies read by one receive of the main thread's wait under ``tracer``."""
    reader = client._reader
    xs = (np.arange(3.0) + n, np.arange(3.0) - n)
    reader._role.acquire()  # nobody reads: both replies wait in the socket
    try:
        calls = [client.submit(request(f"{name}{n}"), {"x": x})
                 for name, x in zip("ab", xs, strict=True)]
        assert until(lambda: _whole_frames(client) >= 2, BOUND_S)
        reader._last_active = time.monotonic()  # the background reader stays aside
    finally:
        reader._role.release()
    mine = 0 if mine_first else 1
    got: list[object] = []
    interrupted = run_interrupted(tracer, lambda: got.append(calls[mine].next(timeout=BOUND_S)))
    ends = (_ended_once(call, x, index == mine)
            for index, (call, x) in enumerate(zip(calls, xs, strict=True)))
    left = [what for what in ends if what]
    if got and getattr(got[0], "kind", None) is not EventKind.DONE:
        left.append(f"the wait returned {got[0]}")
    if not until(lambda: not client._pending and client.outstanding() == 0, BOUND_S):
        left.append(f"{len(client._pending)} frame(s) undelivered, "
                    f"{client.outstanding()} call(s) owed")
    try:
        client.submit(request(f"n{n}"), {"x": xs[0]}).result(timeout=BOUND_S)
    except Exception as exc:
        left.append(f"the next call failed: {type(exc).__name__}: {exc}")
    return interrupted, ", ".join(left)


@pytest.mark.slow
@pytest.mark.parametrize("mine_first", [True, False], ids=["own-first", "other-first"])
def test_ctrl_c_as_replies_that_arrive_together_are_read_loses_none(
        start: Callable[..., WorkerClient], mine_first: bool) -> None:
    client = start()
    for n in range(5):  # warm: the usual reply's template kept, the reader's steps taken
        client.submit(request(f"w{n}"), {"x": np.arange(3.0)}).result(timeout=BOUND_S)
    counter = Interrupter(0)
    read = Interrupter(0, frozenset({"FrameReader.read_into", "FrameReader.read"}))
    assert not _together(client, 0, counter, mine_first)[0]
    assert not _together(client, 0, read, mine_first)[0]
    assert read.points > 0  # the main thread read both replies through the frame reader
    windows = []
    for k in range(1, counter.points + 1):
        tracer = Interrupter(k)
        interrupted, left = _together(client, k, tracer, mine_first)
        if left:
            # the first window found ends the sweep (the channel may be torn by it)
            windows.append(f"{tracer.where if interrupted else 'completed'}: {left}")
            break
    assert counter.points > 100
    assert windows == [], "\n".join(windows)


ZERO_COPY_SHAPE = (64, 64)  # float32: 16 KiB, over the threshold below
ZERO_COPY_THRESHOLD = 4096


def _zero_copy(client: WorkerClient, n: int, tracer: Interrupter) -> tuple[bool, str]:
    """One zero-copy reply waited for by the main thread under ``tracer``."""
    x = np.full(ZERO_COPY_SHAPE, float(n % 1000), dtype=np.float32)
    call = client.submit(StageRequest(f"z{n}", "s0", 0, client.generation, Operation.RUN),
                         {"x": x})
    got: list[object] = []
    interrupted = run_interrupted(tracer, lambda: got.append(call.next(timeout=BOUND_S)))
    left = []
    if not until(lambda: call.last_seq >= 0, BOUND_S):
        left.append("its end was never delivered")
    elif call.ended or (interrupted and _nothing_queued(call)):  # (taken by the wait)
        if not _nothing_queued(call):
            left.append("delivered twice")
    else:
        got.append(call.next(timeout=BOUND_S))
        if not _nothing_queued(call):
            left.append("delivered twice")
    for delivery in got:
        y = delivery.arrays["y"]  # type: ignore[attr-defined]
        if float(y.flat[0]) != float(n % 1000):
            left.append(f"ended with {float(y.flat[0])}")
        del y
        delivery.release()  # type: ignore[attr-defined]
    if not until(lambda: not client._pending and client.outstanding() == 0, BOUND_S):
        left.append(f"{len(client._pending)} frame(s) undelivered, "
                    f"{client.outstanding()} call(s) owed")
    try:
        with client.submit(StageRequest(f"m{n}", "s0", 0, client.generation, Operation.RUN),
                           {"x": x}).next(timeout=BOUND_S):
            pass
    except Exception as exc:
        left.append(f"the next call failed: {type(exc).__name__}: {exc}")
    return interrupted, ", ".join(left)


@pytest.mark.slow
def test_ctrl_c_as_a_zero_copy_reply_is_delivered_loses_nothing(
        start: Callable[..., WorkerClient]) -> None:
    client = start("counting_in_place", spin_us=0, shm_threshold=ZERO_COPY_THRESHOLD)
    for n in range(5):  # warm: the DONE's header kept, later ones built from it
        assert not _zero_copy(client, n, Interrupter(0))[1]
    counter = Interrupter(0)
    assert not _zero_copy(client, 0, counter)[0]
    windows = []
    for k in range(1, counter.points + 1):
        tracer = Interrupter(k)
        interrupted, left = _zero_copy(client, k, tracer)
        if left:  # the first window found ends the sweep
            windows.append(f"{tracer.where if interrupted else 'completed'}: {left}")
            break
    assert counter.points > 100
    assert windows == [], "\n".join(windows)


def _zero_copy_together(client: WorkerClient, n: int) -> tuple[Call, Call, np.ndarray]:
    """Two zero-copy replies (``b``'s first, then ``a``'s) waiting together in the socket."""
    reader = client._reader
    x = np.full(ZERO_COPY_SHAPE, float(n), dtype=np.float32)
    reader._role.acquire()  # nobody reads: both replies wait in the socket
    try:
        b = client.submit(StageRequest(f"b{n}", "s0", 0, client.generation, Operation.RUN),
                          {"x": x + 1})
        a = client.submit(StageRequest(f"a{n}", "s0", 0, client.generation, Operation.RUN),
                          {"x": x})
        assert until(lambda: _whole_frames(client) >= 2, BOUND_S)
        reader._last_active = time.monotonic()  # the background reader stays aside
    finally:
        reader._role.release()
    return a, b, x


@pytest.mark.slow
def test_a_frame_delivered_before_a_ctrl_c_is_not_read_again_after_its_memory_went_back(
        start: Callable[..., WorkerClient]) -> None:
    """Review40b: the main thread, waiting for ``a``, delivers ``b``'s zero-copy reply
    (read with ``a``'s by one receive) and is interrupted before that frame leaves the
    frames undelivered. ``b``'s thread takes it and gives its memory back, the worker
    reuses that segment for the next answer; the next reader then finishes ``b``'s frame.
    It read the frame's shared memory again, now another generation's: the channel was
    failed (``ProtocolViolation``: stale) for every call."""
    client = start("counting_in_place", spin_us=0, shm_threshold=ZERO_COPY_THRESHOLD)
    for n in range(3):
        with client.submit(StageRequest(f"w{n}", "s0", 0, client.generation, Operation.RUN),
                           {"x": np.zeros(ZERO_COPY_SHAPE, np.float32)}).next(timeout=BOUND_S):
            pass
    a, b, x = _zero_copy_together(client, 7)
    tracer = Interrupter(1, frozenset({"FrameReader.has_buffered"}))  # after b's delivery
    got: list[object] = []
    assert run_interrupted(tracer, lambda: got.append(a.next(timeout=BOUND_S))), tracer.points
    assert client._pending and client._head_call is b  # b's frame: delivered, not yet out
    with b.next(timeout=BOUND_S) as first:  # b's thread: its reply, its memory given back
        assert float(first.arrays["y"].flat[0]) == float(x.flat[0] + 1)
    reader = client._reader
    reader._role.acquire()  # nobody reads until the worker has answered d
    try:
        d = client.submit(StageRequest("d", "s0", 0, client.generation, Operation.RUN),
                          {"x": x})
        assert until(lambda: _whole_frames(client) >= 1, BOUND_S)  # in b's segment, reused
        reader._last_active = time.monotonic()
    finally:
        reader._role.release()
    with d.next(timeout=BOUND_S) as reply:  # (the next read finishes b's frame first)
        assert float(reply.arrays["y"].flat[0]) == float(x.flat[0])
    with a.next(timeout=BOUND_S) as mine:
        assert float(mine.arrays["y"].flat[0]) == float(x.flat[0])
    assert b._queue.empty() and not client._pending and client._head_call is None
    assert client.health().state == "ready", client.health()


@pytest.mark.slow
def test_a_token_delivered_before_a_ctrl_c_is_not_queued_again_after_a_cancel(
        start: Callable[..., WorkerClient]) -> None:
    """Review40b: a stream's token queued, its reading interrupted before the frame left
    the frames undelivered; the stream is then cancelled (as a stream closed after a
    Ctrl-C is). The next read finished the token's frame: the CANCELLED had moved the
    call's last seq, so the token was queued a second time, behind the CANCELLED."""
    client = start("stream")
    for n in range(2):
        list(client.submit(StageRequest(f"w{n}", "s0", 0, client.generation, Operation.RUN,
                                        params={"tokens": 2}), {}))
    stream = client.submit(StageRequest("s", "s0", 0, client.generation, Operation.RUN,
                                        params={"tokens": 3, "delay_s": 0.2}), {})
    tracer = Interrupter(2, frozenset({"Call.deliver"}))  # right after its put
    got: list[object] = []
    assert run_interrupted(tracer, lambda: got.append(stream.next(timeout=BOUND_S)))
    assert client._head_call is stream
    stream.cancel()
    after = client.submit(StageRequest("t", "s0", 0, client.generation, Operation.RUN,
                                       params={"tokens": 1}), {})
    assert [d.kind for d in after] == [EventKind.TOKEN, EventKind.DONE]  # (a read: see above)
    queued = []
    while not stream._queue.empty():
        item = stream._queue.get_nowait()
        queued.append((item.kind, item.seq) if hasattr(item, "kind") else item)
    taken = [(d.kind, d.seq) for d in got if hasattr(d, "kind")]  # type: ignore[attr-defined]
    assert taken + [q for q in queued if isinstance(q, tuple)] in (
        [(EventKind.TOKEN, 0), (EventKind.CANCELLED, 1)],), (taken, queued)

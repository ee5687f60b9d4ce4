"""Ctrl-C in a channel's registered wait and in a cancel: nothing left listed or owed.

A ``KeyboardInterrupt`` (Ctrl-C in the main thread) is raised from a ``sys.settrace``
tracer at each point of one call where CPython can act on a signal, in turn, as
``core/tests/runtime/test_interrupted_calls.py`` does (see its module docstring): every
function's start and the first instruction after every ``CALL``, ``CALL_FUNCTION_EX`` and
backward jump, in the functions named (the tracer is the main thread's alone; the other
threads run untraced). On a real echo worker:

* :func:`test_ctrl_c_in_a_registered_wait_leaves_no_waiter_behind`: the main thread
  waits for a call while another thread holds the read role (it registers as a follower,
  takes the role over when that thread's reply comes, and leads while a third thread
  follows). After the interrupt the other threads' calls complete, the channel lists no
  waiter (a listed one keeps the background reader aside for good), a reply nobody waits
  for is read, and the main thread's next call completes.
* :func:`test_ctrl_c_as_a_leading_wait_ends_leaves_its_followers_the_role`: the main
  thread leads unregistered (it found the role free: the usual wait) while another thread
  registers behind it; after the interrupt the follower's call ends (it is handed the
  role), nothing stays listed, and the main thread's next call completes.
* :func:`test_ctrl_c_in_a_cancel_leaves_nothing_owed`: the main thread cancels a call in
  flight; the tracer lets the worker's own end of it be heard before it raises, where the
  call is owed by then. After the worker answered, the client owes nothing (its liveness
  count is 0), the cancelled call has its end, and the next call completes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import numpy as np
import pytest

from edge_contracts.requests import EventKind
from edge_core.host import WorkerClient
from edge_core.testing.interrupts import Interrupter, run_interrupted, until

from .conftest import request

#: The functions of a channel's wait whose points are swept (the reader's own steps).
READER = frozenset({"ChannelReader.wait", "ChannelReader._leave", "ChannelReader._drop_role",
                    "ChannelReader._give_up"})
SLOW_S = 0.05  # each request's time in the worker (one at a time there)
BOUND_S = 3.0  # the bound on what must complete after an interrupt


def _owner(client: WorkerClient) -> str:
    """The read role's lock as its repr shows it (its owner's thread id), taking nothing."""
    return repr(client._reader._role)


def _read_unwaited(client: WorkerClient, rid: str) -> bool:
    """A request nobody waits for has its end read (by the background reader)."""
    client.submit(request(rid), {"x": np.arange(2.0)})
    return until(lambda: not client.in_flight(rid), BOUND_S)


def _registered_wait(client: WorkerClient, n: int, tracer: Interrupter) -> tuple[bool, str]:
    """One registered wait of the main thread under ``tracer``: (interrupted, what is left)."""
    reader = client._reader
    x = np.arange(2.0)
    first = client.submit(request(f"a{n}", sleep_s=SLOW_S), {"x": x})
    mine = client.submit(request(f"b{n}", sleep_s=SLOW_S), {"x": x})
    third = client.submit(request(f"c{n}", sleep_s=SLOW_S), {"x": x})
    ends: dict[str, Any] = {}
    main = threading.get_ident()
    out = threading.Event()

    def leader() -> None:  # holds the role as the main thread starts waiting
        try:
            ends["a"] = first.next(timeout=BOUND_S).kind
        except Exception as exc:  # reported by the main thread
            ends["a"] = exc

    def follower() -> None:  # waits behind the main thread once it leads (or left)
        until(lambda: out.is_set() or f"owner={main} " in _owner(client), BOUND_S)
        try:
            ends["c"] = third.next(timeout=BOUND_S).kind
        except Exception as exc:  # reported by the main thread
            ends["c"] = exc

    def hold(frame: FrameType) -> None:  # the main thread leads: the follower registers
        if reader._waiting and f"owner={main} " in _owner(client):  # (no f_locals: a
            until(lambda: len(reader._waiting) >= 2, 1.0)  # tracer's read writes them back)

    tracer.before = hold
    threads = [threading.Thread(target=leader), threading.Thread(target=follower)]
    threads[0].start()
    assert until(lambda: f"owner={threads[0].ident} " in _owner(client), BOUND_S)
    threads[1].start()
    try:
        interrupted = run_interrupted(tracer, lambda: mine.next(timeout=BOUND_S))
    finally:
        out.set()
        for thread in threads:
            thread.join(2 * BOUND_S)
    left = []
    if ends != {"a": EventKind.DONE, "c": EventKind.DONE}:
        left.append(f"the other threads' calls ended {ends}")
    if not until(lambda: not reader._waiting, 1.0):
        left.append(f"{len(reader._waiting)} waiter(s) listed")
    if not _read_unwaited(client, f"u{n}"):
        left.append("a reply nobody waits for was not read")
    try:
        client.submit(request(f"n{n}"), {"x": x}).result(timeout=BOUND_S)
    except Exception as exc:
        left.append(f"the next call failed: {type(exc).__name__}: {exc}")
    return interrupted, ", ".join(left)


@pytest.mark.slow
def test_ctrl_c_in_a_registered_wait_leaves_no_waiter_behind(
        start: Callable[..., WorkerClient]) -> None:
    client = start(spin_us=0)
    counter = Interrupter(0, READER)
    assert not _registered_wait(client, 0, counter)[0]
    assert counter.points > 20, counter.points
    k = 0
    while True:  # every point, to the first the wait no longer reaches (it varies a little)
        k += 1
        tracer = Interrupter(k, READER)
        interrupted, left = _registered_wait(client, k, tracer)
        assert not left, f"interrupted at {tracer.where}: {left}"
        if not interrupted:
            break
    assert k > 20
    assert client.outstanding() == 0


def _leading_wait(client: WorkerClient, n: int, tracer: Interrupter) -> tuple[bool, str]:
    """The main thread leading unregistered (the usual wait), a thread following it."""
    reader = client._reader
    x = np.arange(2.0)
    mine = client.submit(request(f"m{n}", sleep_s=SLOW_S), {"x": x})
    other = client.submit(request(f"o{n}", sleep_s=SLOW_S), {"x": x})
    ends: dict[str, Any] = {}
    main = threading.get_ident()
    out = threading.Event()

    def follower() -> None:  # registers behind the main thread once it leads
        until(lambda: out.is_set() or f"owner={main} " in _owner(client), BOUND_S)
        try:
            ends["o"] = other.next(timeout=BOUND_S).kind
        except Exception as exc:  # reported by the main thread
            ends["o"] = exc

    def hold(frame: FrameType) -> None:  # the main thread leads: the follower registers
        if f"owner={main} " in _owner(client) and not out.is_set():
            until(lambda: len(reader._waiting) >= 1, 1.0)

    tracer.before = hold
    thread = threading.Thread(target=follower)
    thread.start()
    try:
        interrupted = run_interrupted(tracer, lambda: mine.next(timeout=BOUND_S))
    finally:
        out.set()
        thread.join(2 * BOUND_S)
    left = []
    if ends != {"o": EventKind.DONE}:
        left.append(f"the follower's call ended {ends}")
    if not until(lambda: not reader._waiting, 1.0):
        left.append(f"{len(reader._waiting)} waiter(s) listed")
    if not _read_unwaited(client, f"u{n}"):
        left.append("a reply nobody waits for was not read")
    try:
        client.submit(request(f"n{n}"), {"x": x}).result(timeout=BOUND_S)
    except Exception as exc:
        left.append(f"the next call failed: {type(exc).__name__}: {exc}")
    return interrupted, ", ".join(left)


@pytest.mark.slow
def test_ctrl_c_as_a_leading_wait_ends_leaves_its_followers_the_role(
        start: Callable[..., WorkerClient]) -> None:
    """The caller that found the role free (the usual wait), a thread registered behind it.

    Interrupted at each point, up to and past its release of the role: the follower is
    handed the role (or finds it free) and its call ends; nothing stays listed.
    """
    client = start(spin_us=0)
    counter = Interrupter(0, READER)
    assert not _leading_wait(client, 0, counter)[0]
    assert counter.points > 8, counter.points
    k = 0
    while True:  # every point, to the first the wait no longer reaches
        k += 1
        tracer = Interrupter(k, READER)
        interrupted, left = _leading_wait(client, k, tracer)
        assert not left, f"interrupted at {tracer.where}: {left}"
        if not interrupted:
            break
    assert k > 8
    assert client.outstanding() == 0


def _cancel(client: WorkerClient, n: int, tracer: Interrupter) -> tuple[bool, str]:
    """One cancel of a call in flight under ``tracer``: (interrupted, what is left)."""
    rid = f"v{n}"
    x = np.arange(2.0)
    victim = client.submit(request(rid, sleep_s=2 * SLOW_S), {"x": x})  # still in flight
    lock = client._lock
    owed = client._owed

    def heard(frame: FrameType) -> None:  # owed, the lock free: its worker's end is read
        if rid in owed and not lock.locked():
            until(lambda: rid not in owed, 1.0)

    tracer.before = heard
    interrupted = run_interrupted(tracer, lambda: client.cancel(rid))
    left = []
    try:
        end = victim.next(timeout=BOUND_S)
        while not end.terminal:
            end = victim.next(timeout=BOUND_S)
    except Exception as exc:
        left.append(f"the cancelled call has no end: {type(exc).__name__}: {exc}")
    if not until(lambda: client.outstanding() == 0, 1.0):
        left.append(f"owed {sorted(owed)}, outstanding {client.outstanding()}")
    try:
        client.submit(request(f"n{n}"), {"x": x}).result(timeout=BOUND_S)
    except Exception as exc:
        left.append(f"the next call failed: {type(exc).__name__}: {exc}")
    return interrupted, ", ".join(left)


def test_ctrl_c_in_a_cancel_leaves_nothing_owed(start: Callable[..., WorkerClient]) -> None:
    client = start(spin_us=0)
    only = frozenset({"WorkerClient.cancel"})
    counter = Interrupter(0, only)
    assert not _cancel(client, 0, counter)[0]
    assert counter.points > 5, counter.points
    k = 0
    while True:  # every point, to the first the cancel no longer reaches
        k += 1
        tracer = Interrupter(k, only)
        interrupted, left = _cancel(client, k, tracer)
        assert not left, f"interrupted at {tracer.where}: {left}"
        if not interrupted:
            break
    assert k > 5
    assert client.outstanding() == 0

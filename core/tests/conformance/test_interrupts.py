"""The test kit's interrupter counts the same points on every run of the same code.

A sweep counts a piece of code's points once, then interrupts it at each: a point that
comes and goes between runs (the cyclic collector's finalizers of earlier garbage, a
frame reusing a returned frame's address) makes a sweep fail by chance, as CI's run of
stop 61 did. And a place where a real signal lands is a point (an f-string's field).
"""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from edge_core.testing.interrupts import Interrupter, run_interrupted


def _fails() -> None:
    raise ValueError("from a call: the frame's last instruction is a CALL")


def _inner() -> None:
    _fails()


def _caught() -> None:
    try:
        _inner()
    except ValueError:
        return


def _plain() -> int:
    total = 0
    for step in range(3):
        total += step
    return total


def _no_call() -> int:
    one = 1
    return one + 1


def _waits() -> Iterator[int]:
    yield 1
    yield 2


def _points(call: Callable[[], object]) -> int:
    tracer = Interrupter(0)
    assert run_interrupted(tracer, call) is False
    return tracer.points


def test_a_frame_at_a_returned_frames_address_starts_afresh() -> None:
    # _inner's frame leaves on the exception raised by the call it made (its last
    # instruction a CALL); the next frame made takes its address, and its first
    # instruction must not count as a point after a call (_no_call has its entry alone)
    caught, lone = _points(_caught), _points(_no_call)
    assert lone == 1
    both = _points(lambda: (_caught(), _no_call()))
    # (the lambda's own: its entry and the points after its two calls)
    assert both == caught + lone + 3


def _one() -> int:
    return 1


def _closed_then_another() -> None:
    waiting = _waits()
    next(waiting)
    waiting.close()
    del waiting
    _one()  # (a frame of _waits' size: its object takes the freed one's address)


def test_a_generator_closed_where_it_waits_leaves_no_point_behind() -> None:
    # close() enters the generator's frame (a call event: "resumed" is noted) and, with
    # no handler there, the frame returns before any instruction; the next frame at its
    # address must not take the "resumed" point as its own
    tracer = Interrupter(0, only=frozenset({"_one"}))
    assert run_interrupted(tracer, _closed_then_another) is False
    assert tracer.points == 1  # its entry
    tracer = Interrupter(2, only=frozenset({"_one"}))
    assert run_interrupted(tracer, _closed_then_another) is False


class _Garbage:
    """A cycle with a finalizer: collected only by the cyclic collector, running Python."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        self.me = None


@contextmanager
def _collections_meanwhile(collected_by: list[tuple[int, bool]]) -> Iterator[None]:
    # The collector runs often (in the thread of whichever allocation passes its
    # threshold): in the traced code's thread at points that move with what was
    # allocated before, and in another thread that makes cyclic garbage meanwhile (while
    # its finalizers run, the traced thread may run too and its points count). Python
    # callbacks first and last in gc.callbacks, made after the interrupter's import (as
    # Hypothesis makes its own), run in each collection
    threshold = gc.get_threshold()
    stop = threading.Event()

    def churn() -> None:
        while not stop.wait(0.0002):
            for _ in range(50):
                _Garbage()

    def timed(phase: str, info: dict[str, int]) -> None:
        if phase == "start":  # (which thread, and whether it was being traced)
            collected_by.append((threading.get_ident(), sys.gettrace() is not None))

    thread = threading.Thread(target=churn, daemon=True)
    enabled = gc.isenabled()
    gc.enable()
    gc.set_threshold(20)
    gc.callbacks.insert(0, timed)
    gc.callbacks.append(timed)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        while timed in gc.callbacks:
            gc.callbacks.remove(timed)
        gc.set_threshold(*threshold)
        gc.collect()
        if not enabled:
            gc.disable()


def _counted(call: Callable[[], object]) -> int:
    """The points of ``call`` traced with the collector on."""
    tracer = Interrupter(0)
    assert run_interrupted(tracer, call, collecting=True) is False
    return tracer.points


def test_the_collectors_finalizers_and_callbacks_are_no_points() -> None:
    def work() -> None:
        for _ in range(30):
            _caught()
            _Garbage()
            [_plain() for _ in range(3)]

    gc.collect()
    quiet = _counted(work)
    collected_by: list[tuple[int, bool]] = []
    counts = set()
    with _collections_meanwhile(collected_by):
        for before in range(16):  # (the collections land elsewhere in each run)
            gc.collect()
            ballast = [[] for _ in range(before)]
            counts.add(_counted(work))
            del ballast
        # and every point counted is one an interrupted run reaches
        reached = [run_interrupted(Interrupter(k), work, collecting=True)
                   for k in (1, quiet // 2, quiet)]
        assert run_interrupted(Interrupter(quiet + 1), work, collecting=True) is False
    assert counts == {quiet}
    assert reached == [True, True, True]
    main = threading.get_ident()
    # (collections ran inside traced runs in this thread, and in the other meanwhile)
    assert (main, True) in collected_by
    assert {thread for thread, _ in collected_by} - {main}


def _request_id(serial: int) -> str:
    return f"r{serial}"


def test_an_integer_formatted_in_an_f_string_is_a_point() -> None:
    # Converting an int to decimal checks for signals (a real SIGINT sent during a loop of
    # f"{prefix}{n}" is acted on inside FORMAT_VALUE): its entry, then after the field
    tracer = Interrupter(0, only=frozenset({"_request_id"}))
    assert run_interrupted(tracer, lambda: _request_id(7)) is False
    assert tracer.points == 2
    tracer = Interrupter(2, only=frozenset({"_request_id"}))
    assert run_interrupted(tracer, lambda: _request_id(7)) is True
    assert tracer.where.endswith("_request_id (after FORMAT_VALUE)"), tracer.where

"""Ctrl-C at a chosen point: a tracer raising ``KeyboardInterrupt`` where CPython acts on one.

A pending signal is acted on in the main thread only where the interpreter checks for
it: as a Python function starts (``RESUME``), after a call returns (``CALL`` and
``CALL_FUNCTION_EX``: the check after a C function, or a blocking one that was
interrupted), at a loop's backward jump, and inside an f-string's field that formats an
integer (``FORMAT_VALUE``: the conversion checks). :class:`Interrupter` counts those points of a
piece of code (a function's ``call`` event, the first instruction after each of those
instructions) and raises ``KeyboardInterrupt`` at the ``k``-th, as the signal's handler
would there: a sweep runs the code once with ``k`` = 0 to count its points, then once for
each ``k`` and checks what every interrupt left behind. Raising from the tracer is what
the default SIGINT handler does (``_thread.interrupt_main()`` called from a tracer is
acted on at the tracer's own next call, so it raises from the same instruction). The
point after a Python function that the interpreter called inline has no check in
reality, so a sweep interrupts at a few more points than a signal can. And one
instruction later is not always the same place: a call that ends a ``with`` block's or a
``try`` block's body (``return f()`` under ``with lock:``) is followed by an instruction
outside that block's handler, where the tracer's raise skips the ``__exit__`` or the
``finally`` that a real signal, acted on inside the call's instruction, runs: a window
found at such a point ("after CALL" as a block ends) is checked against the code before
it is believed.

Edge-core's own sweeps (``core/tests``: a call, a stream, a submission, a channel's wait,
an answer) use it; a backend's author can sweep its own hooks' callers the same way.
"""

from __future__ import annotations

import dis
import gc
import inspect
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, Final

__all__ = ["BACKWARD_JUMPS", "CHECKED_AFTER", "Interrupter", "run_interrupted", "until"]

BACKWARD_JUMPS: Final = ("JUMP_BACKWARD", "POP_JUMP_BACKWARD_IF_TRUE",
                         "POP_JUMP_BACKWARD_IF_FALSE", "POP_JUMP_BACKWARD_IF_NONE",
                         "POP_JUMP_BACKWARD_IF_NOT_NONE")
"""CPython 3.11's backward jumps (a loop's check for a pending signal); later versions keep
the names they still have."""

CHECKED_AFTER: Final = frozenset(dis.opmap[name]
                                 for name in ("CALL", "CALL_FUNCTION_EX", "FORMAT_VALUE",
                                              *BACKWARD_JUMPS)
                                 if name in dis.opmap)
"""The opcodes after which CPython checks for a pending signal: the interrupter's points.

``FORMAT_VALUE`` (an f-string's field) is one because an integer's conversion to decimal
checks for signals as it goes: a real SIGINT lands there (sent at random during a loop
of ``f"{prefix}{n}"``, 277 of 278 were acted on in it); a sweep interrupts after every
field, an integer's or not."""

_GENERATOR = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR

_collecting: set[int] = set()  # the threads running the cyclic collector (its finalizers)


def _collection_starts(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        _collecting.add(threading.get_ident())


def _collection_ends(phase: str, info: dict[str, int]) -> None:
    if phase == "stop":
        _collecting.discard(threading.get_ident())


_COLLECTION_CODES: Final = frozenset((_collection_starts.__code__, _collection_ends.__code__))


def _around_the_collectors_callbacks() -> None:
    """Put the collection's marks first and last among ``gc.callbacks``.

    Another module's callbacks (Hypothesis inserts one first) run inside the collection.
    """
    callbacks = gc.callbacks
    if not callbacks or callbacks[0] is not _collection_starts:
        if _collection_starts in callbacks:
            callbacks.remove(_collection_starts)
        callbacks.insert(0, _collection_starts)
    if callbacks[-1] is not _collection_ends:
        if _collection_ends in callbacks:
            callbacks.remove(_collection_ends)
        callbacks.append(_collection_ends)


class Interrupter:
    """A ``sys.settrace`` tracer raising ``KeyboardInterrupt`` at its ``k``-th point.

    ``k`` < 1 never raises: :attr:`points` then counts the points of what ran under it.
    ``only``: the points in the functions of those qualified names alone count (None: all).
    ``skip``: no point counts in the modules of those file names, nor in the functions of
    those qualified names, nor in what those call. ``before(frame)`` is called at each
    point that counts, before it is counted (a test's hold: it may wait there for another
    thread). After a raise, :attr:`where` names the point (file, line, function and which
    point of it).

    A generator or coroutine resumed after its ``yield`` is interrupted at its first
    instruction, not at the ``call`` event of its resumption: raised there, the exception
    would leave the frame without running its handlers (its ``finally``), which a real
    signal, acted on at the ``RESUME`` after the ``yield``, runs.

    What the cyclic garbage collector runs (finalizers and weak references' callbacks of
    earlier garbage, at moments no sweep chooses; an exception there is printed and
    dropped, never raised) has no point, the callbacks in ``gc.callbacks`` when the tracer
    is made included, and a frame's bookkeeping is forgotten as it returns (a later frame
    at the same address starts afresh), so that the same code counts the same points on
    every run. What a collection defers to later code (asyncio's hook for a collected
    async generator schedules its ``aclose()`` on the loop; a weak dictionary's contents)
    can still differ: :func:`run_interrupted` keeps the collector off while it traces.
    """

    def __init__(self, k: int, only: frozenset[str] | None = None,
                 skip: frozenset[str] = frozenset(),
                 before: Callable[[FrameType], None] | None = None) -> None:
        """A tracer for the ``k``-th point (see the class's doc for each argument)."""
        self.k = k
        self.only = only
        self.skip = skip
        self.before = before
        self.points = 0
        self.where = ""
        self._last: dict[int, int] = {}  # frame id -> its last instruction
        self._resumed: set[int] = set()  # generator frames resumed, before their next one
        _around_the_collectors_callbacks()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> Interrupter:
        """The trace function: count (and maybe interrupt at) the points of ``frame``."""
        if _collecting and threading.get_ident() in _collecting:
            return self
        if frame.f_code in _COLLECTION_CODES:
            return self
        if event == "call":
            frame.f_trace_opcodes = True
            frame.f_trace_lines = False
            if frame.f_code.co_flags & _GENERATOR and frame.f_lasti > 0:  # after a yield
                self._resumed.add(id(frame))
            else:
                self._point(frame, "entry")
        elif event == "opcode":
            op = frame.f_code.co_code[frame.f_lasti]
            before = self._last.get(id(frame))
            self._last[id(frame)] = op
            if self._resumed and id(frame) in self._resumed:
                self._resumed.discard(id(frame))
                self._point(frame, "resumed")
            elif before in CHECKED_AFTER:
                self._point(frame, f"after {dis.opname[before]}")
        elif event == "return":  # (a generator closed where it waits runs no instruction)
            self._last.pop(id(frame), None)
            self._resumed.discard(id(frame))
        return self

    def _point(self, frame: FrameType, what: str) -> None:
        if self.only is not None and frame.f_code.co_qualname not in self.only:
            return
        if self.skip:  # (in what one of them called too)
            caller: FrameType | None = frame
            while caller is not None:
                code = caller.f_code
                if code.co_filename.rsplit("/", 1)[-1] in self.skip or (
                        code.co_qualname in self.skip):
                    return
                caller = caller.f_back
        if self.before is not None:
            self.before(frame)
        self.points += 1
        if self.points == self.k:
            code = frame.f_code
            self.where = (f"{code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno} "
                          f"{code.co_qualname} ({what})")
            raise KeyboardInterrupt


def run_interrupted(tracer: Interrupter, call: Callable[[], Any], *,
                    collecting: bool = False) -> bool:
    """Run ``call()`` under ``tracer``: True when a ``KeyboardInterrupt`` came out of it.

    The cyclic garbage collector is off while it runs (see :class:`Interrupter`), unless
    ``collecting`` (a test of the tracer under collections).
    """
    _collecting.discard(threading.get_ident())  # (a mark whose collection's end never ran)
    enabled = gc.isenabled()
    if not collecting:
        gc.disable()
    sys.settrace(tracer)
    try:
        call()
    except KeyboardInterrupt:
        return True
    finally:
        sys.settrace(None)
        if enabled:
            gc.enable()
    return False


def until(condition: Callable[[], bool], bound_s: float) -> bool:
    """Whether ``condition()`` became true within ``bound_s`` seconds (polled each ms).

    What a sweep waits for after an interrupt: a call ended, a read role handed over.
    """
    end = time.monotonic() + bound_s
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.001)
    return True

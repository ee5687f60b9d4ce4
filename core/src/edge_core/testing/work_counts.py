"""Counting the Python work a call does: function calls and bytecode instructions.

For tests that bound a hot path's work deterministically, where timing on a shared machine
would only measure the machine: :func:`python_calls` counts the Python functions entered
(``sys.setprofile``'s call events) and :func:`bytecodes` the bytecode instructions run
(``sys.settrace``'s opcode events), both in the calling thread, over a sequence of
steps (``itertools.repeat(request, 100)``, or steps whose arguments a generator builds
outside the count), and return the count per step with the busiest functions. C functions are not
counted by either. Bytecode counts depend on the interpreter's compiler, so a bound on
them is kept per Python minor version.

The garbage collector is run before a count and kept off during it: a collection that
fell inside a step would run the finalizers of whatever earlier code left behind (another
pipeline's, say) in the counting thread and count them as the step's work.
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from types import CodeType, FrameType
from typing import Any

import attrs

__all__ = ["WorkCount", "bytecodes", "python_calls"]


@attrs.frozen
class WorkCount:
    """What a callable cost per repeat.

    Attributes:
        per_call: the count divided by the repeats.
        busiest: the twenty functions that counted most, ``("file:function", count)``,
            for an assertion's message.

    """

    per_call: float
    busiest: list[tuple[str, int]]


@contextlib.contextmanager
def _no_collection() -> Iterator[None]:
    """Collect now, then keep the garbage collector off until the block ends."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def python_calls(steps: Iterable[Callable[[], object]]) -> WorkCount:
    """Count the Python function calls each step makes, per step, the step itself left out.

    Each step is taken from ``steps`` before the count starts, so whatever a generator does
    to build it is not counted.
    """
    counts: Counter[str] = Counter()

    def count(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            counts[f"{code.co_filename}:{code.co_name}"] += 1

    taken = outer = 0
    with _no_collection():
        for step in steps:
            taken += 1
            outer += getattr(step, "__code__", None) is not None  # Python: its own entry
            sys.setprofile(count)
            try:
                step()
            finally:
                sys.setprofile(None)
    if not taken:
        raise ValueError("python_calls: no steps")
    return WorkCount((sum(counts.values()) - outer) / taken, counts.most_common(20))


def bytecodes(steps: Iterable[Callable[[], object]]) -> WorkCount:
    """Count the bytecode instructions each step runs, per step, the step's own left out.

    Steps are taken as in :func:`python_calls`.
    """
    counts: Counter[str] = Counter()
    own: set[CodeType] = set()

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "call":
            frame.f_trace_opcodes = True
            frame.f_trace_lines = False
            return trace
        if event == "opcode" and frame.f_code not in own:
            code = frame.f_code
            counts[f"{code.co_filename}:{code.co_name}"] += 1
        return trace

    taken = 0
    with _no_collection():
        for step in steps:
            taken += 1
            code = getattr(step, "__code__", None)
            if code is not None:
                own.add(code)
            sys.settrace(trace)
            try:
                step()
            finally:
                sys.settrace(None)
    if not taken:
        raise ValueError("bytecodes: no steps")
    return WorkCount(sum(counts.values()) / taken, counts.most_common(20))

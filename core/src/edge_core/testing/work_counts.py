"""Counting the Python work a call does: function calls and bytecode instructions.

For tests that bound a hot path's work deterministically, where timing on a shared machine
would only measure the machine: :func:`python_calls` counts the Python functions entered
(``sys.setprofile``'s call events) and :func:`bytecodes` the bytecode instructions run
(``sys.settrace``'s opcode events), both in the calling thread, over a sequence of
steps (``itertools.repeat(request, 100)``, or steps whose arguments a generator builds
outside the count), and return the count per step with the busiest functions. C functions are not
counted by either. Bytecode counts depend on the interpreter's compiler, so a bound on
them is kept per Python minor version.

Each count gives the steps' mean and their median. A step that met a rare event on its
way (a worker's heartbeat frame read by the waiting caller, a wake-up the kernel delayed
so the reading loop ran once more) costs hundreds or thousands of instructions more,
and how many steps of a batch meet one depends on timing: the mean of 100 steps moved
by 30 between batches of the same path. The median is the path most steps take, which
no rare event moves: a bound on the usual path is a bound on it.

The garbage collector is run before a count and kept off during it: a collection that
fell inside a step would run the finalizers of whatever earlier code left behind (another
pipeline's, say) in the counting thread and count them as the step's work.
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from types import CodeType, FrameType
from typing import Any, Final

import attrs

__all__ = ["RARE_EVENTS_ROOM", "WorkCount", "bytecodes", "python_calls"]

RARE_EVENTS_ROOM: Final = 1.05
"""A bound on a step's usual path (the median) times this bounds the mean: room for the
rare events a loaded batch meets (a worker's heartbeat frame read by the waiting caller
costs about 930 bytecodes; a small ``Pipeline.run`` costs about 1800). The mean's bound
catches costly work that most steps skip, not a small addition to a few steps: 5 % of the
bound a step, on average."""


@attrs.frozen
class WorkCount:
    """What a callable cost per repeat.

    Attributes:
        per_call: the count divided by the repeats (the mean: rare events included).
        busiest: the twenty functions that counted most, ``("file:function", count)``,
            for an assertion's message.
        median: the median of the steps' counts (the usual path: see the module's doc).

    """

    per_call: float
    busiest: list[tuple[str, int]]
    median: float


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

    per_step: list[int] = []
    with _no_collection():
        for step in steps:
            own = getattr(step, "__code__", None) is not None  # Python: its own entry
            before = counts.total()
            sys.setprofile(count)
            try:
                step()
            finally:
                sys.setprofile(None)
            per_step.append(counts.total() - before - own)
    if not per_step:
        raise ValueError("python_calls: no steps")
    return WorkCount(sum(per_step) / len(per_step), counts.most_common(20),
                     statistics.median(per_step))


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

    per_step: list[int] = []
    with _no_collection():
        for step in steps:
            code = getattr(step, "__code__", None)
            if code is not None:
                own.add(code)
            before = counts.total()
            sys.settrace(trace)
            try:
                step()
            finally:
                sys.settrace(None)
            per_step.append(counts.total() - before)
    if not per_step:
        raise ValueError("bytecodes: no steps")
    return WorkCount(sum(per_step) / len(per_step), counts.most_common(20),
                     statistics.median(per_step))

"""Ctrl-C at every point of a tiny call where CPython can act on it: nothing is left held.

A ``KeyboardInterrupt`` (Ctrl-C in the main thread; the command line raises one for
``SIGTERM`` too) comes out where CPython acts on a pending signal, not anywhere:
:func:`test_a_signal_is_acted_on_where_the_sweep_interrupts` shows, with real SIGINTs sent
at random moments during tiny calls, that the frame it interrupts is always at a call that
just returned (``PRECALL``/``CALL`` on 3.11: the check after a C function returns, or a
blocking one that was interrupted). The interpreter also checks as a Python function
starts (``RESUME``) and at a loop's backward jump.

The sweep (:func:`test_ctrl_c_at_every_point_of_a_call_leaves_nothing_held`) therefore
raises ``KeyboardInterrupt`` from a ``sys.settrace`` tracer at each such point of one
tiny ``Pipeline.run`` in turn, on the real echo backend in its worker process: at every
Python function's start (the ``call`` event) and at the first instruction after every
``CALL``, ``CALL_FUNCTION_EX`` and every backward jump (``JUMP_BACKWARD`` and the
conditional ``POP_JUMP_BACKWARD_IF_*``: the ``opcode`` events), the k-th
such point for k over the whole call. Raising from the tracer is what the signal
handler does there (``_thread.interrupt_main()`` called from a tracer is acted on at the
tracer's own next call, so it raises from the same instruction); the point after a
Python function that the interpreter called inline has no check in reality, so the sweep
interrupts at a few more points than a signal can (none where a signal cannot have the
same effect one instruction earlier, inside the function that returned).

After each: the interrupt reached the caller (or the call completed: its result is
acknowledged), nothing stays charged (the admission slot is free again, within the time
the drain of a result dropped unacknowledged takes), and the next call works within a
bound. A window found is listed with where it was interrupted and what it left; the
pipeline is then closed (within a bound, its ledger empty) and opened again, and the sweep
goes on. The runtime tests' leak check then finds no worker process, shared-memory
segment or descriptor left.
"""

from __future__ import annotations

import asyncio
import contextlib
import dis
import gc
import os
import random
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from types import FrameType
from typing import Any

import numpy as np
import pytest

from edge_core.host.loop_reading import LINGER_S
from edge_core.ledger import ResourceLedger
from edge_core.runtime import Pipeline, PipelineResult
from edge_core.runtime.errors import RequestCancelled
from edge_core.testing.interrupts import BACKWARD_JUMPS, CHECKED_AFTER, Interrupter

from .conftest import OpenPipeline, echo_stage

#: Instructions after which CPython 3.11 checks for a pending signal (the sweep's points).
#: Where a real signal's handler finds the frame it interrupts (f_lasti's instruction).
_ACTED_ON_AT = frozenset({"PRECALL", "CALL", "CALL_FUNCTION_EX", "FORMAT_VALUE", "RESUME",
                          *BACKWARD_JUMPS})

WARM_UP = 30
NEXT_CALL_S = 1.0  # the bound on the call after an interrupted one
FULL_SWEEP = os.environ.get("EDGE_TEST_FULL_SWEEP") == "1"  # a failing sweep lists every window
CLOSE_S = 5.0  # the bound on a close after a window was found
DRAIN_S = 1.0  # a result dropped unacknowledged is acknowledged by the drain thread
WIND_DOWN_S = 0.05  # the loop run on after an interrupted call (as a program would run it)


#: One call under the tracer: what it returns (a result) is acknowledged outside it.
Drive = Callable[[Pipeline, np.ndarray, "float | None"], "PipelineResult | None"]


def _run_call(pipeline: Pipeline, x: np.ndarray, deadline_s: float | None) -> PipelineResult:
    """One ``run``."""
    return pipeline.run({"x": x}, deadline_s=deadline_s)


def _whole_stream(pipeline: Pipeline, x: np.ndarray, deadline_s: float | None) -> None:
    """A ``stream`` read to its end (interrupted in it, or in this loop's body: the
    generator is then dropped, and closed)."""
    for _ in pipeline.stream({"x": x}, deadline_s=deadline_s):
        pass


def _stream_closed_early(pipeline: Pipeline, x: np.ndarray, deadline_s: float | None) -> None:
    """A ``stream`` closed after its first token: cancelled and read to its end."""
    tokens = pipeline.stream({"x": x}, deadline_s=deadline_s)
    next(tokens)
    tokens.close()


def _traced(pipeline: Pipeline, x: np.ndarray, tracer: Interrupter,
            deadline_s: float | None = None, drive: Drive = _run_call) -> bool:
    """One call under ``tracer``; True when it was interrupted (its result else acked).

    An interrupt raised where CPython only reports it (a finalizer, a generator closed as
    its last reference goes: "Exception ignored in") is reported there with a signal too:
    it is left out of pytest's report of unraisable exceptions, and the call goes on.
    """
    result = None
    forward = sys.unraisablehook

    def swallowed(info: Any) -> None:
        if not isinstance(info.exc_value, KeyboardInterrupt):
            forward(info)

    sys.unraisablehook = swallowed
    sys.settrace(tracer)
    try:
        result = drive(pipeline, x, deadline_s)
    except KeyboardInterrupt:
        return True
    finally:
        sys.settrace(None)
        sys.unraisablehook = forward
    if result is not None:
        result.ack()
    return False


def _held(pipeline: Pipeline, x: np.ndarray | None = None) -> str:
    """What the pipeline holds now ('' for nothing): admission, placement, calls, tracking,
    and ``x`` when it is an input buffer still claimed (read-only: a send of it refused)."""
    what = []
    if x is not None and pipeline.owns_input_buffer(x) and not x.flags.writeable:
        what.append("input buffer still claimed")
    if pipeline.admission.used:
        what.append(f"admission slot held: {pipeline.admission.used}")
    if pipeline.lineup.current.holds:
        what.append(f"placement held: {pipeline.lineup.current.holds}")
    for stage in pipeline.stages:
        if stage.outstanding or stage.slots.used:
            what.append(f"stage {stage.name}: {stage.outstanding} call(s), "
                        f"{stage.slots.used} slot(s) held")
    if pipeline.requests.tracked:
        what.append(f"requests tracked: {pipeline.requests.tracked}")
    return ", ".join(what)


def _left_held(pipeline: Pipeline, x: np.ndarray,
               next_call: Callable[[Pipeline, np.ndarray], None] | None = None,
               drain_s: float = DRAIN_S) -> str | None:
    """What an interrupted call left held (after ``drain_s``), or None when the next call
    works.

    The next call is ``next_call`` (it must not raise), else a ``run`` bounded by
    :data:`NEXT_CALL_S`: an input buffer ``x`` is then refilled for it, and it must send
    it by reference (a claim stamped in the producer but not in the buffer sent it as a
    copy) and get its new values back (times :data:`ECHO_SCALE`). Worker memory an answer
    held and nobody gave back fails the next call where the answers are large enough
    (:func:`_half_cap_buffer`).
    """
    end = time.monotonic() + drain_s
    while (held := _held(pipeline, x)) and time.monotonic() < end:
        time.sleep(0.005)
        if time.monotonic() > end - DRAIN_S / 2:  # dropped in a reference cycle, perhaps
            gc.collect()
    if held:
        return held
    buffer = pipeline.owns_input_buffer(x)
    sent = pipeline.input_buffer_counts()["sent"]
    try:
        if next_call is not None:
            next_call(pipeline, x)
            return None
        if buffer:
            x[:] = value = float(sent % 1000)
        with pipeline.run({"x": x}, deadline_s=NEXT_CALL_S) as result:
            answered = not buffer or bool((result.outputs["x"] == ECHO_SCALE * value).all())
    except Exception as exc:
        return f"the next call failed: {type(exc).__name__}: {exc}"
    if not answered:
        return "the next call's answer is not its input buffer's new values"
    if buffer and pipeline.input_buffer_counts()["sent"] != sent + 1:
        return "the next call did not send its input buffer by reference"
    return None


#: What a swept call sends as ``x``, made once per pipeline opened (a sweep reopens it
#: after a window found).
Source = Callable[[Pipeline], np.ndarray]


def _tiny(pipeline: Pipeline) -> np.ndarray:
    """Four values: an inline array (copied into the request's frame)."""
    return np.arange(4, dtype=np.float32)


#: What the echo worker multiplies its input by (its ``scale`` option's default)
ECHO_SCALE = 2.0
#: An input buffer's length in float32 values: 512 KiB, above the shared-memory threshold
BUFFER_ROWS = 128 * 1024


def _input_buffer(pipeline: Pipeline) -> np.ndarray:
    """The pipeline's input buffer (``Pipeline.input_buffer``): sent by reference."""
    buffer = pipeline.input_buffer("x", (BUFFER_ROWS,), np.float32)
    assert pipeline.owns_input_buffer(buffer)
    buffer[:] = 1.0
    return buffer


#: A float32 input buffer half the size of a channel's default cap on the shared memory a
#: side keeps (64 MiB, its pool included): the memory of an answer whose release was lost,
#: still the worker's, leaves no room for the next answer (the next call fails: the
#: worker's ShmCapExceeded)
HALF_CAP_ROWS = 8 * 1024 * 1024


def _half_cap_buffer(pipeline: Pipeline) -> np.ndarray:
    """An input buffer of :data:`HALF_CAP_ROWS` values (32 MiB), its answer as large."""
    buffer = pipeline.input_buffer("x", (HALF_CAP_ROWS,), np.float32)
    assert pipeline.owns_input_buffer(buffer)
    buffer[:] = 1.0
    return buffer


def _sweep(open_pipeline: OpenPipeline, ledger: ResourceLedger, stages: list[dict[str, Any]],
           only: frozenset[str] | None = None, *, first: bool = False,
           deadline_s: float | None = None, drive: Drive = _run_call,
           skip: frozenset[str] = frozenset(), source: Source = _tiny,
           next_call: Callable[[Pipeline, np.ndarray], None] | None = None,
           after: Callable[[], None] | None = None,
           drain_s: float = DRAIN_S) -> tuple[int, list[str]]:
    """Interrupt one call at each of its points in turn: (points, windows found).

    ``first``: stop at the first window found (each costs the bounds on the drain and the
    next call, and a reopen: about a second and a half). ``deadline_s``: each swept
    call's (its admission slot then waited for). ``drive``: the call (``run`` by default).
    ``skip``: modules whose points are left out (see :class:`Interrupter`). ``source``:
    what the calls send (an inline array by default). ``next_call``: the call after each
    (also the warm-up's; a checked ``run`` by default, :func:`_left_held`). ``after``: run
    after each swept call, untraced, before what it left is looked at (within ``drain_s``).
    """
    x = np.arange(4, dtype=np.float32)

    def opened() -> Pipeline:
        nonlocal x
        pipeline = open_pipeline(*stages)
        x = source(pipeline)
        for _ in range(WARM_UP):
            if next_call is None:
                pipeline.run({"x": x}).ack()
            else:
                next_call(pipeline, x)
        return pipeline

    pipeline = opened()
    counter = Interrupter(0, only, skip)
    assert not _traced(pipeline, x, counter, deadline_s, drive)
    windows: list[str] = []
    for k in range(1, counter.points + 1):
        tracer = Interrupter(k, only, skip)
        interrupted = _traced(pipeline, x, tracer, deadline_s, drive)
        if after is not None:
            after()
        if (held := _left_held(pipeline, x, next_call, drain_s)) is None:
            continue
        windows.append(f"{tracer.where if interrupted else 'completed'}: {held}")
        started = time.monotonic()
        pipeline.close()
        took = time.monotonic() - started
        assert took < CLOSE_S, f"close took {took:.1f} s after {windows[-1]}"
        assert ledger.snapshot()["reservations"] == [], windows[-1]
        if first:
            return counter.points, windows
        pipeline = opened()
    pipeline.close()
    assert ledger.snapshot()["reservations"] == []
    return counter.points, windows


@pytest.mark.slow
@pytest.mark.parametrize(("length", "deadline_s"), [(1, None), (2, None), (1, 30.0), (2, 30.0)],
                         ids=["one-stage", "two-stage", "one-stage-deadline",
                              "two-stage-deadline"])
def test_ctrl_c_at_every_point_of_a_call_leaves_nothing_held(
        open_pipeline: OpenPipeline, ledger: ResourceLedger, length: int,
        deadline_s: float | None) -> None:
    assert threading.current_thread() is threading.main_thread()
    stages = [echo_stage("a")]
    if length == 2:
        stages.append(echo_stage("b", transform="edge_echo.transforms:passthrough"))
    # The sweep stops at the first window found; EDGE_TEST_FULL_SWEEP=1 lists them all.
    # It passes only by sweeping every point and finding none: the usual reply's reading
    # (WorkerClient._read_one and _read_taken) and, for a reply not of the usual form (two
    # frames in one receive: a heartbeat's beside it, now and then), the frame reader's
    points, windows = _sweep(open_pipeline, ledger, stages, first=not FULL_SWEEP,
                             deadline_s=deadline_s)
    assert points > 100  # the whole call was swept, not a part of it
    assert windows == [], f"{len(windows)} of {points} points left something held:\n" + (
        "\n".join(windows))


def _streaming(length: int) -> list[dict[str, Any]]:
    """A chain whose last stage streams three tokens before its DONE (preemptible: a
    stream closed early is cancelled in place, its worker kept)."""
    last: dict[str, Any] = {"backend": "echo-preemptible", "stream_chunks": 3}
    if length == 1:
        return [echo_stage("a", **last)]
    return [echo_stage("a"),
            echo_stage("b", transform="edge_echo.transforms:passthrough", **last)]


@pytest.mark.slow
@pytest.mark.parametrize("drive", [_whole_stream, _stream_closed_early],
                         ids=["read-to-its-end", "closed-after-a-token"])
@pytest.mark.parametrize("length", [1, 2], ids=["one-stage", "two-stage"])
def test_ctrl_c_at_every_point_of_a_stream_leaves_nothing_held(
        open_pipeline: OpenPipeline, ledger: ResourceLedger, length: int,
        drive: Drive) -> None:
    # As the sweep of run, for a stream: interrupted as the generator is advanced and
    # closed, and in the caller's loop (the generator then dropped), and as each token's
    # frame (not the usual reply) is read, parsed and handed to its call; each stream's
    # deadline waits for its admission slot (the path without one is run's)
    assert threading.current_thread() is threading.main_thread()
    points, windows = _sweep(open_pipeline, ledger, _streaming(length), first=not FULL_SWEEP,
                             deadline_s=30.0 if length == 2 else None, drive=drive)
    assert points > 100
    assert windows == [], f"{len(windows)} of {points} points left something held:\n" + (
        "\n".join(windows))


#: The standard library's threads, futures and executor: a Ctrl-C there can leave a lock
#: of theirs held for good (a Condition's or a Semaphore's ``__enter__`` interrupted as its
#: lock's acquire returned: ``ThreadPoolExecutor.submit`` then hangs), which no caller can
#: give back; a submission's sweep leaves their points out (docs/runtime.md)
STDLIB_THREADS = frozenset({"threading.py", "thread.py", "_base.py"})


def _submitted(pipeline: Pipeline, x: np.ndarray, deadline_s: float | None) -> PipelineResult:
    """A ``submit`` (its request run on a request thread, untraced), its result waited for
    here; interrupted, the submission (or the result taken) is dropped."""
    return pipeline.submit({"x": x}, deadline_s=deadline_s).result()


def _submitted_and_cancelled(pipeline: Pipeline, x: np.ndarray,
                             deadline_s: float | None) -> None:
    """A ``submit`` cancelled at once (fenced: a running call is left to finish, its result
    acknowledged as it comes); interrupted, the submission is dropped."""
    pipeline.submit({"x": x}, deadline_s=deadline_s).cancel(interrupt=False)


@pytest.mark.slow
@pytest.mark.parametrize("drive", [_submitted, _submitted_and_cancelled],
                         ids=["result", "cancel"])
@pytest.mark.parametrize("deadline_s", [None, 30.0], ids=["no-deadline", "deadline"])
def test_ctrl_c_at_every_point_of_a_submit_leaves_nothing_held(
        open_pipeline: OpenPipeline, ledger: ResourceLedger, drive: Drive,
        deadline_s: float | None) -> None:
    # The main thread's own points: submit's (tracking, admission, the submission, the
    # hand-over to a request thread), then the wait for its result or its cancel
    points, windows = _sweep(open_pipeline, ledger, [echo_stage("a")], first=not FULL_SWEEP,
                             deadline_s=deadline_s, drive=drive, skip=STDLIB_THREADS)
    assert points > 30  # (those in the standard library's threads and futures left out)
    assert windows == [], f"{len(windows)} of {points} points left something held:\n" + (
        "\n".join(windows))


def _set_done(done: asyncio.Future[None]) -> None:
    """A submission's done callback: wake its awaiting task (on the loop's thread)."""
    if not done.done():
        done.set_result(None)


def _fenced_on_cancel(submission: Any) -> None:
    """Fence a submission whose awaiting task was cancelled; acknowledge its result."""
    submission.cancel(interrupt=False)

    def acknowledge() -> None:
        with contextlib.suppress(Exception):
            submission.result(0).ack()

    submission.add_done_callback(acknowledge)


class _OnALoop:
    """Calls made in a coroutine run by ``run_until_complete`` on one event loop of the
    main thread: ``submit(loop=...)`` (sent from the loop, its reply read and settled
    there: the coroutine awaits its done callback) or ``arun``.

    After each (:meth:`wind_down`), as ``asyncio.run`` after a ``KeyboardInterrupt``:
    the loop's remaining tasks are cancelled and run to their end (a task awaiting its
    submission fences it and acknowledges its result), the loop kept for the next call.
    """

    def __init__(self, arun: bool = False) -> None:
        self.loop = asyncio.new_event_loop()
        self.arun = arun

    def __call__(self, pipeline: Pipeline, x: np.ndarray,
                 deadline_s: float | None) -> PipelineResult:
        """One call, traced where the sweep traces it."""
        if self.arun:
            return self.loop.run_until_complete(pipeline.arun({"x": x}, deadline_s=deadline_s))
        return self.loop.run_until_complete(self._submitted(pipeline, x, deadline_s))

    async def _submitted(self, pipeline: Pipeline, x: np.ndarray,
                         deadline_s: float | None) -> PipelineResult:
        loop = self.loop
        submission = pipeline.submit({"x": x}, deadline_s=deadline_s, loop=loop)
        done: asyncio.Future[None] = loop.create_future()
        submission.add_done_callback(partial(_set_done, done))
        try:
            await done
        except asyncio.CancelledError:
            _fenced_on_cancel(submission)
            raise
        return submission.result(0)

    def next_call(self, pipeline: Pipeline, x: np.ndarray) -> None:
        """The call after an interrupted one, the same way, bounded by NEXT_CALL_S."""
        if self.arun:
            call = pipeline.arun({"x": x}, deadline_s=NEXT_CALL_S)
        else:
            call = self._submitted(pipeline, x, NEXT_CALL_S)
        self.loop.run_until_complete(asyncio.wait_for(call, NEXT_CALL_S * 2)).ack()

    def wind_down(self) -> None:
        """Cancel the loop's remaining tasks and run them to their end, then run the loop
        a moment more (what a thread handed it meanwhile: an executor's result)."""
        tasks = asyncio.all_tasks(self.loop)
        for task in tasks:
            task.cancel()
        if tasks:
            self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self.loop.run_until_complete(asyncio.sleep(WIND_DOWN_S))

    def close(self) -> None:
        """Close the loop (and its default executor, which ``arun`` uses)."""
        self.wind_down()
        self.loop.run_until_complete(self.loop.shutdown_default_executor())
        self.loop.close()


@pytest.mark.parametrize(("where", "answered"), [
    ("Pipeline._send_now.<locals>.settle", "result"),  # as it begins: run again, whole
    ("Pipeline._delivery", "RequestCancelled"),  # its reply taken, its result not made
    ("RequestAnswer.deliver", "result"),  # its result made, not yet its answer
], ids=["settle-begins", "reply-taken", "result-made"])
def test_ctrl_c_as_the_loop_settles_a_request_is_raised_once_the_request_is_whole(
        open_pipeline: OpenPipeline, where: str, answered: str) -> None:
    # A request sent from the main thread's loop (submit(loop=...)) is settled by the
    # loop once it has read the reply; a Ctrl-C there comes out of the loop's callback
    # (run_until_complete raises it, as asyncio raises one from a callback), once the
    # request is whole: its answer set once, nothing held, the next request served.
    # Before, it was swallowed (the request's error) or left the request unsettled.
    pipeline = open_pipeline(echo_stage("a"))
    drive = _OnALoop()
    x = np.arange(4, dtype=np.float32)
    got: list[Any] = []

    async def sent() -> None:
        submission = pipeline.submit({"x": x}, loop=drive.loop)
        got.append(submission)
        done: asyncio.Future[None] = drive.loop.create_future()
        submission.add_done_callback(partial(_set_done, done))
        await done

    try:
        for _ in range(3):
            drive.next_call(pipeline, x)
        tracer = Interrupter(1, frozenset({where}))
        sys.settrace(tracer)
        try:
            with pytest.raises(KeyboardInterrupt):
                drive.loop.run_until_complete(sent())
        finally:
            sys.settrace(None)
        assert tracer.where, "not interrupted"
        submission = got[0]
        assert submission.done(), "the request was left unsettled"
        if answered == "result":
            submission.result(0).ack()
        else:
            with pytest.raises(RequestCancelled):
                submission.result(0)
        drive.wind_down()
        assert _held(pipeline) == ""
        drive.next_call(pipeline, x)
    finally:
        drive.close()


@pytest.mark.parametrize("deadline_s", [None, 30.0], ids=["no-deadline", "deadline"])
def test_ctrl_c_at_every_point_of_a_send_from_a_loop_leaves_nothing_held(
        open_pipeline: OpenPipeline, ledger: ResourceLedger, deadline_s: float | None) -> None:
    # submit(loop=...) in a coroutine on the main thread's loop, interrupted at each point
    # of Pipeline._send_now's own frame (the tracking, the admission slot and placement,
    # the stage call, the hand-over of its end to the loop): the interrupt comes out of
    # run_until_complete and nothing stays held (a call abandoned after its end was
    # handed to the loop is read to its end by the background reader once the stopped
    # loop is seen not to run: within LINGER_S). Before, a Ctrl-C there left the
    # tracking, the admission slot, the placement or the stage's slot held, or was
    # swallowed as the request's error. (The points of what _send_now calls, of the
    # loop's read and of the caller's coroutine are not swept: docs/runtime.md.)
    drive = _OnALoop()
    try:
        points, windows = _sweep(open_pipeline, ledger, [echo_stage("a")],
                                 frozenset({"Pipeline._send_now"}), first=not FULL_SWEEP,
                                 deadline_s=deadline_s, drive=drive, next_call=drive.next_call,
                                 after=drive.wind_down, drain_s=LINGER_S + DRAIN_S)
    finally:
        drive.close()
    assert points >= 10  # (its own frame's points: its entry and after each call)
    assert windows == [], f"{len(windows)} of {points} points left something held:\n" + (
        "\n".join(windows))


#: arun's own code: its body, and what it hands the loop and the submission.
ARUN = frozenset({"Pipeline.arun", "Pipeline.arun.<locals>.settled", "_wake", "_abandon",
                  "_abandon_submitted", "_acknowledge"})


@pytest.mark.slow
def test_ctrl_c_at_every_point_of_an_arun_leaves_nothing_held(
        open_pipeline: OpenPipeline, ledger: ResourceLedger) -> None:
    # arun in a coroutine on the main thread's loop (its submit made off the loop, in
    # the loop's default executor; its result awaited), interrupted at each of arun's
    # own points (ARUN; the request's own work runs on threads): the interrupt comes out
    # of run_until_complete, and once the loop has run on a moment (the executor's
    # submission handed to it) nothing stays held, within the drain of a result dropped.
    # Without deadline_s alone: arun's own code is the same with one (its submit, made
    # in a thread, is not interrupted)
    drive = _OnALoop(arun=True)
    try:
        points, windows = _sweep(open_pipeline, ledger, [echo_stage("a")], ARUN,
                                 first=not FULL_SWEEP, drive=drive,
                                 next_call=drive.next_call, after=drive.wind_down,
                                 drain_s=LINGER_S + DRAIN_S)
    finally:
        drive.close()
    assert points >= 10
    assert windows == [], f"{len(windows)} of {points} points left something held:\n" + (
        "\n".join(windows))


@pytest.mark.slow
def test_ctrl_c_at_every_point_of_a_fan_out_leaves_nothing_held(
        open_pipeline: OpenPipeline, ledger: ResourceLedger) -> None:
    # A run whose second stage is called once per row of the first's output (four items,
    # gathered: edge_echo.transforms:split_rows), each item's call held by the gather.
    # Replies that come together are read by the frame reader: its points swept too
    # (core/tests/host/test_interrupted_frames.py makes two come together every time)
    stages = [echo_stage("a"), echo_stage("rows", backend="echo-preemptible",
                                          transform="edge_echo.transforms:split_rows")]
    points, windows = _sweep(open_pipeline, ledger, stages, first=not FULL_SWEEP)
    assert points > 300
    assert windows == [], f"{len(windows)} of {points} points left something held:\n" + (
        "\n".join(windows))


def _interrupt_at_anothers_reply(pipeline: Pipeline, x: np.ndarray,
                                 nth: int) -> tuple[bool, Any]:
    """One try: another call sent; the main thread's own call interrupted at the ``nth``
    point (as the sweep counts them, in every frame) from the moment it has taken the
    other call's usual reply out of the calls in flight; (whether it was, the other
    call's result or None in 10 s)."""
    other = pipeline.stage("a").submit({"x": x}, params={"delay_s": 0.1}, deadline_s=30.0)
    state = {"armed": False, "points": 0, "hit": False}
    last: dict[int, int] = {}

    def point() -> None:
        state["points"] += 1
        if state["points"] == nth:
            state["hit"] = True
            raise KeyboardInterrupt

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        if state["hit"]:
            return None
        if event == "call":
            if not state["armed"] and frame.f_code.co_name != "_read_one":
                return None
            frame.f_trace_opcodes = True
            frame.f_trace_lines = False
            if state["armed"]:
                point()
            return tracer
        if event == "opcode":
            op = frame.f_code.co_code[frame.f_lasti]
            before = last.get(id(frame))
            last[id(frame)] = op
            if state["armed"]:
                if before in CHECKED_AFTER:
                    point()
            elif (frame.f_code.co_name == "_read_one"
                  and frame.f_locals.get("popped") is not None
                  and frame.f_locals.get("request_id") == other.request_id):
                state["armed"] = True  # the first point: as the pop's result is stored
                point()
        elif event == "return":  # (a later frame at its address starts afresh)
            last.pop(id(frame), None)
        return tracer

    # (as _traced: no collection inside, and an interrupt CPython only reports is the
    # signal's too, left out of pytest's report of unraisable exceptions)
    forward = sys.unraisablehook

    def swallowed(info: Any) -> None:
        if not isinstance(info.exc_value, KeyboardInterrupt):
            forward(info)

    collecting = gc.isenabled()
    gc.disable()
    sys.unraisablehook = swallowed
    sys.settrace(tracer)
    try:
        pipeline.run({"x": x}, params={"delay_s": 0.4}).ack()
    except KeyboardInterrupt:
        pass
    finally:
        sys.settrace(None)
        sys.unraisablehook = forward
        if collecting:
            gc.enable()
    answered: list[Any] = []
    waiter = threading.Thread(target=lambda: answered.append(other.result()), daemon=True)
    waiter.start()
    waiter.join(10.0)
    return bool(state["hit"]), answered[0] if answered else None


@pytest.mark.parametrize("nth", range(1, 9))
def test_ctrl_c_as_the_main_thread_takes_another_calls_reply_leaves_that_call_answered(
        open_pipeline: OpenPipeline, nth: int) -> None:
    # The main thread, waiting for its own reply, reads the channel and takes another
    # call's usual reply out of the calls in flight (WorkerClient._read_one); a Ctrl-C
    # at any point from there until that reply is delivered (and after) must not drop
    # it: that call's own thread gets its result (before, it was dropped as stale and
    # the call waited until its deadline, its stage slot held)
    pipeline = open_pipeline(echo_stage("a", backend="echo-preemptible"), admission=4)
    x = np.arange(4, dtype=np.float32)
    for _ in range(WARM_UP):  # the usual reply's template is kept
        pipeline.run({"x": x}).ack()
    for _ in range(20):
        hit, result = _interrupt_at_anothers_reply(pipeline, x, nth)
        assert result is not None, "the other call was not answered"
        result.ack()
        if hit:
            break
    assert hit, "the main thread never took the other call's reply"
    stage = pipeline.stage("a")
    end = time.monotonic() + DRAIN_S
    while (stage.outstanding or pipeline.admission.used) and time.monotonic() < end:
        time.sleep(0.005)
    assert stage.outstanding == 0 and pipeline.admission.used == 0
    pipeline.run({"x": x}, deadline_s=NEXT_CALL_S).ack()


#: Where a call waits for its reply and takes it (the wait, the read role, the delivery
#: to the pending call, its result): an interrupt there once left the stage's slot (or
#: the read role) held for good.
WAITING = frozenset({"PendingCall.result", "PendingCall._next", "CallEvents.__next__",
                     "Call.take", "ChannelReader.wait", "ChannelReader._give_up",
                     "Call.deliver_done", "StageRuntime.accept", "StageResult.__init__"})


@pytest.mark.parametrize("length", [1, 2], ids=["one-stage", "two-stage"])
def test_ctrl_c_while_a_call_waits_for_its_reply_leaves_nothing_held(
        open_pipeline: OpenPipeline, ledger: ResourceLedger, length: int) -> None:
    # The sweep's points in WAITING alone (where the usual Ctrl-C lands: a blocked wait).
    stages = [echo_stage("a")]
    if length == 2:
        stages.append(echo_stage("b", transform="edge_echo.transforms:passthrough"))
    points, windows = _sweep(open_pipeline, ledger, stages, WAITING)
    assert points > 20
    assert windows == [], f"{len(windows)} of {points} points left something held:\n" + (
        "\n".join(windows))


#: Where a chain acknowledges an earlier stage's result (its entry and its slot go
#: together). A call's points are not the same in every call (how its replies are read
#: varies: a two-stage call counted 263 to 277 of them), so the full sweep's k-th point
#: is not always the same one and can pass over a few: these are swept on their own too.
ACKING = frozenset({"StageResult.ack", "StageRuntime.ack", "SlotPool.release_held",
                    "SlotPool.wake_held"})


def test_ctrl_c_while_a_chain_acknowledges_a_stage_leaves_nothing_held(
        open_pipeline: OpenPipeline, ledger: ResourceLedger) -> None:
    stages = [echo_stage("a"), echo_stage("b", transform="edge_echo.transforms:passthrough")]
    points, windows = _sweep(open_pipeline, ledger, stages, ACKING)
    assert points >= 3
    assert windows == [], f"{len(windows)} of {points} points left something held:\n" + (
        "\n".join(windows))


@pytest.mark.slow
@pytest.mark.parametrize("deadline_s", [None, 30.0], ids=["no-deadline", "deadline"])
def test_ctrl_c_at_every_point_of_a_call_sending_an_input_buffer_leaves_nothing_held(
        open_pipeline: OpenPipeline, ledger: ResourceLedger, deadline_s: float | None) -> None:
    # A one-stage run whose input is an input buffer (Pipeline.input_buffer: sent by
    # reference, claimed as the request is made and given back by the worker's end of
    # it). Once claimed, a Ctrl-C before the request was registered on the channel left
    # the buffer claimed for good (its next send refused with InputBufferBusy), or its
    # new generation stamped in the producer and not in the buffer (sent by copy from
    # then on). After each interrupt the buffer is refilled and sent again, by reference.
    # Its 512 KiB answer comes through shared memory (a reply not of the usual form, swept
    # as a stream's are)
    points, windows = _sweep(open_pipeline, ledger, [echo_stage("a")], first=not FULL_SWEEP,
                             deadline_s=deadline_s, source=_input_buffer)
    assert points > 100
    assert windows == [], f"{len(windows)} of {points} points left something held:\n" + (
        "\n".join(windows))


def _run_and_ack(pipeline: Pipeline, x: np.ndarray, deadline_s: float | None) -> None:
    """A ``run`` whose result is acknowledged under the tracer too (interrupted, the result
    is dropped: an unacknowledged one is acknowledged by the drain)."""
    pipeline.run({"x": x}, deadline_s=deadline_s).ack()


#: A result's acknowledgement: PipelineResult.ack, the release of the request's admission
#: slot and placement it calls (Pipeline's), the final stage's StageResult.ack (its slot)
#: and the release of its outputs' shared memory (to the worker's acknowledgement frame).
#: A Ctrl-C once left the slots held for good (PipelineResult.ack's mark set before its
#: release: the result then no longer handed to the drain), or the outputs' memory
#: (StageResult.release_outputs' list of it taken before each was released). _leave,
#: ServingLineup.leave_held and SlotPool.release_held were that release: named still, so
#: that a return to them is swept.
PIPELINE_ACK = frozenset({"PipelineResult.ack", "_leave", "_leave_once",
                          "ServingLineup.leave_held", "ServingLineup.left_held",
                          "SlotPool.release_held", "SlotPool.wake_held", "StageResult.ack",
                          "StageRuntime.ack", "StageResult.release_outputs",
                          "StageResult._give_back", "_Retention.release",
                          "_Retention.release.<locals>.<genexpr>", "Delivery.release",
                          "WorkerClient._ack"})


@pytest.mark.parametrize("source", [_tiny, _half_cap_buffer], ids=["inline", "shared-memory"])
def test_ctrl_c_while_a_result_is_acknowledged_leaves_nothing_held(
        open_pipeline: OpenPipeline, ledger: ResourceLedger, source: Source) -> None:
    # Every point of PipelineResult.ack's own code (and what it calls to give back the
    # request's slots and its answer's memory), with an inline answer and with one in
    # the worker's shared memory (32 MiB: one lost release fails the next call). Their
    # points alone (only=): a whole run swept with a 32 MiB answer is slow (and finds the
    # window of an answer's memory docs/runtime.md lists as not made safe: as the
    # request's stream is returned by edge_call)
    points, windows = _sweep(open_pipeline, ledger, [echo_stage("a")], PIPELINE_ACK,
                             first=not FULL_SWEEP, drive=_run_and_ack, source=source)
    assert points > 8
    assert windows == [], f"{len(windows)} of {points} points left something held:\n" + (
        "\n".join(windows))


def test_a_signal_is_acted_on_where_the_sweep_interrupts(open_pipeline: OpenPipeline) -> None:
    # Real SIGINTs, sent from another thread at random moments during tiny calls: the
    # handler sees the interrupted frame at one of the instructions the sweep covers.
    pipeline = open_pipeline(echo_stage("a"))
    x = np.arange(4, dtype=np.float32)
    seen: Counter[str] = Counter()
    where: list[str] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        assert frame is not None
        op = dis.opname[frame.f_code.co_code[frame.f_lasti]]
        seen[op] += 1
        if op not in _ACTED_ON_AT:
            code = frame.f_code
            where.append(f"{code.co_filename}:{frame.f_lineno} {code.co_qualname} {op}")

    main = threading.get_ident()
    stop = threading.Event()

    def pester() -> None:
        rng = random.Random(33)
        while not stop.wait(rng.random() * 0.0005):
            signal.pthread_kill(main, signal.SIGINT)

    before = signal.signal(signal.SIGINT, handler)
    thread = threading.Thread(target=pester, daemon=True)
    thread.start()
    try:
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            pipeline.run({"x": x}).ack()
    finally:
        stop.set()
        thread.join()
        signal.signal(signal.SIGINT, before)
    assert sum(seen.values()) > 100
    assert set(seen) <= _ACTED_ON_AT, (seen, where)


#: Where a call's reply is waited for, taken and made into its stage result (the wait,
#: the delivery taken from the call's queue, its event built, its outputs handed over as
#: RetainedOutputs, the pending call's next item, the result made): a Ctrl-C there once
#: lost an answer that came through the worker's shared memory before anything held it
#: (its memory leased by the worker until it was retired: docs/runtime.md)
TAKING = frozenset({"ChannelReader.wait", "Call.take", "CallEvents.__next__",
                    "Delivery.__getattr__", "_item", "_Retention.__init__",
                    "RetainedOutputs.__init__", "PendingCall._next", "PendingCall.result",
                    "StageResult.__init__"})


@pytest.mark.parametrize("length", [1, 2], ids=["one-stage", "two-stage"])
def test_ctrl_c_as_a_shared_memory_answer_is_taken_leaves_its_memory_given_back(
        open_pipeline: OpenPipeline, ledger: ResourceLedger, length: int) -> None:
    # A run whose 32 MiB answer comes through the worker's shared memory (half its cap:
    # one answer whose memory is not given back fails the next call with the worker's
    # ShmCapExceeded), interrupted at each point where its reply is waited for and taken
    # (TAKING alone: the whole call's sweep with answers this large is slow). Two stages:
    # the first's answer (scale 1: the chain's answer is still the buffer's times
    # ECHO_SCALE) is taken too, then copied into the second's request
    stages = [echo_stage("a")]
    if length == 2:
        stages = [echo_stage("a", scale=1.0),
                  echo_stage("b", transform="edge_echo.transforms:passthrough")]
    points, windows = _sweep(open_pipeline, ledger, stages, TAKING, first=not FULL_SWEEP,
                             source=_half_cap_buffer)
    assert points > 20
    assert windows == [], f"{len(windows)} of {points} points left something held:\n" + (
        "\n".join(windows))


@pytest.mark.slow
def test_ctrl_c_as_a_send_from_a_loop_leaves_the_loops_reading_of_the_channel_closed(
        open_pipeline: OpenPipeline) -> None:
    """Review40c: a Ctrl-C as ``_send_now`` returned from registering the call's end with
    the loop's reading of the channel abandoned the call, whose own registration replaced
    the loop's: the loop's count of its open calls stayed at 1 for good (it never stopped
    watching the channel, whose duplicate descriptor leaked once the loop closed). Each
    of ``_send_now``'s own points in turn; after each, the loop runs on, the next request
    is sent the same way and answered, and the loop's reading counts no call open."""
    pipeline = open_pipeline(echo_stage("a"))
    client = pipeline.stages[0].loaded.client  # type: ignore[attr-defined]
    x = np.arange(4, dtype=np.float32)
    loop = asyncio.new_event_loop()

    async def sent() -> Any:
        submission = pipeline.submit({"x": x}, loop=loop)
        done: asyncio.Future[None] = loop.create_future()
        submission.add_done_callback(partial(_set_done, done))
        await done
        return submission.result(0)

    def interrupted_at(k: int) -> tuple[int, str]:
        tracer = Interrupter(k, frozenset({"Pipeline._send_now"}))
        sys.settrace(tracer)
        try:
            loop.run_until_complete(sent()).ack()
        except KeyboardInterrupt:
            pass
        finally:
            sys.settrace(None)
        for task in asyncio.all_tasks(loop):
            task.cancel()
        loop.run_until_complete(asyncio.sleep(0.05))  # the loop runs on
        loop.run_until_complete(sent()).ack()  # the next request, the same way
        reading = client._loop_reading
        end = time.monotonic() + NEXT_CALL_S
        while reading is not None and reading._open and time.monotonic() < end:
            loop.run_until_complete(asyncio.sleep(0.01))
        left = f"the loop's reading counts {reading._open} call(s) open" if (
            reading is not None and reading._open) else ""
        return tracer.points, f"{tracer.where or 'completed'}: {left}" if left else ""

    try:
        for _ in range(3):
            loop.run_until_complete(sent()).ack()
        points, _ = interrupted_at(0)
        assert points > 5
        windows = [found for k in range(1, points + 1) if (found := interrupted_at(k)[1])]
        assert windows == [], "\n".join(windows)
    finally:
        loop.close()

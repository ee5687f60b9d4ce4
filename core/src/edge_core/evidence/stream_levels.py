"""Streamed requests measured: per class and level, a slow consumer, a cancellation.

Every request goes through the runtime's public API: ``Pipeline.submit`` with an
``on_event`` callback (:class:`~edge_core.evidence.streams.StreamRecorder`) for the
measured requests, the slow consumer and the cancellation; ``Pipeline.stream`` on the
calling thread for the matched blocks (:func:`timed_stream`). Boundaries and measures:
:mod:`edge_core.evidence.streams`.

- **levels** (:func:`stream_level`): ``count`` requests of one class by ``concurrency``
  client threads; a request that fails is recorded (class chain, layer) and its thread
  goes on.
- **slow consumer** (:func:`slow_consumer`): the reader stops for ``pause_s`` on the first
  event; the stage keeps producing. Recorded: the events created while the reader was
  stopped (they waited in the controller: *buffered*), their data bytes, the largest
  delivery lag, that every token still arrived in order, and the bound on what waited.
  The controller applies no back-pressure to a worker: it takes every event off the
  worker's channel into the request's own queue, so what it holds for a stopped reader is
  bounded by the request itself — at most its ``max_tokens`` events (for a stage that
  honours ``max_tokens``), each with its data — not by a buffer size.
- **cancellation** (:func:`cancellation`): ``Submission.cancel()`` after the first event;
  the time until ``cancel()`` returned (the stage's acknowledgement) and until the
  request ended, against the conformance kit's bound (``CANCEL_EFFECT_S``, 1 s), the
  events handed to ``on_event`` while ``cancel()`` ran (taken before the fence) and after
  it returned (none may be), and a next request served by the same pipeline.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from edge_core.evidence.streams import StreamRecorder, level_summary
from edge_core.evidence.workload import InputGroup, error_entry
from edge_core.runtime import Pipeline, RequestCancelled

__all__ = ["CANCEL_BOUND_S", "cancellation", "slow_consumer", "stream_level", "stream_request",
           "timed_stream"]

CANCEL_BOUND_S = 1.0
"""The conformance kit's bound on an in-place cancel taking effect
(``edge_core.testing.checks.CANCEL_EFFECT_S``)."""


def stream_request(pipeline: Pipeline, group: InputGroup, index: int,
                   deadline_s: float | None, chunk_seconds: float | None = None,
                   recorder: StreamRecorder | None = None) -> dict[str, Any]:
    """One streamed request through ``Pipeline.submit``: its stream sample."""
    record = recorder or StreamRecorder(chunk_seconds)
    record.start()
    submission = pipeline.submit(group.arrays, params=group.params(index),
                                 deadline_s=deadline_s, on_event=record.on_event)
    result = submission.result()
    done = time.monotonic_ns()
    try:
        return record.sample(result, done)
    finally:
        result.ack()


def stream_level(pipeline: Pipeline, group: InputGroup, concurrency: int, count: int,
                 deadline_s: float, tick: Callable[[], None],
                 chunk_seconds: float | None = None) -> dict[str, Any]:
    """``count`` streamed requests of ``group`` by ``concurrency`` client threads."""
    counter = itertools.count()
    samples: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    lock = threading.Lock()

    def client(thread: int) -> None:
        while True:
            index = next(counter)
            if index >= count:
                return
            try:
                sample = stream_request(pipeline, group, index, deadline_s, chunk_seconds)
            except Exception as exc:  # recorded; the level counts as failed, others go on
                with lock:
                    errors.append(error_entry(exc, index))
                tick()
                continue
            with lock:
                samples.append({"request": index, "thread": thread, **sample})
            tick()

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(t,), name=f"edge-profile-{t}")
               for t in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    samples.sort(key=lambda s: int(s["request"]))
    stage_ids = [r.stage_id for r in pipeline.stages]
    return {"concurrency": concurrency, "status": "failed" if errors else "measured",
            "errors": errors, "wall_s": wall,
            "throughput_rps": len(samples) / wall if wall > 0 else None,
            "stream": level_summary(samples, stage_ids), "samples": samples}


def timed_stream(pipeline: Pipeline, arrays: Mapping[str, Any],
                 params: Mapping[str, Any] | None,
                 deadline_s: float | None = None) -> dict[str, Any]:
    """One request read with ``Pipeline.stream`` on this thread: first event and end (s)."""
    started = time.perf_counter()
    first: float | None = None
    events = 0
    for _event, _tensors in pipeline.stream(arrays, params=params, deadline_s=deadline_s):
        if first is None:
            first = time.perf_counter() - started
        events += 1
    return {"first_event_s": first, "total_s": time.perf_counter() - started,
            "events": events}


def _bound(params: Mapping[str, Any] | None) -> dict[str, Any]:
    limit = (params or {}).get("max_tokens")
    return {"limit_events": limit if isinstance(limit, int) else None,
            "statement": "no back-pressure: the controller queues every event of the "
            "request off the worker's channel; what waits for a stopped reader is bounded by "
            "the request's own output (at most max_tokens events for a stage that honours "
            "max_tokens), not by a buffer size"}


def slow_consumer(pipeline: Pipeline, group: InputGroup, deadline_s: float,
                  pause_s: float, chunk_seconds: float | None = None) -> dict[str, Any]:
    """The reader stops on the first event for ``pause_s``; what waited, and for how long."""
    recorder = StreamRecorder(chunk_seconds, pause_first_s=pause_s)
    try:
        sample = stream_request(pipeline, group, 0, deadline_s, chunk_seconds, recorder)
    except Exception as exc:
        return {"pause_s": pause_s, "error": error_entry(exc)}
    events = sample["events"]
    resumed = recorder.resumed_ns
    buffered = [i for i, e in enumerate(events)
                if i > 0 and resumed is not None and int(e[0]) <= resumed]
    lags = [(int(e[1]) - int(e[0])) / 1e9 for e in events if int(e[0]) > 0]
    tokens = sum(int(e[2]) for e in events)
    bound = _bound(group.params(0))
    limit = bound["limit_events"]
    return {
        "pause_s": pause_s,
        "events": len(events),
        "tokens": tokens,
        "reported_tokens": sample["num_tokens"],
        "complete": sample["num_tokens"] is None or sample["num_tokens"] == tokens,
        "in_order": recorder.seqs == sorted(recorder.seqs),
        "buffered_events": len(buffered),
        "buffered_data_bytes": sum(recorder.data_bytes[i] for i in buffered),
        "delivery_gaps_ms": {"max": max(lags) * 1e3 if lags else None,
                             "first_after_pause": (lags[buffered[0]] * 1e3
                                                   if buffered else None)},
        "bound": bound,
        "within_bound": None if limit is None else len(buffered) <= limit,
        "sample": sample,
    }


def cancellation(pipeline: Pipeline, group: InputGroup, deadline_s: float,
                 chunk_seconds: float | None = None,
                 bound_s: float = CANCEL_BOUND_S) -> dict[str, Any]:
    """Cancel a streamed request after its first event; how fast, and what came after."""
    recorder = StreamRecorder(chunk_seconds)
    recorder.start()
    submission = pipeline.submit(group.arrays, params=group.params(0), deadline_s=deadline_s,
                                 on_event=recorder.on_event)
    waited = time.monotonic() + deadline_s
    while not recorder.first.wait(timeout=0.05):
        if submission.done() or time.monotonic() > waited:
            submission.cancel()
            with contextlib.suppress(Exception):
                submission.result(timeout_s=1.0).ack()
            return {"measured": False, "reason": "the request ended, or the deadline "
                    f"({deadline_s} s) passed, before its first event"}
    started = time.monotonic_ns()
    outcome = submission.cancel()
    answered = time.monotonic_ns()
    try:
        submission.result(timeout_s=deadline_s).ack()
        ended = "delivered (it finished before the cancel took effect)"
    except RequestCancelled:
        ended = "cancelled"
    except Exception as exc:  # recorded as it is
        ended = f"error: {type(exc).__name__}: {exc}"
    finished = time.monotonic_ns()
    # an on_event call begun while cancel() ran (its event taken before the fence) is
    # allowed; none may begin after it returned (the request's EventGate)
    before = sum(1 for e in recorder.events if int(e[1]) <= started)
    during = sum(1 for e in recorder.events if started < int(e[1]) <= answered)
    after = sum(1 for e in recorder.events if int(e[1]) > answered)
    row: dict[str, Any] = {
        "measured": True, "outcome": getattr(outcome, "value", str(outcome)), "ended": ended,
        "cancel_call_ms": (answered - started) / 1e6,
        "cancel_to_end_ms": (finished - started) / 1e6,
        "bound_ms": bound_s * 1e3,
        "within_bound": ((finished - started) / 1e9 <= bound_s) if ended == "cancelled"
        else None,
        "events_before_cancel": before, "events_during_cancel": during,
        "events_after_cancel": after,
    }
    try:
        next_sample = stream_request(pipeline, group, 1, deadline_s, chunk_seconds)
        row["next_request"] = {"served": True,
                               "ms_after_cancel": (next_sample["done_ns"] - started) / 1e6}
    except Exception as exc:
        row["next_request"] = {"served": False, "error": error_entry(exc)}
    return row

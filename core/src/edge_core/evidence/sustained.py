"""Sustained behaviour: one concurrency level for a duration, window by window, and its trend.

``edge profile --duration 30m`` keeps client threads (as many as the highest admitted
concurrency level) sending requests — the request classes, or input groups, in turn —
until the duration is over; requests in flight then finish (counted as
``completed_after_end``, in no window). Every ``window_s`` (a minute unless asked
otherwise) the calling thread records the window: requests completed in it, their
p50/p95 (``Pipeline.run`` to result; for streamed requests the time to first token and
the complete request), the worker trees' summed resident set at its end, the mean CPU
frequency and the hottest thermal zone where the machine exposes them
(:mod:`.conditions`), and the load average. The trend of each series is its
least-squares slope over the window midpoints, given per 10 minutes; fewer than two
windows with a value give no slope.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from edge_core.evidence import conditions
from edge_core.evidence.memory import tree_rss
from edge_core.evidence.stats import percentile
from edge_core.evidence.stream_levels import stream_request
from edge_core.evidence.workload import InputGroup, error_entry, timed_run
from edge_core.runtime import Pipeline

__all__ = ["slope", "sustained_run"]


def slope(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of ``(x, y)`` points (y per unit of x); None below two x values."""
    if len({x for x, _ in points}) < 2:
        return None
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    num = sum((x - mean_x) * (y - mean_y) for x, y in points)
    den = sum((x - mean_x) ** 2 for x, _ in points)
    return num / den


def _pcts(values: Sequence[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    ms = [v * 1e3 for v in values]
    return {"n": len(ms), "p50_ms": percentile(ms, 0.5), "p95_ms": percentile(ms, 0.95)}


def sustained_run(pipeline: Pipeline, groups: Sequence[InputGroup], *, concurrency: int,
                  duration_s: float, window_s: float, deadline_s: float, streamed: bool,
                  chunk_seconds: float | None = None,
                  sysfs: str | os.PathLike[str] | None = None,
                  say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run for ``duration_s`` at ``concurrency``; per-window figures and their trends."""
    tell = say or (lambda _message: None)
    started = time.monotonic()
    end = started + duration_s
    counter = itertools.count()
    done: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    lock = threading.Lock()

    def client() -> None:
        while time.monotonic() < end:
            index = next(counter)
            group = groups[index % len(groups)]
            try:
                if streamed:
                    sample = stream_request(pipeline, group, index, deadline_s, chunk_seconds)
                    events = sample["events"]
                    row = {"latency_s": sample["total_s"],
                           "ttft_s": ((int(events[0][1]) - sample["submitted_ns"]) / 1e9
                                      if events else None)}
                else:
                    row = {"latency_s": timed_run(pipeline, group.arrays, deadline_s,
                                                  group.params(index))["total_s"]}
            except Exception as exc:  # recorded; the run goes on
                with lock:
                    errors.append({**error_entry(exc, index),
                                   "at_s": time.monotonic() - started})
                continue
            with lock:
                done.append({**row, "at_s": time.monotonic() - started, "group": group.name})

    threads = [threading.Thread(target=client, name=f"edge-sustained-{t}")
               for t in range(concurrency)]
    for thread in threads:
        thread.start()
    marks: list[dict[str, Any]] = []
    count = max(1, int(-(-duration_s // window_s)))
    for number in range(count):
        stop = min(started + (number + 1) * window_s, end)
        time.sleep(max(0.0, stop - time.monotonic()))
        shot = conditions.snapshot(sysfs)
        marks.append({"end_s": stop - started, "rss_bytes": sum(tree_rss(pipeline).values()),
                      "mean_mhz": conditions.mean_mhz(shot),
                      "hottest_c": conditions.hottest(shot),
                      "load_average": shot["load_average"]})
        with lock:
            finished = sum(1 for d in done if d["at_s"] <= stop - started)
        tell(f"sustained: window {number + 1}/{count}, {finished} request(s) so far")
    for thread in threads:
        thread.join()
    windows = []
    previous = 0.0
    for mark in marks:
        inside = [d for d in done if previous < d["at_s"] <= mark["end_s"]]
        row: dict[str, Any] = {"start_s": previous, "end_s": mark["end_s"],
                               "requests": len(inside),
                               "latency": _pcts([d["latency_s"] for d in inside]),
                               "worker_rss_bytes": mark["rss_bytes"],
                               "mean_mhz": mark["mean_mhz"], "hottest_c": mark["hottest_c"],
                               "load_average": mark["load_average"]}
        if streamed:
            row["ttft"] = _pcts([d["ttft_s"] for d in inside if d["ttft_s"] is not None])
        windows.append(row)
        previous = mark["end_s"]

    def trend(value: Callable[[Mapping[str, Any]], Any]) -> dict[str, Any]:
        points = [((w["start_s"] + w["end_s"]) / 2, float(value(w))) for w in windows
                  if isinstance(value(w), int | float)]
        per_s = slope(points)
        return {"points": len(points),
                "per_10min": per_s * 600 if per_s is not None else None}

    trends = {
        "p50_ms": trend(lambda w: w["latency"].get("p50_ms")),
        "p95_ms": trend(lambda w: w["latency"].get("p95_ms")),
        "worker_rss_bytes": trend(lambda w: w["worker_rss_bytes"]),
        "mean_mhz": trend(lambda w: w["mean_mhz"]),
        "hottest_c": trend(lambda w: w["hottest_c"]),
    }
    if streamed:
        trends["ttft_p95_ms"] = trend(lambda w: w["ttft"].get("p95_ms"))
    return {"concurrency": concurrency, "duration_s": duration_s, "window_s": window_s,
            "seconds": time.monotonic() - started, "requests": len(done),
            "completed_after_end": sum(1 for d in done if d["at_s"] > previous),
            "errors": errors, "windows": windows, "trend": trends,
            "classes": [g.name for g in groups]}

"""Streamed requests: what one stream sample records, and the measures taken from it.

A *stream sample* is one request whose final stage sent non-terminal events (tokens from
a generate stage, audio chunks from a speech stage) before its terminal one. It records,
in the controller (:class:`StreamRecorder`, the ``on_event`` of ``Pipeline.submit``):

- ``submitted_ns``: ``time.monotonic_ns()`` just before ``Pipeline.submit`` (waiting for
  admission counts);
- per event, ``[created_ns, arrived_ns, tokens, duration_s]``: the worker's creation
  time (its monotonic clock, the same clock as the controller's on one Linux machine),
  the controller's arrival time, how many tokens it carries (``len(data["token_ids"])``,
  else 1: a chunk) and the media seconds it carries (``data["duration_s"]``, else the
  declared chunk length, else ``None``);
- ``done_ns``: the result delivered; ``done_created_ns``: the terminal event's creation;
  the terminal event's ``prompt_tokens`` and ``num_tokens`` where the stage reports them.

Measures (:func:`request_measures`; all from controller arrival times unless named
``worker_``):

- **time to first token** ``ttft``: first event's arrival - submission;
- **decode**: the tokens after the first token-carrying event, over the time from that
  event's arrival to the last token-carrying one's. A delta of *k* tokens arriving *g*
  after the previous one counts *k* intervals of *g/k*: intervals and rates are per
  token, and ``decode rate x mean interval = 1`` on the same tokens by construction;
- **effective prefill rate**: prompt tokens / time to first token (queueing included:
  it is what the caller sees, not the engine's kernel rate);
- **complete request**: ``done_ns - submitted_ns``; **tail (flush)**: ``done_ns`` - the
  last event's arrival;
- **real time** (events with a media duration): the first chunk's time, and a playback
  that starts when the first chunk arrives and plays each chunk for its duration: a
  *deficit* is the playback running dry before the next chunk arrived (its count and
  total seconds); the **real-time factor** is (last chunk's arrival - submission) / media
  seconds (below 1: faster than real time).

:func:`level_summary` pools the requests of one class at one concurrency level.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from edge_contracts.requests import StageEvent
from edge_core.evidence.stats import percentile, summarise

__all__ = ["StreamRecorder", "event_tokens", "level_summary", "request_measures"]


def event_tokens(data: Mapping[str, Any]) -> int:
    """Tokens an event carries: ``len(token_ids)``, else ``tokens``, else 1 (a chunk)."""
    ids = data.get("token_ids")
    if isinstance(ids, list | tuple):
        return len(ids)
    count = data.get("tokens")
    if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
        return count
    return 1


class StreamRecorder:
    """Records one streamed request's events as they arrive (``on_event`` of submit).

    ``pause_first_s``: the consumer stops for that long on the first event (the
    slow-consumer case: the callback runs on the request's thread, so the pipeline
    delivers nothing to it meanwhile). ``first`` is set when the first event arrived.
    """

    def __init__(self, chunk_seconds: float | None = None, pause_first_s: float = 0.0) -> None:
        self.chunk_seconds = chunk_seconds
        self.pause_first_s = pause_first_s
        self.submitted_ns = 0
        self.events: list[list[Any]] = []
        self.data_bytes: list[int] = []
        self.seqs: list[int] = []
        self.first = threading.Event()
        self.resumed_ns: int | None = None

    def start(self) -> None:
        """Mark the submission (call just before ``Pipeline.submit``)."""
        self.submitted_ns = time.monotonic_ns()

    def on_event(self, event: StageEvent, _tensors: Mapping[str, Any]) -> None:
        """Record one non-terminal event (never keeps the tensors)."""
        arrived = time.monotonic_ns()
        data = event.data or {}
        duration = data.get("duration_s")
        if not isinstance(duration, int | float) or isinstance(duration, bool):
            duration = self.chunk_seconds
        self.events.append([event.created_ns, arrived, event_tokens(data), duration])
        self.seqs.append(event.seq)
        self.data_bytes.append(len(str(dict(data))))
        if not self.first.is_set():
            self.first.set()
            if self.pause_first_s > 0:
                time.sleep(self.pause_first_s)
                self.resumed_ns = time.monotonic_ns()

    def sample(self, result: Any, done_ns: int) -> dict[str, Any]:
        """The stream sample of a finished request (``result``: its PipelineResult)."""
        final = result.final
        data = dict(getattr(final, "data", None) or {})
        events = getattr(final, "events", ()) or ()
        terminal = events[-1] if events else None
        return {
            "submitted_ns": self.submitted_ns, "events": self.events,
            "done_ns": done_ns,
            "done_created_ns": terminal.created_ns if terminal is not None else None,
            "prompt_tokens": _count(data.get("prompt_tokens")),
            "num_tokens": _count(data.get("num_tokens")),
            "finish_reason": data.get("finish_reason"),
            "stages_s": dict(result.latencies),
            "total_s": (done_ns - self.submitted_ns) / 1e9,
        }


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _per_token_intervals(times: Sequence[int], tokens: Sequence[int]) -> list[float]:
    """Seconds per token after the first event: each gap split over its event's tokens.

    ``times`` and ``tokens`` are those of the token-carrying events only.
    """
    intervals: list[float] = []
    for index in range(1, len(times)):
        count = tokens[index]
        gap = (times[index] - times[index - 1]) / 1e9
        intervals.extend([gap / count] * count)
    return intervals


def _realtime(sample: Mapping[str, Any]) -> dict[str, Any] | None:
    events = sample["events"]
    if not events or any(e[3] is None for e in events):
        return None
    submitted = sample["submitted_ns"]
    media = sum(float(e[3]) for e in events)
    playing_until = events[0][1] / 1e9 + float(events[0][3])
    deficits: list[float] = []
    gaps = []
    for previous, event in itertools.pairwise(events):
        arrived = event[1] / 1e9
        gaps.append(arrived - previous[1] / 1e9)
        if arrived > playing_until:
            deficits.append(arrived - playing_until)
            playing_until = arrived
        playing_until += float(event[3])
    last = events[-1][1]
    return {
        "first_chunk_s": (events[0][1] - submitted) / 1e9,
        "media_s": media,
        "chunks": len(events),
        "rtf": ((last - submitted) / 1e9) / media if media > 0 else None,
        "deficits": len(deficits),
        "deficit_s": sum(deficits),
        "chunk_gaps_s": gaps,
    }


def request_measures(sample: Mapping[str, Any]) -> dict[str, Any]:
    """The measures of one stream sample (seconds; see the module's boundaries)."""
    events = sample["events"]
    arrived = [int(e[1]) for e in events]
    created = [int(e[0]) for e in events]
    tokens = [int(e[2]) for e in events]
    submitted = int(sample["submitted_ns"])
    done = int(sample["done_ns"])
    found: dict[str, Any] = {"events": len(events), "tokens": sum(tokens),
                             "complete_s": (done - submitted) / 1e9}
    if not events:
        return found
    carrying = [i for i, count in enumerate(tokens) if count > 0]
    token_arrived = [arrived[i] for i in carrying]
    token_created = [created[i] for i in carrying]
    token_counts = [tokens[i] for i in carrying]
    decode_tokens = sum(token_counts[1:])
    decode_s = (token_arrived[-1] - token_arrived[0]) / 1e9 if carrying else 0.0
    ttft = (arrived[0] - submitted) / 1e9
    prompt = sample.get("prompt_tokens")
    found.update({
        "ttft_s": ttft,
        "decode_tokens": decode_tokens,
        "decode_s": decode_s,
        "intervals_s": _per_token_intervals(token_arrived, token_counts),
        "worker_intervals_s": _per_token_intervals(token_created, token_counts),
        "delivery_lag_s": [(a - c) / 1e9 for a, c in zip(arrived, created, strict=True)
                           if c > 0],
        "tail_s": (done - arrived[-1]) / 1e9,
        "prefill_tokens_per_s": prompt / ttft if isinstance(prompt, int) and ttft > 0
        else None,
    })
    if sample.get("done_created_ns"):
        found["worker_tail_s"] = (int(sample["done_created_ns"]) - created[-1]) / 1e9
    realtime = _realtime(sample)
    if realtime is not None:
        found["realtime"] = realtime
    return found


def _ms(values: Sequence[float]) -> dict[str, float | int]:
    return summarise(list(values))


def _rate(values: Sequence[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    return {"n": len(values), "p50": percentile(values, 0.5), "p95": percentile(values, 0.95),
            "min": min(values), "max": max(values)}


def level_summary(samples: Sequence[Mapping[str, Any]],
                  stage_ids: Sequence[str] = ()) -> dict[str, Any]:
    """The pooled measures of one class at one concurrency level.

    ``ttft_ms``, ``inter_token_ms`` (every per-token interval), ``decode_tokens_per_s``
    (all decode tokens over all decode time: ``n`` is the tokens counted, ``requests``
    the requests that had any), ``prefill_tokens_per_s``, ``tokens``, ``request_ms``,
    ``tail_ms``, ``realtime`` (first chunk, RTF, deficits) and each stage's share of
    the request, each with its sample count.
    """
    measured = [request_measures(s) for s in samples]
    streamed = [m for m in measured if m["events"]]
    intervals = [i for m in streamed for i in m["intervals_s"]]
    decode_tokens = sum(m["decode_tokens"] for m in streamed)
    decode_s = sum(m["decode_s"] for m in streamed)
    prefill = [m["prefill_tokens_per_s"] for m in streamed
               if m.get("prefill_tokens_per_s") is not None]
    prompt_total = sum(int(s["prompt_tokens"]) for s, m in zip(samples, measured, strict=True)
                       if m["events"] and isinstance(s.get("prompt_tokens"), int))
    ttft_total = sum(m["ttft_s"] for s, m in zip(samples, measured, strict=True)
                     if m["events"] and isinstance(s.get("prompt_tokens"), int))
    reported = [s["num_tokens"] for s in samples if isinstance(s.get("num_tokens"), int)]
    summary: dict[str, Any] = {
        "n": len(samples),
        "streamed": len(streamed),
        "ttft_ms": _ms([m["ttft_s"] for m in streamed]),
        "inter_token_ms": _ms(intervals),
        "worker_inter_token_ms": _ms([i for m in streamed for i in m["worker_intervals_s"]]),
        "delivery_lag_ms": _ms([i for m in streamed for i in m["delivery_lag_s"]]),
        "decode_tokens_per_s": {
            "n": decode_tokens, "requests": sum(1 for m in streamed if m["decode_tokens"]),
            "pooled": decode_tokens / decode_s if decode_s > 0 else None,
            "per_request": _rate([m["decode_tokens"] / m["decode_s"] for m in streamed
                                  if m["decode_s"] > 0]),
        },
        "prefill_tokens_per_s": {
            "n": len(prefill), "pooled": prompt_total / ttft_total if ttft_total > 0 else None,
            "per_request": _rate(prefill)},
        "tokens": {"n": len(measured), "total": sum(m["tokens"] for m in measured),
                   "reported_total": sum(reported) if reported else None,
                   "per_request": _rate([float(m["tokens"]) for m in measured])},
        "request_ms": _ms([m["complete_s"] for m in measured]),
        "tail_ms": _ms([m["tail_s"] for m in streamed]),
    }
    realtime = [m["realtime"] for m in streamed if "realtime" in m]
    if realtime:
        summary["realtime"] = {
            "n": len(realtime),
            "first_chunk_ms": _ms([r["first_chunk_s"] for r in realtime]),
            "rtf": _rate([r["rtf"] for r in realtime if r["rtf"] is not None]),
            "deficits": sum(r["deficits"] for r in realtime),
            "deficit_s": sum(r["deficit_s"] for r in realtime),
            "requests_with_deficits": sum(1 for r in realtime if r["deficits"]),
            "chunk_gap_ms": _ms([g for r in realtime for g in r["chunk_gaps_s"]]),
            "media_s": sum(r["media_s"] for r in realtime),
        }
    if stage_ids:
        totals = [float(s["total_s"]) for s in samples]
        summary["stages"] = {
            sid: {**_ms([float(s["stages_s"][sid]) for s in samples if sid in s["stages_s"]]),
                  "share_of_request": (
                      sum(float(s["stages_s"].get(sid, 0.0)) for s in samples) / sum(totals)
                      if sum(totals) > 0 else None)}
            for sid in stage_ids}
    return summary

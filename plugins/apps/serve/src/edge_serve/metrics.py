"""``GET /metrics``: the server's Prometheus metrics, on a registry of its own.

Counted as requests are served:

* ``edge_requests_total{pipeline, route, outcome}`` — every request by outcome (``ok``,
  ``bad_request``, ``refused``, ``deadline``, ...; see :data:`edge_serve.outcomes.OUTCOMES`);
* ``edge_request_seconds{pipeline, route}`` — request latency as the server saw it;
* ``edge_stage_seconds{pipeline, stage}`` — each stage's latency (from the runtime);
* ``edge_admission_refusals_total{pipeline}`` — requests refused because admission was full
  (and its queue too);
* ``edge_queue_wait_seconds{pipeline}`` — how long each request waited for admission
  (0 for one admitted at once; those that left the queue unadmitted included);
* ``edge_queue_refusals_total{pipeline, reason}`` — requests that left the admission queue
  without being admitted: ``full`` (429), ``deadline`` (504), ``disconnected``,
  ``stopping`` (:mod:`edge_serve.queueing`);
* ``edge_header_timeouts_total{answer}`` — connections closed because no whole request
  head arrived within ``--header-timeout`` (:mod:`edge_serve.heads`): ``408`` when part of
  one had arrived, ``closed`` when nothing had.
* ``edge_header_too_large_total`` — connections refused 431 for a request head over
  :data:`~edge_serve.heads.MAX_HEAD_BYTES`.
* ``edge_body_timeouts_total{reason}`` — request bodies cut 408 (:mod:`edge_serve.guards`):
  ``stalled`` when no more of one arrived for ``--body-timeout``, ``slow`` when one
  arrived slower than ``--body-min-rate`` allows, ``evicted`` when one behind was cut to
  make room at the connection cap (each also counted as a request, outcome
  ``body_timeout``; an evicted one also in ``edge_connections_evicted_total``).

Counted by the connection cap (:mod:`edge_serve.connections`), read at each scrape:

* ``edge_connections_refused_total`` — connections closed as soon as they were accepted,
  the cap reached and every connection busy;
* ``edge_connections_evicted_total`` — connections closed to make room for a new one at
  the cap: idle ones (waiting for a request head), and those reading a body that was
  behind (answered 408);
* ``edge_connections_open`` / ``edge_connections_limit`` — connections open now, and the
  cap (``--max-connections``).

Read from the runtime at each scrape:

* ``edge_ledger_reserved_bytes{pool}`` / ``edge_ledger_capacity_bytes{pool}`` /
  ``edge_ledger_quarantined_bytes{pool}`` — the shared ledger;
* ``edge_worker_restarts_total{pipeline, stage}`` — restarts (generations after the first);
* ``edge_stage_up{pipeline, stage, state}`` — 1 for the state each stage is in, as
  ``/health`` judges it (:meth:`~edge_serve.served.ServedPipeline.readiness`):
  ``bundle-changed`` instead of ``ready`` (or ``degraded``) for a stage whose bundle
  changed since it loaded, while ``/health`` is 503 naming it;
* ``edge_queue_length{pipeline}`` / ``edge_queue_limit{pipeline}`` — requests waiting for
  admission now, and how many may.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from edge_core.ledger import ResourceLedger
from edge_serve.connections import ConnectionCap
from edge_serve.histograms import LabelledCounter, LabelledHistogram
from edge_serve.served import ServedPipeline

__all__ = ["CONTENT_TYPE", "ServerMetrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The Prometheus text exposition format."""

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0, 30.0, 60.0)


class _RuntimeCollector(Collector):
    """Ledger pools, stage states and worker restarts, read at scrape time."""

    def __init__(self, ledger: ResourceLedger,
                 pipelines: Callable[[], Iterable[ServedPipeline]]) -> None:
        self._ledger = ledger
        self._pipelines = pipelines

    def collect(self) -> Iterator[Metric]:
        pools = self._ledger.snapshot()["pools"]
        reserved = GaugeMetricFamily("edge_ledger_reserved_bytes",
                                     "Bytes reserved on each memory pool", labels=["pool"])
        capacity = GaugeMetricFamily("edge_ledger_capacity_bytes",
                                     "Capacity of each memory pool (its ceiling, else its "
                                     "observed total)", labels=["pool"])
        quarantined = GaugeMetricFamily("edge_ledger_quarantined_bytes",
                                        "Bytes held in quarantine (retirement unverified)",
                                        labels=["pool"])
        for name, pool in pools.items():
            reserved.add_metric([name], pool["reserved"])
            quarantined.add_metric([name], pool["quarantined"])
            if pool["capacity"] is not None:
                capacity.add_metric([name], pool["capacity"])
        restarts = CounterMetricFamily("edge_worker_restarts",
                                       "Worker restarts of each stage (generations after the "
                                       "first)", labels=["pipeline", "stage"])
        up = GaugeMetricFamily("edge_stage_up", "1 for the state each stage is in",
                               labels=["pipeline", "stage", "state"])
        switches = CounterMetricFamily("edge_placement_switches",
                                       "Switches of a stage to a measured-better candidate "
                                       "(start = first-ready)", labels=["pipeline", "stage"])
        waiting = GaugeMetricFamily("edge_queue_length",
                                    "Requests waiting for the pipeline's admission now",
                                    labels=["pipeline"])
        limit = GaugeMetricFamily("edge_queue_limit",
                                  "Requests that may wait for the pipeline's admission",
                                  labels=["pipeline"])
        placement = GaugeMetricFamily("edge_placement_number",
                                      "The placement requests start on (1 at open, one more "
                                      "at each switch)", labels=["pipeline"])
        for served in self._pipelines():
            waiting.add_metric([served.name], served.queue.waiting)
            limit.add_metric([served.name], served.queue.policy.length)
            for stage, count in served.restarts().items():
                restarts.add_metric([served.name, stage], count)
            for stage, state in served.readiness().items():  # as /health reads it
                up.add_metric([served.name, stage, state], 1)
            health = served.pipeline.health()["placement"]
            placement.add_metric([served.name], health["number"])
            counted: dict[str, int] = {}
            for event in health["switches"]:
                counted[event["stage"]] = counted.get(event["stage"], 0) + 1
            for stage, count in counted.items():
                switches.add_metric([served.name, stage], count)
        yield from (reserved, capacity, quarantined, restarts, up, switches, placement,
                    waiting, limit)


class _ConnectionCollector(Collector):
    """The connection cap's counts, read at scrape time (nothing is counted twice)."""

    def __init__(self, cap: ConnectionCap) -> None:
        self._cap = cap

    def collect(self) -> Iterator[Metric]:
        cap = self._cap
        yield CounterMetricFamily("edge_connections_refused",
                                  "Connections closed as soon as they were accepted: the cap "
                                  "reached and every connection busy", value=cap.refused)
        yield CounterMetricFamily("edge_connections_evicted",
                                  "Connections closed to make room for a new one at the cap: "
                                  "idle (waiting for a request head), or reading a body "
                                  "behind (answered 408)", value=cap.evicted)
        yield GaugeMetricFamily("edge_connections_open", "Connections open now",
                                value=cap.open)
        yield GaugeMetricFamily("edge_connections_limit",
                                "The most connections open at once (--max-connections)",
                                value=cap.limit)


class ServerMetrics:
    """The server's metrics and their registry."""

    def __init__(self, ledger: ResourceLedger,
                 pipelines: Callable[[], Iterable[ServedPipeline]]) -> None:
        self.registry = CollectorRegistry()
        # Counted on every request: a counter that costs one short call
        self.requests = LabelledCounter("edge_requests", "HTTP requests by outcome",
                                        ["pipeline", "route", "outcome"])
        self.registry.register(self.requests)
        # Observed on every request: histograms that cost one short call each
        self.request_seconds = self._histogram(LabelledHistogram(
            "edge_request_seconds", "HTTP request latency", ["pipeline", "route"],
            _LATENCY_BUCKETS))
        self.stage_seconds = self._histogram(LabelledHistogram(
            "edge_stage_seconds", "Latency of each stage", ["pipeline", "stage"],
            _LATENCY_BUCKETS))
        self.admission_refusals = Counter("edge_admission_refusals",
                                          "Requests refused because admission was full",
                                          ["pipeline"], registry=self.registry)
        self.queue_wait = self._histogram(LabelledHistogram(
            "edge_queue_wait_seconds", "How long requests waited for admission",
            ["pipeline"], _LATENCY_BUCKETS))
        self.queue_refusals = Counter("edge_queue_refusals",
                                      "Requests that left the admission queue unadmitted, "
                                      "by reason (full, deadline, disconnected, stopping)",
                                      ["pipeline", "reason"], registry=self.registry)
        self.header_timeouts = Counter("edge_header_timeouts",
                                       "Connections closed because no whole request head "
                                       "arrived within --header-timeout, by answer (408, "
                                       "closed)", ["answer"], registry=self.registry)
        for answer in ("408", "closed"):
            self.header_timeouts.labels(answer)
        self.header_too_large = Counter("edge_header_too_large",
                                        "Connections refused 431 for a request head over "
                                        "the server's bound", registry=self.registry)
        self.body_timeouts = Counter("edge_body_timeouts",
                                     "Request bodies cut 408, by reason: stalled (nothing "
                                     "for --body-timeout), slow (under --body-min-rate), "
                                     "evicted (behind, cut to make room at the connection "
                                     "cap)", ["reason"], registry=self.registry)
        for reason in ("stalled", "slow", "evicted"):
            self.body_timeouts.labels(reason)
        self.registry.register(_RuntimeCollector(ledger, pipelines))

    def _histogram(self, histogram: LabelledHistogram) -> LabelledHistogram:
        self.registry.register(histogram)
        return histogram

    def watch_connections(self, cap: ConnectionCap) -> None:
        """Read the connection cap's counts at each scrape (once; it counts them itself)."""
        self.registry.register(_ConnectionCollector(cap))

    def count_header_timeout(self, answer: str) -> None:
        """Count one connection closed for a slow head (``answer``: ``408`` or ``closed``)."""
        self.header_timeouts.labels(answer).inc()

    def count_body_timeout(self, reason: str) -> None:
        """Count one request body cut 408 (``reason``: ``stalled``, ``slow``, ``evicted``)."""
        self.body_timeouts.labels(reason).inc()

    def count_head_too_large(self) -> None:
        """Count one connection refused 431 for a request head over the bound."""
        self.header_too_large.inc()

    def observe_queue(self, pipeline: str, outcome: str, waited_s: float) -> None:
        """Record one request leaving the admission queue (``admitted`` or a reason)."""
        self.queue_wait.observe((pipeline,), waited_s)
        if outcome != "admitted":
            self.queue_refusals.labels(pipeline, outcome).inc()

    def observe_stages(self, pipeline: str, latencies: dict[str, float]) -> None:
        """Record each stage's latency of one request."""
        for stage, seconds in latencies.items():
            self.stage_seconds.observe((pipeline, stage), seconds)

    def observe_request(self, pipeline: str, route: str, outcome: str,
                        seconds: float) -> None:
        """Count one finished request and its latency."""
        self.requests.inc((pipeline, route, outcome))
        self.request_seconds.observe((pipeline, route), seconds)
        if outcome == "refused" and pipeline:
            self.admission_refusals.labels(pipeline).inc()

    def render(self) -> bytes:
        """The text exposition of every metric."""
        return generate_latest(self.registry)

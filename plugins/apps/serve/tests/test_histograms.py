"""LabelledHistogram and LabelledCounter: what a scrape shows equals prometheus_client's
Histogram's and Counter's, for the same observations (the ``_created`` timestamps aside,
each its own)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from edge_serve.histograms import LabelledCounter, LabelledHistogram

BOUNDS = (0.001, 0.0025, 0.01, 1.0, 60.0)
#: Below, on and between every bound, above the last, negative, zero.
VALUES = (-1.0, 0.0, 0.0005, 0.001, 0.002, 0.0025, 0.003, 0.01, 0.5, 1.0, 59.9, 60.0, 61.0,
          1e9)


def _text(registry: CollectorRegistry) -> list[str]:
    """The scrape's lines, each ``_created`` value masked."""
    return [re.sub(r"^(\S+_created\{.*\}) .*$", r"\1 T", line)
            for line in generate_latest(registry).decode().splitlines()]


def _pair() -> tuple[CollectorRegistry, Histogram, CollectorRegistry, LabelledHistogram]:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    reference = Histogram("edge_x_seconds", "Doc", ["pipeline", "stage"], buckets=BOUNDS,
                          registry=theirs)
    lean = LabelledHistogram("edge_x_seconds", "Doc", ["pipeline", "stage"], BOUNDS)
    ours.register(lean)
    return theirs, reference, ours, lean


def test_it_writes_what_prometheus_client_writes_for_the_same_observations() -> None:
    theirs, reference, ours, lean = _pair()
    assert _text(ours) == _text(theirs)  # no label set observed yet: HELP and TYPE alone
    for index, value in enumerate(VALUES):
        labels = ("echo", "a") if index % 3 else ("ocr", "b\"\\\n")  # escaped as theirs
        reference.labels(*labels).observe(value)
        lean.observe(labels, value)
    text = _text(ours)
    assert text == _text(theirs)
    assert 'edge_x_seconds_bucket{le="+Inf",pipeline="echo",stage="a"} 9.0' in text
    assert any(line.startswith("edge_x_seconds_created{") for line in text)


def test_observations_from_many_threads_are_all_counted() -> None:
    theirs, reference, ours, lean = _pair()

    def observe() -> None:
        for value in VALUES * 50:
            lean.observe(("echo", "a"), value)

    threads = [threading.Thread(target=observe) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for value in VALUES * 200:
        reference.labels("echo", "a").observe(value)
    assert _text(ours) == _text(theirs)


def test_created_is_left_out_where_prometheus_client_leaves_it_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PROMETHEUS_DISABLE_CREATED_SERIES", "True")
    registry = CollectorRegistry()
    histogram = LabelledHistogram("edge_x_seconds", "Doc", ["pipeline"], BOUNDS)
    registry.register(histogram)
    histogram.observe(("echo",), 0.5)
    assert "_created" not in generate_latest(registry).decode()


@pytest.mark.parametrize("buckets", [(), (1.0, 0.5), (0.5, 0.5)])
def test_bounds_not_strictly_ascending_are_refused(buckets: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="buckets"):
        LabelledHistogram("edge_x_seconds", "Doc", ["pipeline"], buckets)


def test_labels_that_do_not_match_the_names_are_refused() -> None:
    histogram = LabelledHistogram("edge_x_seconds", "Doc", ["pipeline", "stage"], BOUNDS)
    with pytest.raises(ValueError, match="edge_x_seconds"):
        histogram.observe(("echo",), 0.5)


def _counters() -> tuple[CollectorRegistry, Counter, CollectorRegistry, LabelledCounter]:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    reference = Counter("edge_x", "Doc", ["pipeline", "outcome"], registry=theirs)
    lean = LabelledCounter("edge_x", "Doc", ["pipeline", "outcome"])
    ours.register(lean)
    return theirs, reference, ours, lean


def test_the_counter_writes_what_prometheus_client_writes_for_the_same_counts() -> None:
    theirs, reference, ours, lean = _counters()
    assert _text(ours) == _text(theirs)  # nothing counted yet: HELP and TYPE alone
    for index in range(7):
        labels = ("echo", "ok") if index % 3 else ("ocr", "b\"\\\n")  # escaped as theirs
        reference.labels(*labels).inc()
        lean.inc(labels)
    text = _text(ours)
    assert text == _text(theirs)
    assert 'edge_x_total{outcome="ok",pipeline="echo"} 4.0' in text
    assert any(line.startswith("edge_x_created{") for line in text)


def test_counts_from_many_threads_are_all_counted() -> None:
    theirs, reference, ours, lean = _counters()

    def count() -> None:
        for _ in range(2000):
            lean.inc(("echo", "ok"))

    threads = [threading.Thread(target=count) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    reference.labels("echo", "ok").inc(8000)
    assert _text(ours) == _text(theirs)


def test_the_counters_created_is_left_out_where_prometheus_client_leaves_it_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PROMETHEUS_DISABLE_CREATED_SERIES", "True")
    registry = CollectorRegistry()
    counter = LabelledCounter("edge_x", "Doc", ["pipeline"])
    registry.register(counter)
    counter.inc(("echo",))
    assert "_created" not in generate_latest(registry).decode()


def test_counter_labels_that_do_not_match_the_names_are_refused() -> None:
    counter = LabelledCounter("edge_x", "Doc", ["pipeline", "outcome"])
    with pytest.raises(ValueError, match="edge_x"):
        counter.inc(("echo",))


_SCRAPE = """
from edge_core.ledger import ResourceLedger
from edge_core.pools import Pool
from edge_serve.metrics import ServerMetrics
metrics = ServerMetrics(ResourceLedger([Pool(name="machine:ram", total=1 << 30)]), lambda: [])
metrics.observe_request("echo", "/v1/pipelines/{name}/run", "ok", 0.01)
print(metrics.render().decode())
"""


@pytest.mark.parametrize("value", ["1", "t", "True", "false"])
def test_created_series_are_left_out_where_prometheus_client_leaves_them_out(
    value: str,
) -> None:
    """``PROMETHEUS_DISABLE_CREATED_SERIES`` read as prometheus_client reads it: ``true``,
    ``1`` or ``t`` in any case leave the counter's and the histogram's ``_created`` out
    (``1`` and ``t`` showed them; review 39b). A fresh interpreter: prometheus_client reads
    the variable as it is imported."""
    env = {**os.environ, "PROMETHEUS_DISABLE_CREATED_SERIES": value}
    text = subprocess.run([sys.executable, "-c", _SCRAPE], env=env, check=True,
                          capture_output=True, text=True).stdout
    assert 'edge_requests_total{outcome="ok",pipeline="echo"' in text
    assert "edge_request_seconds_count{" in text
    shown = value == "false"
    assert ("edge_requests_created" in text) is shown
    assert ("edge_request_seconds_created" in text) is shown

"""A labelled Prometheus histogram (and counter) that costs one short call per observation.

``prometheus_client.Histogram`` does, per observation, a label check, a locked add to its
sum and a walk over its bounds to the bucket, whose count is a locked add of its own:
about a hundred and fifty bytecodes, and ``edge serve`` observes three histograms per
request. :class:`LabelledHistogram` keeps each label set's counts in one list (the bucket
found by :func:`bisect.bisect_left`, in C) under one lock, and makes the cumulative
buckets only when ``/metrics`` is scraped, as a collector on the server's registry. What
a scrape shows is what ``prometheus_client.Histogram`` shows for the same observations:
the ``_bucket`` samples (``le`` as it writes bounds), ``_count``, ``_sum`` and
``_created``, the last left out where ``PROMETHEUS_DISABLE_CREATED_SERIES`` is true, as
there. :class:`LabelledCounter` is the same for a counter: what a scrape shows is what
``prometheus_client.Counter`` shows (``_total`` and ``_created``), one call an increment
where ``Counter``'s child and its value took five.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

__all__ = ["LabelledCounter", "LabelledHistogram", "created_series"]


def created_series() -> bool:
    """Whether ``_created`` samples are shown (read as prometheus_client reads it).

    Not where ``PROMETHEUS_DISABLE_CREATED_SERIES`` is ``true``, ``1`` or ``t``, in any case.
    """
    return os.environ.get("PROMETHEUS_DISABLE_CREATED_SERIES",
                          "False").lower() not in ("true", "1", "t")


class _Series:
    """One label set's counts: per bucket (the last ``+Inf``), their sum, when it began."""

    __slots__ = ("counts", "created", "total")

    def __init__(self, buckets: int) -> None:
        self.counts = [0] * buckets
        self.total = 0.0
        self.created = time.time()


class LabelledHistogram(Collector):
    """A histogram family by label values, observed from any thread.

    Args:
        name: The metric's name (``_bucket``, ``_count``, ``_sum``, ``_created`` added).
        documentation: Its help text.
        labelnames: Its label names, in the order :meth:`observe` takes the values.
        buckets: Its finite upper bounds, ascending (``+Inf`` is added).
    """

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str],
                 buckets: Sequence[float]) -> None:
        bounds = [float(bound) for bound in buckets]
        if not bounds or bounds != sorted(bounds) or len(set(bounds)) != len(bounds):
            raise ValueError(f"buckets: {list(buckets)!r}: finite bounds, strictly ascending")
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._bounds = tuple(bounds)
        self._le: tuple[str, ...] = tuple(
            floatToGoString(bound)  # type: ignore[no-untyped-call]
            for bound in (*bounds, float("inf")))
        self._series: dict[tuple[str, ...], _Series] = {}
        self._lock = threading.Lock()
        self._created = created_series()

    def observe(self, labels: tuple[str, ...], value: float) -> None:
        """Count ``value`` for the label values ``labels`` (one per label name)."""
        series = self._series.get(labels)
        if series is None:
            if len(labels) != len(self.labelnames):
                raise ValueError(f"{self.name}: labels {labels!r} for "
                                 f"{list(self.labelnames)!r}")
            with self._lock:
                series = self._series.setdefault(labels, _Series(len(self._le)))
        index = bisect.bisect_left(self._bounds, value)  # the first bound >= value
        with self._lock:
            series.counts[index] += 1
            series.total += value

    def collect(self) -> Iterator[Metric]:
        """The family as ``prometheus_client.Histogram`` writes it (cumulative buckets)."""
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        with self._lock:
            taken = [(labels, list(series.counts), series.total, series.created)
                     for labels, series in self._series.items()]
        for labels, counts, total, created in taken:
            cumulative, running = [], 0
            for le, count in zip(self._le, counts, strict=True):
                running += count
                cumulative.append((le, float(running)))
            family.add_metric(labels, cumulative, total)
            if self._created:
                family.samples.append(Sample(f"{self.name}_created",
                                             dict(zip(self.labelnames, labels, strict=True)),
                                             created))
        yield family


class LabelledCounter(Collector):
    """A counter family by label values, counted from any thread.

    Args:
        name: The metric's name (``_total`` and ``_created`` added).
        documentation: Its help text.
        labelnames: Its label names, in the order :meth:`inc` takes the values.
    """

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        # label values -> [count, when the series began]
        self._series: dict[tuple[str, ...], list[float]] = {}
        self._lock = threading.Lock()
        self._created = created_series()

    def inc(self, labels: tuple[str, ...]) -> None:
        """Count one for the label values ``labels`` (one per label name)."""
        series = self._series.get(labels)
        if series is None:
            if len(labels) != len(self.labelnames):
                raise ValueError(f"{self.name}: labels {labels!r} for "
                                 f"{list(self.labelnames)!r}")
            with self._lock:
                series = self._series.setdefault(labels, [0.0, time.time()])
        with self._lock:
            series[0] += 1.0

    def collect(self) -> Iterator[Metric]:
        """The family as ``prometheus_client.Counter`` writes it."""
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        with self._lock:
            taken = [(labels, series[0], series[1]) for labels, series in self._series.items()]
        for labels, count, created in taken:
            family.add_metric(labels, count, created=created if self._created else None)
        yield family

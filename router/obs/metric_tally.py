"""Per-request metric updates kept as plain numbers, folded into prometheus metrics on collect.

A prometheus_client update takes a lock and checks the metric per call (``labels(...)`` adds a
lookup); a routed request makes a dozen. Here a
counter update is one dict addition and an observation one bisect into a list of counts, owned
by the event loop's thread. ``Tallies.flush`` adds counter increments to the real counters
(public ``labels().inc()``) and runs first whenever the registry is collected (``FlushFirst``);
a histogram is its own collector (``HistogramTally``). A scrape reads exactly what unbatched
updates would have shown.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString


class CounterTally:
    """Increments of one counter, per tuple of label values (``()`` when unlabelled)."""

    __slots__ = ("metric", "pending")

    def __init__(self, metric: Counter) -> None:
        self.metric = metric
        self.pending: dict[tuple[str, ...], float] = {}

    def inc(self, labels: tuple[str, ...] = (), amount: float = 1) -> None:
        pending = self.pending
        pending[labels] = pending.get(labels, 0) + amount

    def flush(self) -> None:
        pending, self.pending = self.pending, {}
        metric = self.metric
        for labels, amount in pending.items():
            # An increment of 0 still creates the labelled series, as Counter.inc(0) does.
            (metric.labels(*labels) if labels else metric).inc(amount)


class HistogramTally(Collector):
    """One unlabelled histogram, kept as bucket counts and a sum and exposed as a collector.

    prometheus_client has no public call adding n observations at once, so this is the
    histogram itself rather than a buffer in front of a ``Histogram``: registered on the
    registry in its place, it yields a histogram ``Metric`` with the same samples
    (tests/test_router_metric_tally.py pins them against ``Histogram.observe``), minus the
    ``_created`` sample.
    """

    __slots__ = ("name", "documentation", "_bounds", "_les", "_counts", "_total")

    def __init__(self, name: str, documentation: str, buckets: Sequence[float]) -> None:
        bounds = [float(b) for b in buckets]
        if bounds != sorted(bounds):
            raise ValueError(f"{name}: buckets must be sorted, got {list(buckets)}")
        if not bounds or bounds[-1] != math.inf:
            bounds.append(math.inf)
        self.name = name
        self.documentation = documentation
        self._bounds = bounds
        # The `le` labels as Histogram writes them (prometheus_client.utils is untyped).
        self._les: list[str] = [floatToGoString(b) for b in bounds]  # type: ignore[no-untyped-call]
        self._counts = [0] * len(bounds)
        self._total = 0.0

    def observe(self, amount: float) -> None:
        # As Histogram.observe: a value counts in the first bucket whose bound is >= it.
        self._counts[bisect_left(self._bounds, amount)] += 1
        self._total += amount

    def describe(self) -> list[Metric]:
        return [Metric(self.name, self.documentation, "histogram")]

    def collect(self) -> Iterator[Metric]:
        # The samples Histogram yields: cumulative buckets and a count, and a sum unless a
        # bucket is negative (then the sum is no longer monotonic).
        family = Metric(self.name, self.documentation, "histogram")
        total = 0
        for le, count in zip(self._les, self._counts, strict=True):
            total += count
            family.add_sample(self.name + "_bucket", {"le": le}, total)
        family.add_sample(self.name + "_count", {}, total)
        if self._bounds[0] >= 0:
            family.add_sample(self.name + "_sum", {}, self._total)
        yield family


class Tallies:
    """The tallies of one registry; ``flush`` folds them all in."""

    def __init__(self) -> None:
        self._all: list[CounterTally] = []

    def counter(self, metric: Counter) -> CounterTally:
        tally = CounterTally(metric)
        self._all.append(tally)
        return tally

    def histogram(self, name: str, documentation: str, buckets: Sequence[float],
                  registry: CollectorRegistry) -> HistogramTally:
        """A histogram registered on ``registry``; it needs no flush (it is collected as is)."""
        tally = HistogramTally(name, documentation, buckets)
        registry.register(tally)
        return tally

    def flush(self) -> None:
        for tally in self._all:
            tally.flush()


class FlushFirst(Collector):
    """Registered before any metric, so a registry collect flushes the tallies first (the
    registry collects in registration order); it describes and yields no metric itself."""

    def __init__(self, tallies: Tallies) -> None:
        self._tallies = tallies

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        self._tallies.flush()
        return iter(())

"""Per-request metric updates kept as plain numbers, folded into prometheus metrics on collect.

A prometheus_client update takes a lock and checks the metric per call (``Counter.inc`` ~1 µs,
``Histogram.observe`` ~2 µs, ``labels(...)`` ~3 µs more); a routed request makes a dozen. Here a
counter update is one dict addition and an observation one bisect into a list of counts, owned
by the event loop's thread; ``Tallies.flush`` adds them to the real metrics, and runs first
whenever the registry is collected (``FlushFirst``), so a scrape reads exactly what an
unbatched update would have shown.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from typing import Any

from prometheus_client import Counter, Histogram
from prometheus_client.registry import Collector


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


class HistogramTally:
    """Observations of one unlabelled histogram, as bucket counts and a sum.

    prometheus_client has no public call adding n observations at once: the flush adds to the
    histogram's bucket and sum values (``_buckets``, ``_sum``, ``_upper_bounds``), which
    tests/test_router_metric_tally.py pins against ``Histogram.observe``.
    """

    __slots__ = ("metric", "_bounds", "_counts", "_sum")

    def __init__(self, metric: Histogram) -> None:
        self.metric = metric
        self._bounds: list[float] = list(metric._upper_bounds)
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0

    def observe(self, amount: float) -> None:
        # observe() counts a value in the first bucket whose bound is >= it: bisect_left.
        self._counts[bisect_left(self._bounds, amount)] += 1
        self._sum += amount

    def flush(self) -> None:
        counts, self._counts = self._counts, [0] * len(self._bounds)
        total, self._sum = self._sum, 0.0
        if not any(counts):
            return
        metric: Any = self.metric
        for value, count in zip(metric._buckets, counts, strict=True):
            if count:
                value.inc(count)
        metric._sum.inc(total)


class Tallies:
    """The tallies of one registry; ``flush`` folds them all in."""

    def __init__(self) -> None:
        self._all: list[CounterTally | HistogramTally] = []

    def counter(self, metric: Counter) -> CounterTally:
        tally = CounterTally(metric)
        self._all.append(tally)
        return tally

    def histogram(self, metric: Histogram) -> HistogramTally:
        tally = HistogramTally(metric)
        self._all.append(tally)
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

"""What bench/compare.py reads from the engines' /metrics and from the processes (psutil).

Engines: vLLM's counters (prefix-cache queries and hits in tokens, prompt tokens) and histograms
(queue time, TTFT as the engine sees it), read before and after a run and subtracted. Processes:
CPU seconds (user + system, children included) and RSS, sampled while the run goes.
"""

from __future__ import annotations

import math
import re
import threading
import time
import urllib.request
from dataclasses import dataclass, field

import psutil

_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s+(\S+)$')
_LE = re.compile(r'le="([^"]+)"')

COUNTERS = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
            "vllm:prompt_tokens_total", "vllm:generation_tokens_total")
HISTOGRAMS = ("vllm:request_queue_time_seconds", "vllm:time_to_first_token_seconds")


@dataclass
class Hist:
    bounds: list[float] = field(default_factory=list)  # upper bounds, +inf last
    cumulative: list[float] = field(default_factory=list)
    sum: float = 0.0
    count: float = 0.0

    def minus(self, other: Hist) -> Hist:
        if not other.bounds:
            return self
        return Hist(self.bounds, [a - b for a, b in zip(self.cumulative, other.cumulative,
                                                          strict=True)],
                    self.sum - other.sum, self.count - other.count)

    def quantile(self, q: float) -> float:
        """Prometheus' histogram_quantile: linear within the bucket holding rank q."""
        if self.count <= 0:
            return math.nan
        rank = q * self.count
        lower, below = 0.0, 0.0
        for bound, cum in zip(self.bounds, self.cumulative, strict=True):
            if cum >= rank:
                if math.isinf(bound):
                    return lower
                inside = cum - below
                return lower + (bound - lower) * ((rank - below) / inside if inside else 0.0)
            lower, below = bound, cum
        return lower

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count else math.nan


@dataclass
class EngineSnapshot:
    counters: dict[str, float]
    hists: dict[str, Hist]

    def minus(self, before: EngineSnapshot) -> EngineSnapshot:
        return EngineSnapshot(
            {k: v - before.counters.get(k, 0.0) for k, v in self.counters.items()},
            {k: h.minus(before.hists.get(k, Hist())) for k, h in self.hists.items()})


def parse_metrics(text: str) -> EngineSnapshot:
    counters: dict[str, float] = {}
    hists: dict[str, Hist] = {name: Hist() for name in HISTOGRAMS}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        name, labels, value = m.group(1), m.group(3) or "", float(m.group(4))
        if name in COUNTERS:
            counters[name] = counters.get(name, 0.0) + value
            continue
        for h in HISTOGRAMS:
            if name == h + "_bucket":
                le = _LE.search(labels)
                if le is not None:
                    hists[h].bounds.append(float(le.group(1)))
                    hists[h].cumulative.append(value)
            elif name == h + "_sum":
                hists[h].sum = value
            elif name == h + "_count":
                hists[h].count = value
    return EngineSnapshot(counters, hists)


def scrape(url: str, timeout: float = 10.0) -> EngineSnapshot:
    with urllib.request.urlopen(url + "/metrics", timeout=timeout) as resp:
        return parse_metrics(resp.read().decode())


def merge(snaps: list[EngineSnapshot]) -> EngineSnapshot:
    """The fleet as one engine: counters and histograms added."""
    counters: dict[str, float] = {}
    hists: dict[str, Hist] = {}
    for s in snaps:
        for k, v in s.counters.items():
            counters[k] = counters.get(k, 0.0) + v
        for k, h in s.hists.items():
            acc = hists.get(k)
            if acc is None or not acc.bounds:
                hists[k] = Hist(list(h.bounds), list(h.cumulative), h.sum, h.count)
            elif h.bounds:
                acc.cumulative = [a + b for a, b in zip(acc.cumulative, h.cumulative,
                                                        strict=True)]
                acc.sum += h.sum
                acc.count += h.count
    return EngineSnapshot(counters, hists)


def cpu_seconds(proc: psutil.Process) -> float:
    """User + system CPU of the process and its children (a launcher's worker included)."""
    total = 0.0
    for p in (proc, *proc.children(recursive=True)):
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def rss_bytes(proc: psutil.Process) -> int:
    total = 0
    for p in (proc, *proc.children(recursive=True)):
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


class RssSampler:
    """The process tree's RSS every ``period`` seconds on a thread: its peak and last sample."""

    def __init__(self, proc: psutil.Process, period: float = 0.5) -> None:
        self.proc = proc
        self.period = period
        self.peak = 0
        self.last = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _sample(self) -> None:
        try:
            self.last = rss_bytes(self.proc)
        except psutil.NoSuchProcess:
            return
        self.peak = max(self.peak, self.last)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.period)


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return math.nan
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def now() -> float:
    return time.monotonic()

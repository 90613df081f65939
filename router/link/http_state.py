"""Per-pod state of the HTTP transport: health, the pod's own load counts, in-flight requests.

The pod's load comes from its Prometheus ``/metrics``: ``vllm:num_requests_running`` and
``vllm:num_requests_waiting`` (summed over its engines), ``vllm:kv_cache_usage_perc``, and
``process_start_time_seconds`` (a new value is a restarted pod). A scrape older than
``max_age`` counts as no scrape: routing then weighs the router's own in-flight counts only.
At join, the pod's KV block size is read from ``vllm:cache_config_info`` (``parse_block_size``).
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import TYPE_CHECKING, Any

import msgspec
from prometheus_client.parser import text_string_to_metric_families

from router.config import EngineSpec
from router.link.engine_state import MAX_QUEUE_COUNT, EngineStatus, QueueCounts
from wire.engine import EngineReadyResponse

if TYPE_CHECKING:
    from router.link.http_conn import Pool
    from router.link.request_stream import RequestStream

_NO_COUNTS = QueueCounts()


class HttpCounters(msgspec.Struct):
    requests: int = 0
    tokens: int = 0
    connects: int = 0  # turned ready (first probe, after a death, or a restarted pod)
    deaths: int = 0
    refused: int = 0  # requests the pod answered with a 4xx (the client's error)
    stream_errors: int = 0  # streams cut by the link (connection lost, timeouts)
    scrapes: int = 0
    scrape_errors: int = 0


class PodLoad(msgspec.Struct, frozen=True, gc=False):
    """One /metrics scrape: what the pod reported and when (``time.monotonic``)."""

    running: int
    waiting: int
    kv_cache_usage: float | None
    start_time: float | None
    at: float
    ours: int = 0  # this router's requests on the pod when the scrape came back


def others_of(load: PodLoad) -> int:
    """The requests the pod counted that were not this router's (other frontends', clients
    sending to it directly) as of the scrape."""
    return max(0, load.running + load.waiting - load.ours)


def scrape_interval(load: PodLoad | None, busy: float, quiet: float) -> float:
    """Seconds until the next /metrics scrape of a pod: ``quiet`` while its last scrape
    (``load``) counted only our requests, else ``busy`` (``load`` None: the scrape failed).

    What routing takes from a scrape is the other frontends' load (``pod_counts``: ours are
    counted as they are now, not as scraped); while there is none, a scrape brings nothing
    new but a check that it is still none, and each costs the pod a request on its API server
    (4 idle HTTP sims: 16.5 ms of CPU a second, 2026-12-03)."""
    return quiet if load is not None and others_of(load) == 0 else busy


def health_due(now: float, last_probe: float, answered: float, interval: float) -> bool:
    """Is a /health probe due? Every ``interval``, counted from the last probe or from the last
    request the pod answered in full (``answered``), whichever came later: an answer's tokens
    came from its engine, which is what /health checks; a pod answering keeps its probes away."""
    return now - max(last_probe, answered) >= interval


def pod_counts(load: PodLoad, ours_now: int) -> QueueCounts:
    """The pod's running and waiting requests as they are likely NOW: the other frontends' as
    of the scrape, and this router's own as they are now.

    A scrape is up to ``http_load_interval`` old, and most of what it counted are our own
    requests, many finished since: taken as is, a pod that had just drained looked loaded and
    cold prompts went to busier ones (bench/compare.py's pressure workload, TTFT p99 411-451 ms
    against 301-306 with the scraped counts left out; 3 runs each)."""
    now = others_of(load) + ours_now
    waiting = min(load.waiting, now)
    return QueueCounts(min(now - waiting, MAX_QUEUE_COUNT), waiting)


def _metric(body: bytes, name: bytes) -> float | None:
    """The sum of every sample of ``name`` in a Prometheus text body (None if absent)."""
    total: float | None = None
    key = b"\n" + name
    start = 0
    while (i := body.find(key, start)) >= 0:
        start = i + len(key)
        end = body.find(b"\n", start)
        rest = body[start:end if end >= 0 else len(body)]
        if rest[:1] == b"{":
            close = rest.rfind(b"}")
            if close < 0:
                continue
            rest = rest[close + 1:]
        elif rest[:1] != b" ":
            continue  # a longer name with this one as prefix
        fields = rest.split()
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        if math.isfinite(value):
            total = value if total is None else total + value
    return total


# Larger than any KV block size vLLM allows (it takes up to 256 tokens a block).
MAX_BLOCK_SIZE = 1 << 16


def parse_block_size(body: bytes) -> int | None:
    """The ``block_size`` label of vLLM's ``vllm:cache_config_info`` in a /metrics body (its
    CacheConfig as an info gauge), or None: absent, not a count, or not Prometheus text.

    Known at join, it lets the router note the requests it routes to the pod before the pod's
    first KV event (else it learns the size from the first BlockStored)."""
    try:
        for family in text_string_to_metric_families(body.decode("utf-8", "replace")):
            if family.name != "vllm:cache_config_info":
                continue
            for sample in family.samples:
                value = sample.labels.get("block_size", "")
                if value.isdigit() and 0 < int(value) <= MAX_BLOCK_SIZE:
                    return int(value)
    except (ValueError, TypeError, IndexError):
        return None
    return None


def parse_load(body: bytes, now: float, ours: int = 0) -> PodLoad:
    """The load fields of a /metrics body (absent or forged counts read as 0); ``ours``: this
    router's requests on the pod as the body came back."""
    text = b"\n" + body

    def count(name: bytes) -> int:
        value = _metric(text, name)
        return int(value) if value is not None and 0 <= value <= MAX_QUEUE_COUNT else 0

    usage = _metric(text, b"vllm:kv_cache_usage_perc")
    return PodLoad(count(b"vllm:num_requests_running"), count(b"vllm:num_requests_waiting"),
                   usage if usage is not None and 0.0 <= usage <= 1.0 else None,
                   _metric(text, b"process_start_time_seconds"), now, ours)


class HttpEngineState:
    """Everything the HTTP client knows about one pod; read by routing like ``EngineState``."""

    def __init__(self, spec: EngineSpec, pool: Pool, max_age: float, host_header: str) -> None:
        self.spec = spec
        self.pool = pool
        self.host_header = host_header  # the Host of every request (the URL's host[:port])
        self.max_age = max_age
        self.status = EngineStatus.CONNECTING
        self.death_reason: str | None = None
        # What the pod said when it turned ready (/v1/models, /kv_event_sources), as a ready
        # map: block_size 0 until given in the config (the index learns it from KV events).
        self.ready: EngineReadyResponse | None = None
        self.adopted = False
        self.in_flight: dict[str, RequestStream] = {}
        self.counters = HttpCounters()
        self.load: PodLoad | None = None
        self.ready_event = asyncio.Event()
        self.probe_now = asyncio.Event()  # a stream failed: check the pod's health at once
        self.answered = 0.0  # time.monotonic() of the last request the pod answered in full
        self.tasks: list[asyncio.Task[None]] = []

    @property
    def fresh_load(self) -> PodLoad | None:
        load = self.load
        if load is None or time.monotonic() - load.at > self.max_age:
            return None
        return load

    @property
    def queue_counts(self) -> QueueCounts:
        """The pod's running and waiting requests from a recent scrape, ours counted as they
        are now (``pod_counts``; zeros without one)."""
        load = self.fresh_load
        if load is None:
            return _NO_COUNTS
        return pod_counts(load, len(self.in_flight))

    @property
    def scheduler_stats(self) -> dict[str, Any] | None:
        load = self.fresh_load
        if load is None:
            return None
        stats: dict[str, Any] = {"num_running_reqs": load.running,
                                 "num_waiting_reqs": load.waiting}
        if load.kv_cache_usage is not None:
            stats["kv_cache_usage"] = load.kv_cache_usage
        return stats

    @property
    def num_in_flight(self) -> int:
        return len(self.in_flight)

"""The router's Prometheus metrics, on a registry owned by one app (never the global one)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from router.obs.metric_tally import FlushFirst, Tallies

# Latency buckets from sub-millisecond (router overhead) to minutes (long generations).
_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
_TPOT = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)

# Engine-side gauges are read at scrape time from whatever owns them (engine client, subscriber).
EngineSnapshot = Callable[[], dict[str, dict[str, float]]]


class _Snapshot(Collector):
    """Turns a per-engine snapshot callable into gauges/counters at scrape time."""

    def __init__(self, read: EngineSnapshot, gauges: dict[str, str], counters: dict[str, str]):
        self._read = read
        self._gauges = gauges
        self._counters = counters

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        snapshot = self._read()
        for key, doc in self._gauges.items():
            g = GaugeMetricFamily(f"kvroute_{key}", doc, labels=["engine"])
            for engine, values in snapshot.items():
                if key in values:
                    g.add_metric([engine], values[key])
            yield g
        for key, doc in self._counters.items():
            c = CounterMetricFamily(f"kvroute_{key}", doc, labels=["engine"])
            for engine, values in snapshot.items():
                if key in values:
                    c.add_metric([engine], values[key])
            yield c


class _Plain(Collector):
    """Unlabelled gauges and counters from one snapshot callable, at scrape time."""

    def __init__(self, read: Callable[[], dict[str, float]], gauges: dict[str, str],
                 counters: dict[str, str]):
        self._read = read
        self._gauges = gauges
        self._counters = counters

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        values = self._read()
        for key, doc in self._gauges.items():
            yield GaugeMetricFamily(f"kvroute_{key}", doc, value=values.get(key, 0.0))
        for key, doc in self._counters.items():
            yield CounterMetricFamily(f"kvroute_{key}", doc, value=values.get(key, 0.0))


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.tallies = Tallies()
        r.register(FlushFirst(self.tallies))
        self.requests = Counter(
            "kvroute_requests", "HTTP requests by endpoint and status", ["endpoint", "status"],
            registry=r)
        self.ttft_tally = self.tallies.histogram(
            "kvroute_time_to_first_token_seconds", "Arrival to first token", buckets=_LATENCY,
            registry=r)
        self.tpot_tally = self.tallies.histogram(
            "kvroute_time_per_output_token_seconds", "Mean gap between output tokens",
            buckets=_TPOT, registry=r)
        self.e2e_tally = self.tallies.histogram(
            "kvroute_e2e_request_latency_seconds", "Arrival to last byte", buckets=_LATENCY,
            registry=r)
        self.prompt_tokens = Counter("kvroute_prompt_tokens", "Prompt tokens routed", registry=r)
        self.generation_tokens = Counter(
            "kvroute_generation_tokens", "Output tokens streamed", registry=r)
        self.decisions = Counter(
            "kvroute_routing_decisions", "Routing decisions by policy, reason and engine",
            ["policy", "reason", "engine"], registry=r)
        self.predicted_cached = Counter(
            "kvroute_predicted_cached_tokens", "Prefix tokens the router predicted as cached",
            ["engine"], registry=r)
        self.engine_cached = Counter(
            "kvroute_engine_cached_tokens", "Prefix tokens the engine reported as cached",
            ["engine"], registry=r)
        self.prediction_error_tally = self.tallies.histogram(
            "kvroute_cached_tokens_prediction_error",
            "Engine-reported minus predicted cached tokens per request",
            buckets=(-4096, -1024, -256, -64, -16, -1, 0, 16, 64, 256, 1024, 4096), registry=r)
        self.retries = Counter(
            "kvroute_retries", "Requests retried on another engine before any token", registry=r)
        self.aborts = Counter(
            "kvroute_aborts", "Engine requests aborted by the router", ["cause"], registry=r)
        self.rejected = Counter(
            "kvroute_rejected", "Requests refused for load", ["status"], registry=r)
        self.queue_depth = Gauge(
            "kvroute_queue_depth", "Requests waiting for an engine slot", registry=r)
        self.in_flight = Gauge(
            "kvroute_in_flight", "Requests the router has on an engine", ["engine"], registry=r)
        self.stream_errors = Counter(
            "kvroute_stream_errors", "Streams ended with an error chunk", registry=r)
        self.resumes = Counter(
            "kvroute_resumes", "Streams whose engine died after a token, by outcome: resumed "
            "on another engine, or failed (no engine, or it failed too)", ["outcome"],
            registry=r)
        self.resumed_tokens = Counter(
            "kvroute_resumed_tokens", "Tokens sent again as a resumed request's prompt (its "
            "prompt plus the output so far)", registry=r)
        # What every routed request updates, as tallies (router/obs/metric_tally.py): requests by
        # (endpoint, status), decisions by (policy, reason, engine), cached tokens by engine.
        t = self.tallies
        self.requests_tally = t.counter(self.requests)
        self.prompt_tokens_tally = t.counter(self.prompt_tokens)
        self.generation_tokens_tally = t.counter(self.generation_tokens)
        self.decisions_tally = t.counter(self.decisions)
        self.predicted_cached_tally = t.counter(self.predicted_cached)
        self.engine_cached_tally = t.counter(self.engine_cached)

    def watch_engines(self, read: EngineSnapshot) -> None:
        """Per-engine health/queue (engine client) gauges, read at scrape time."""
        self.registry.register(_Snapshot(read, {
            "engine_healthy": "1 if the engine is serving, else 0",
            "engine_running_requests": "Engine-reported running requests",
            "engine_waiting_requests": "Engine-reported waiting requests",
            "engine_kv_cache_usage": "Engine-reported KV cache usage (0-1)",
        }, {}))

    def watch_kv_events(self, read: EngineSnapshot) -> None:
        """KV-event stream health per engine (subscriber counters), read at scrape time."""
        self.registry.register(_Snapshot(read, {
            "kv_event_lag_seconds": "Router receive time minus the batch timestamp",
        }, {
            "kv_event_batches": "KV event batches applied",
            "kv_event_gaps": "Sequence gaps detected (each triggers a replay)",
            "kv_event_replays": "Replays requested",
            "kv_event_decode_errors": "Batches that failed to decode",
            "kv_event_lost_batches": "Batches missed that no replay could fill",
            "kv_event_superseded_batches": "Replayed batches skipped: a later AllBlocksCleared "
                                           "undoes them",
        }))

    def watch_discovery(self, read: Callable[[], dict[str, float]]) -> None:
        """Engine discovery ([discovery]): what it found and did, read at scrape time."""
        self.registry.register(_Plain(read, {
            "discovery_endpoints": "Endpoints the discovery source reports now (ready or not)",
            "discovery_ready_endpoints": "Of those, the ready ones",
            "discovery_engines": "Discovered engines serving (joined, not draining)",
            "discovery_draining": "Discovered engines draining before removal",
            "discovery_held_back": "Ready endpoints waiting for room under max_engines",
        }, {
            "discovery_changes": "Engine-set changes the source reported",
            "discovery_joins": "Discovered engines joined",
            "discovery_drains": "Discovered engines drained (left, not ready, moved)",
            "discovery_taken_back": "Drains cancelled: ready again at the same address",
            "discovery_removals": "Discovered engines removed after their drain",
        }))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

"""Tallied metric updates scrape exactly as the same updates made on prometheus_client directly."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from router.obs.metric_tally import CounterTally, FlushFirst, HistogramTally, Tallies
from router.obs.metrics import RouterMetrics

BUCKETS = (-4, -1, 0, 0.001, 0.5, 1, 2.5)
values = st.one_of(st.sampled_from(BUCKETS), st.floats(-10, 10, allow_nan=False))
updates = st.lists(st.one_of(
    st.tuples(st.just("observe"), values),
    st.tuples(st.just("inc"), st.sampled_from(["a", "b", "c"]), st.integers(0, 300)),
    st.tuples(st.just("plain"), st.integers(0, 300)),
    st.just(("scrape",)),
), max_size=60)


def _registry() -> tuple[CollectorRegistry, Histogram, Counter, Counter]:
    r = CollectorRegistry(auto_describe=True)
    return (r, Histogram("h", "h", buckets=BUCKETS, registry=r),
            Counter("c", "c", ["l"], registry=r), Counter("p", "p", registry=r))


def _tallied(tallies: Tallies
             ) -> tuple[CollectorRegistry, HistogramTally, CounterTally, CounterTally]:
    r = CollectorRegistry(auto_describe=True)
    r.register(FlushFirst(tallies))  # before the metrics, as RouterMetrics does
    return (r, tallies.histogram("h", "h", BUCKETS, r),
            tallies.counter(Counter("c", "c", ["l"], registry=r)),
            tallies.counter(Counter("p", "p", registry=r)))


def _samples(registry: CollectorRegistry) -> list[str]:
    # The _created timestamps differ between two registries by construction.
    return [line for line in generate_latest(registry).decode().splitlines()
            if "_created" not in line]


@given(updates)
def test_tallies_scrape_as_direct_updates(ops: list[tuple[object, ...]]) -> None:
    direct, h, c, p = _registry()
    tallies = Tallies()
    tallied, h_t, c_t, p_t = _tallied(tallies)
    for op in ops:
        if op[0] == "observe":
            h.observe(float(op[1]))  # type: ignore[arg-type]
            h_t.observe(float(op[1]))  # type: ignore[arg-type]
        elif op[0] == "inc":
            c.labels(op[1]).inc(op[2])  # type: ignore[arg-type]
            c_t.inc((str(op[1]),), op[2])  # type: ignore[arg-type]
        elif op[0] == "plain":
            p.inc(op[1])  # type: ignore[arg-type]
            p_t.inc((), op[1])  # type: ignore[arg-type]
        else:
            assert _samples(tallied) == _samples(direct)
    assert _samples(tallied) == _samples(direct)


def test_router_metrics_flush_before_scrape() -> None:
    m = RouterMetrics()
    m.requests_tally.inc(("/v1/completions", "200"))
    m.ttft_tally.observe(0.002)
    m.prompt_tokens_tally.inc((), 256)
    text = m.exposition().decode()
    assert 'kvroute_requests_total{endpoint="/v1/completions",status="200"} 1.0' in text
    assert 'kvroute_time_to_first_token_seconds_bucket{le="0.0025"} 1.0' in text
    assert 'kvroute_time_to_first_token_seconds_bucket{le="0.001"} 0.0' in text
    assert "kvroute_time_to_first_token_seconds_sum 0.002" in text
    assert "kvroute_prompt_tokens_total 256.0" in text
    # Folded in once: a second scrape shows the same, not twice as much.
    assert m.exposition().decode() == text

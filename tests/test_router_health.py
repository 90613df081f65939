"""Honest health: an engine's death or hang shows in /ready and kvroute_engine_healthy without any
request sent, a killed engine's streams end without waiting for engine_dead_after, and a
restarted engine's load is what it reports, not what its dead process last did.

The silence deadline (engine_dead_after) is set far beyond every wait here: only the dropped
connection or the idle probe can be what the test sees.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import ExitStack

import httpx
import pytest

from devtools.cluster import ClusterOptions, LocalCluster
from router.config import Limits
from router.link.engine_state import EngineStatus
from tests.waits import eventually

MODEL = "Qwen/Qwen3-0.6B"
NEVER = 600.0  # engine_dead_after: longer than any wait below
IDLE_PROBE = 0.5


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    opts = ClusterOptions(engines=2, processes=True, sim={"step_time": 0.02},
                          limits=Limits(engine_dead_after=NEVER, engine_idle_probe=IDLE_PROBE))
    with LocalCluster(opts) as c:
        yield c


def _gauge(http: httpx.Client, name: str) -> dict[str, float]:
    out = {}
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(name + "{"):
            engine = line.split('engine="', 1)[1].split('"', 1)[0]
            out[engine] = float(line.rsplit(" ", 1)[1])
    return out


def _requests_sent(http: httpx.Client) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in http.get("/metrics").text.splitlines()
               if line.startswith("kvroute_requests_total{"))


def test_an_idle_engine_killed_leaves_ready_and_healthy_with_no_request_sent(
        cluster: LocalCluster) -> None:
    with httpx.Client(base_url=cluster.base_url, timeout=30) as http:
        assert _gauge(http, "kvroute_engine_healthy") == {"engine-0": 1.0, "engine-1": 1.0}
        cluster.kill_engine("engine-0")
        eventually(lambda: _gauge(http, "kvroute_engine_healthy")["engine-0"] == 0.0)
        view = cluster.state.client.engines["engine-0"]
        assert view.status is EngineStatus.DEAD
        assert view.death_reason == "its connection dropped"
        assert http.get("/ready").status_code == 200  # engine-1 still serves
        cluster.kill_engine("engine-1")
        eventually(lambda: http.get("/ready").status_code == 503)
        assert _gauge(http, "kvroute_engine_healthy") == {"engine-0": 0.0, "engine-1": 0.0}
        assert _requests_sent(http) == 0


def test_an_idle_engine_that_hangs_is_found_by_a_probe_and_readopted_when_it_wakes(
        cluster: LocalCluster) -> None:
    pid = cluster.procs["engine-0"].pid
    with httpx.Client(base_url=cluster.base_url, timeout=30) as http:
        os.kill(pid, signal.SIGSTOP)  # its connections stay up: only a probe can tell
        try:
            eventually(lambda: _gauge(http, "kvroute_engine_healthy")["engine-0"] == 0.0)
            reason = cluster.state.client.engines["engine-0"].death_reason
            assert reason is not None and reason.startswith("no answer to a probe"), reason
        finally:
            os.kill(pid, signal.SIGCONT)
        eventually(lambda: _gauge(http, "kvroute_engine_healthy")["engine-0"] == 1.0)
        assert _requests_sent(http) == 0


def test_a_stream_on_a_killed_engine_ends_without_waiting_for_the_silence_deadline(
        cluster: LocalCluster) -> None:
    # The client's read timeout is far below engine_dead_after: a stream that waited for the
    # silence deadline would fail with a timeout, not with the error event.
    with httpx.Client(base_url=cluster.base_url, timeout=60) as http, http.stream(
            "POST", "/v1/completions",
            json={"model": MODEL, "prompt": "a long one", "max_tokens": 3000, "stream": True,
                  # ended, not resumed on the other engine (tests/test_router_resume.py)
                  "vllm_xargs": {"kvroute_resume": False}}) as r:
        victim = r.headers["x-kvroute-route"].split(";")[0].removeprefix("engine=")
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        cluster.kill_engine(victim)
        events = [line[6:] for line in lines if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert "its connection dropped" in events[-2], events[-2]


def test_a_restarted_engine_s_load_is_what_it_reports(cluster: LocalCluster) -> None:
    """The dead process's running count does not outlive it: routing sees zero until the new
    process reports (a stale count kept every request away from the restarted engine)."""
    state = cluster.state
    body = {"model": MODEL, "max_tokens": 3000, "stream": True}
    with httpx.Client(base_url=cluster.base_url, timeout=60) as http, ExitStack() as streams:
        for i in range(6):
            streams.enter_context(http.stream("POST", "/v1/completions",
                                              json={**body, "prompt": f"busy {i}"}))

        def running() -> dict[str, float]:
            return _gauge(http, "kvroute_engine_running_requests")

        eventually(lambda: max(running().values()) > 0)
        victim = max(running(), key=lambda name: running()[name])
        cluster.kill_engine(victim)
        eventually(lambda: state.client.engines[victim].status is EngineStatus.DEAD)
        assert running()[victim] == 0.0
        assert state.client.engines[victim].queue_counts.num_running_reqs == 0
        cluster.start_engine(victim)
        eventually(lambda: state.client.engines[victim].counters.connects == 2)
        assert state.client.engines[victim].status is EngineStatus.READY
        assert state.client.engines[victim].queue_counts.num_running_reqs == 0

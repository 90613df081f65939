"""The reconciler drives the router's fleet from Kubernetes discovery (the fake API server):
pods join, a deleted pod drains without failing its open stream, a moved pod is a new engine
while the old one drains, a not-ready pod drains, a flap takes the engine back, and the fleet
cap holds endpoints back until there is room. The engines here are simulated ZMQ engines
started against the handshake address each discovered engine is given."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from devtools.cluster import ClusterOptions, LocalCluster
from discovery.endpoints import Endpoint
from discovery.kubernetes import KubernetesSource
from discovery.options import KubernetesOptions
from router.config import EngineSpec
from router.routing.discovered import Reconciler
from tests.fake_kube import FakeKube
from tests.waits import eventually

MODEL = "Qwen/Qwen3-0.6B"


class Rig:
    """A router (one configured engine, ``engine-0``) with a reconciler on its loop."""

    def __init__(self, c: LocalCluster, kube: FakeKube, http: httpx.Client, tmp: Path,
                 max_engines: int) -> None:
        self.c, self.kube, self.http = c, kube, http
        self.joined: list[tuple[str, str]] = []  # (engine, url) as the reconciler joined them
        opts = KubernetesOptions(selector="app=engine", port="http", retry_min=0.01,
                                 kubeconfig=str(kube.kubeconfig(tmp / "kc")))

        def spec_for(engine: str, endpoint: Endpoint) -> EngineSpec:
            self.joined.append((engine, endpoint.url))
            return EngineSpec(engine, f"ipc://{c.dir}/{engine}.hs")

        async def start() -> tuple[Reconciler, asyncio.Task[None]]:
            st = c.state
            rec = Reconciler(st.fleet, st.drains, spec_for, drain_timeout=30.0,
                             max_engines=max_engines)
            return rec, asyncio.create_task(rec.run(KubernetesSource(opts)))

        self.rec, self.task = c.call(start)

    def close(self) -> None:
        async def stop() -> None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

        self.c.call(stop)

    def serving(self) -> dict[str, str]:
        """Discovered endpoint -> its serving engine (attached and not draining)."""
        st = self.c.state
        return {n: inc.engine for n, inc in self.rec.engines().items()
                if inc.engine in st.fleet.attached and inc.engine not in st.dispatcher.draining}

    def start(self, engine: str) -> None:
        """The pod's engine process dials the handshake its engine was given."""
        eventually(lambda: engine in self.c.state.client.engines)
        self.c.start_engine(engine)
        eventually(lambda: engine in self.c.state.fleet.attached)


@pytest.fixture
def rig(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Rig]:
    max_engines = getattr(request, "param", 64)
    opts = ClusterOptions(engines=1, sim={"step_time": 0.01})
    with FakeKube() as kube, LocalCluster(opts) as c, \
            httpx.Client(base_url=c.base_url, timeout=60) as http:
        r = Rig(c, kube, http, tmp_path, max_engines)
        try:
            yield r
        finally:
            r.close()


def _stream(rig: Rig) -> tuple[Any, str]:
    """A stream opened on the rig's client (closed with it if the test fails first)."""
    body = {"model": MODEL, "prompt": "a long one", "max_tokens": 120, "stream": True,
            "ignore_eos": True}
    cm = rig.http.stream("POST", "/v1/completions", json=body)
    stream = cm.__enter__()
    engine = stream.headers["x-kvroute-route"].split(";")[0].removeprefix("engine=")
    return (cm, stream), engine


def _lines(handle: Any) -> list[str]:
    cm, stream = handle
    try:
        return [line for line in stream.iter_lines() if line]
    finally:
        cm.__exit__(None, None, None)


def test_pods_join_and_a_deleted_pod_drains_its_open_stream(rig: Rig) -> None:
    c, kube = rig.c, rig.kube
    kube.add_pod("p0", "127.0.0.2")
    rig.start("p0")
    assert rig.serving() == {"p0": "p0"}
    assert rig.joined == [("p0", "http://127.0.0.2:8000")]
    # A stream on p0 (the configured engine-0 is made unavailable to the policy by draining
    # it for the length of the open; it is taken back at once).
    c.state.dispatcher.draining.add("engine-0")
    handle, engine = _stream(rig)
    c.state.dispatcher.draining.discard("engine-0")
    assert engine == "p0"
    kube.delete_pod("p0")
    eventually(lambda: "p0" in c.state.dispatcher.draining)
    r = rig.http.post("/v1/completions", json={"model": MODEL, "prompt": "new", "max_tokens": 2})
    assert r.status_code == 200 and r.headers["x-kvroute-route"].startswith("engine=engine-0;")
    lines = _lines(handle)
    assert lines[-1] == "data: [DONE]" and not any('"error"' in ln for ln in lines)
    eventually(lambda: rig.rec.counters.removed == 1)
    assert "p0" not in c.state.client.engines and rig.serving() == {}


def test_a_moved_pod_is_a_new_engine_while_the_old_drains(rig: Rig) -> None:
    c, kube = rig.c, rig.kube
    kube.add_pod("p0", "127.0.0.2")
    rig.start("p0")
    c.state.dispatcher.draining.add("engine-0")
    handle, engine = _stream(rig)
    assert engine == "p0"
    kube.update_pod("p0", ip="127.0.0.7")  # recreated elsewhere
    rig.start("p0~2")  # the old one still drains under its name
    assert rig.joined[-1] == ("p0~2", "http://127.0.0.7:8000")
    assert "p0" in c.state.dispatcher.draining
    c.state.dispatcher.draining.discard("engine-0")
    lines = _lines(handle)
    assert lines[-1] == "data: [DONE]"
    eventually(lambda: "p0" not in c.state.client.engines)
    assert rig.serving() == {"p0": "p0~2"}


def test_not_ready_drains_and_a_flap_takes_the_engine_back(rig: Rig) -> None:
    c, kube = rig.c, rig.kube
    kube.add_pod("p0", "127.0.0.2")
    rig.start("p0")
    c.state.dispatcher.draining.add("engine-0")
    handle, engine = _stream(rig)
    assert engine == "p0"
    kube.update_pod("p0", ready=False)
    eventually(lambda: "p0" in c.state.dispatcher.draining)
    kube.update_pod("p0", ready=True)  # back before its stream ended: taken back
    eventually(lambda: rig.rec.counters.taken_back == 1)
    assert "p0" not in c.state.dispatcher.draining and rig.serving() == {"p0": "p0"}
    c.state.dispatcher.draining.discard("engine-0")
    assert _lines(handle)[-1] == "data: [DONE]"
    kube.update_pod("p0", ready=False)  # and now for good: nothing runs on it
    eventually(lambda: rig.rec.counters.removed == 1)
    assert "p0" not in c.state.client.engines
    assert rig.joined == [("p0", "http://127.0.0.2:8000")]


@pytest.mark.parametrize("rig", [2], indirect=True)
def test_the_fleet_cap_holds_endpoints_back_until_there_is_room(rig: Rig) -> None:
    c, kube = rig.c, rig.kube  # engine-0 is configured: room for one more
    kube.add_pod("p0", "127.0.0.2")
    kube.add_pod("p1", "127.0.0.3")
    rig.start("p0")
    eventually(lambda: rig.rec.counters.held_back == {"p1"})
    assert sorted(c.state.client.engines) == ["engine-0", "p0"]
    kube.delete_pod("p0")
    rig.start("p1")
    assert rig.serving() == {"p1": "p1"} and rig.rec.counters.held_back == set()
    assert json.dumps(rig.joined) == json.dumps([["p0", "http://127.0.0.2:8000"],
                                                 ["p1", "http://127.0.0.3:8000"]])

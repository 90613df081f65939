"""Acceptance (issue 17, "Discovery"): the router with [discovery] kind = "kubernetes" against
the fake API server, the pods simulated `vllm serve` engines (HTTP faces) on 127.0.0.x. Pods
added, changing IP, turning not ready and deleted: the engine set the router lists follows;
a deleted pod's open stream completes; a pod ready again is re-added with its index rebuilt
from its KV replay; a relist (410) or a dropped watch duplicates nothing."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from devtools.cluster import ClusterOptions, LocalCluster
from discovery.options import KubernetesOptions
from router.config import Control, DiscoveryConfig
from tests.fake_kube import FakeKube
from tests.http_pods import Pod, Pods
from tests.waits import eventually

MODEL = "Qwen/Qwen3-0.6B"
ADMIN = {"authorization": "Bearer admin-secret"}


@dataclass
class Rig:
    c: LocalCluster
    kube: FakeKube
    pods: Pods
    http: httpx.Client

    def add(self, name: str, host: str, **fields: Any) -> Pod:
        """A pod starts (its engine serving on host), then the API server lists it."""
        pod = self.pods.start(name, host)
        self.kube.add_pod(name, host, ports={"http": pod.port}, **fields)
        return pod

    def listed(self) -> dict[str, dict[str, Any]]:
        r = self.http.get("/admin/engines", headers=ADMIN)
        assert r.status_code == 200, r.text
        return {e["name"]: e for e in r.json()["engines"]}

    def serving(self) -> dict[str, str]:
        """The engines the router routes to: name -> URL (ready, not draining)."""
        return {n: e["url"] for n, e in self.listed().items()
                if e["status"] == "ready" and not e["draining"]}

    def lists(self) -> int:
        return sum(1 for _, q in self.kube.requests if "watch" not in q)

    def complete(self, prompt: str) -> str:
        r = self.http.post("/v1/completions", json={"model": MODEL, "prompt": prompt,
                                                   "max_tokens": 2})
        assert r.status_code == 200, r.text
        return str(r.headers["x-kvroute-route"].split(";")[0].removeprefix("engine="))


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    pods = Pods(tmp_path, sim={"step_time": 0.01})
    try:
        with FakeKube() as kube:
            source = KubernetesOptions(selector="app=engine", port="http", retry_min=0.05,
                                       retry_max=0.5,
                                       kubeconfig=str(kube.kubeconfig(tmp_path / "kc")))
            opts = ClusterOptions(engines=0, sim={"step_time": 0.01},
                                  discovery=DiscoveryConfig(source, drain_timeout=30.0),
                                  control=Control(admin_key="admin-secret"))
            with LocalCluster(opts) as c, httpx.Client(base_url=c.base_url, timeout=60) as http:
                yield Rig(c, kube, pods, http)
    finally:
        pods.close()


def test_the_router_follows_the_pods(rig: Rig) -> None:
    c, kube = rig.c, rig.kube
    p0, p1 = rig.add("p0", "127.0.0.2"), rig.add("p1", "127.0.0.3")
    rig.add("p2", "127.0.0.4", ready=False)  # not ready: not an engine yet
    eventually(lambda: rig.serving() == {"p0": p0.url, "p1": p1.url})
    assert {rig.complete(f"hello {i}") for i in range(6)} <= {"p0", "p1"}
    metrics = rig.http.get("/metrics").text
    assert 'kvroute_engine_healthy{engine="p0"} 1.0' in metrics

    # Deleted with a stream open on it: no new request goes there, the stream completes.
    body = {"model": MODEL, "prompt": "a long one", "max_tokens": 100, "stream": True,
            "ignore_eos": True}
    with rig.http.stream("POST", "/v1/completions", json=body) as stream:
        assert stream.status_code == 200
        busy = stream.headers["x-kvroute-route"].split(";")[0].removeprefix("engine=")
        other = "p1" if busy == "p0" else "p0"
        kube.delete_pod(busy)
        eventually(lambda: rig.listed()[busy]["draining"] is True)
        assert rig.complete("while it drains") == other
        lines = [line for line in stream.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and not any('"error"' in ln for ln in lines)
    eventually(lambda: busy not in rig.listed())

    # p2 turns ready: it joins.
    p2 = rig.pods.pods["p2"]
    kube.update_pod("p2", ready=True)
    eventually(lambda: rig.serving() == {other: rig.pods.pods[other].url, "p2": p2.url})

    # `other` is recreated at another address (a new process): a new engine joins there,
    # the old one drains and goes.
    moved = rig.pods.start(f"{other}-new", "127.0.0.5")
    kube.update_pod(other, ip="127.0.0.5", ports={"http": moved.port})
    eventually(lambda: sorted(rig.serving().values()) == sorted([p2.url, moved.url]))
    eventually(lambda: other not in rig.listed())  # the old incarnation is removed
    assert c.state.discovery is not None
    assert c.state.discovery.counters.joins == 4  # p0, p1, p2, other at its new address
    lines = ("kvroute_discovery_joins_total 4.0", "kvroute_discovery_engines 2.0",
             "kvroute_discovery_endpoints 2.0", "kvroute_discovery_removals_total 2.0")
    eventually(lambda: all(line in rig.http.get("/metrics").text for line in lines))


def test_not_ready_drains_and_ready_again_rebuilds_the_index_from_replay(rig: Rig) -> None:
    c, kube = rig.c, rig.kube
    p0 = rig.add("p0", "127.0.0.2")
    eventually(lambda: rig.serving() == {"p0": p0.url})
    prompt = "a shared system prompt that spans several KV blocks " * 8
    assert rig.complete(prompt) == "p0"
    eventually(lambda: "p0" in c.state.index.engines()
               and c.state.index.engine_blocks("p0") > 0)  # from p0's own KV events
    blocks = c.state.index.engine_blocks("p0")

    kube.update_pod("p0", ready=False)
    eventually(lambda: "p0" not in rig.listed())
    assert "p0" not in c.state.index.engines()
    kube.update_pod("p0", ready=True)  # the same process, its cache intact
    eventually(lambda: rig.serving() == {"p0": p0.url})
    # No request since: the index holds p0's blocks again, from its replay buffer.
    eventually(lambda: "p0" in c.state.index.engines()
               and c.state.index.engine_blocks("p0") >= blocks)
    r = rig.http.post("/v1/completions", json={"model": MODEL, "prompt": prompt,
                                               "max_tokens": 2})
    assert r.status_code == 200
    cached = int(r.headers["x-kvroute-route"].split("cached=")[1].split(";")[0])
    assert cached > 0  # the router predicted the hit from the rebuilt index


def test_relists_and_dropped_watches_duplicate_nothing(rig: Rig) -> None:
    c, kube = rig.c, rig.kube
    p0, p1 = rig.add("p0", "127.0.0.2"), rig.add("p1", "127.0.0.3")
    eventually(lambda: rig.serving() == {"p0": p0.url, "p1": p1.url})
    assert c.state.discovery is not None
    counters = c.state.discovery.counters
    assert (counters.joins, counters.drains) == (2, 0)
    for fault in ("cut", "expire", "gone_status", "clean"):
        lists = rig.lists()
        eventually(lambda: kube.open_watches() == 1)
        if fault == "cut":
            kube.drop_watches()
        elif fault == "expire":
            kube.expire_watches()
        elif fault == "gone_status":
            kube.fail_next(1, 410)
            kube.drop_watches(clean=True)
        else:
            kube.drop_watches(clean=True)  # resumed from its version, no relist
        eventually(lambda: kube.open_watches() == 1)
        if fault != "clean":
            assert rig.lists() == lists + 1
        assert rig.serving() == {"p0": p0.url, "p1": p1.url}
    assert (counters.joins, counters.drains) == (2, 0)
    # A pod deleted while no watch is open leaves with the relist.
    kube.drop_watches()
    kube.delete_pod("p1")
    eventually(lambda: rig.serving() == {"p0": p0.url} and "p1" not in rig.listed())
    assert (counters.joins, counters.drains) == (2, 1)

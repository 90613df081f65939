"""Acceptance (issue 19): the chart's pods topology, run for real without a cluster. The router
container's rendered argv and router.toml, its environment from a fake Secret; its discovery
pointed at a fake Kubernetes API server serving pods labelled as the chart's engine Deployment
labels them (simulated `vllm serve` pods on 127.0.0.x) plus one pod of another release; two
router replicas. A rolling restart of one replica (SIGTERM: it turns unready and drains; then a
new one starts) during 20 streams: no stream fails, new requests are served by the other
replica, and the new replica routes with the pods' cached prefixes from the start.

What stands in for the cluster, and nothing else is changed: the pod's network (`--host
0.0.0.0 --port 8000` -> 127.0.0.1 and a free port), its in-cluster service account (a
`--kubeconfig` for the fake API server), the kubelet's files and variables (the ConfigMap and
the Secret written to a temporary directory), and the Service (the test sends each request to a
ready replica, as kube-proxy does once the endpoints controller has dropped a draining one)."""

from __future__ import annotations

import contextlib
import json
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.chart import (
    EXAMPLES,
    FULL,
    NAMESPACE,
    Rendered,
    expand,
    local_files,
    localize,
    pod_env,
    render,
)
from tests.fake_kube import FakeKube
from tests.http_pods import Pods
from tests.procs import Proc, kvroute_env, started
from tests.waits import eventually

pytestmark = [pytest.mark.deploy, pytest.mark.slow]

MODEL = "Qwen/Qwen3-0.6B"
SECRET = {("kvroute-keys", "api-key"): "rollout-api-key"}
AUTH = {"authorization": "Bearer rollout-api-key"}
STREAMS = 20
MAX_TOKENS = 300
PREFIX = "You are the rollout assistant. House rules: " + " ".join(
    f"rule-{i}" for i in range(80)) + ".\n"


@dataclass
class Replica:
    proc: Proc
    url: str

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.url + path, headers=AUTH, timeout=30)

    def complete(self, prompt: str) -> httpx.Response:
        return httpx.post(self.url + "/v1/completions", headers=AUTH, timeout=60,
                          json={"model": MODEL, "prompt": prompt, "max_tokens": 2})

    def healthy_engines(self) -> set[str]:
        text = self.get("/metrics").text
        return {line.split('engine="')[1].split('"')[0] for line in text.splitlines()
                if line.startswith("kvroute_engine_healthy{") and line.endswith(" 1.0")}


def _cached(r: httpx.Response) -> int:
    assert r.status_code == 200, r.text
    return int(r.headers["x-kvroute-route"].split("cached=")[1].split(";")[0])


def router_argv(r: Rendered, tmp: Path, kubeconfig: Path) -> tuple[list[str], dict[str, str]]:
    """The router container's argv and environment as the kubelet would start it, with the
    pod's network, account and files replaced as the module docstring says."""
    name = f"{FULL}-router"
    container = r.container(name)
    env = pod_env(container, f"{name}-abc", SECRET)
    argv = localize(expand(container["args"], env), local_files(r, name, tmp, SECRET))
    assert argv[argv.index("--host") + 1] == "0.0.0.0"
    assert argv[argv.index("--port") + 1] == "8000"
    argv[argv.index("--host") + 1] = "127.0.0.1"
    argv[argv.index("--port") + 1] = "0"
    return [*argv, "--kubeconfig", str(kubeconfig)], env


@contextlib.contextmanager
def replica(argv: list[str], env: dict[str, str]) -> Iterator[Replica]:
    with started(argv, kvroute_env(**env)) as proc:
        url = proc.wait_for(r"serving \S+ on (http://[0-9.]+:\d+) ").group(1)
        proc.drain()
        yield Replica(proc, url)


def stream(url: str, prompt: str, first: threading.Semaphore) -> list[str]:
    """One streamed completion; ``first`` is released at its first token."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    lines: list[str] = []
    with httpx.stream("POST", url + "/v1/completions", json=body, headers=AUTH,
                      timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line:
                if not lines:
                    first.release()
                lines.append(line)
    return lines


def test_rolling_restart_of_a_replica_loses_no_stream(tmp_path: Path) -> None:
    [values] = [f for f in EXAMPLES if f.stem == "pods-small"]
    r = render(values)
    engine = r.container(f"{FULL}-engine")
    labels = r.pod(f"{FULL}-engine")["metadata"]["labels"]
    port_name = next(p["name"] for p in engine["ports"] if p["containerPort"] == 8000)
    pods = Pods(tmp_path, sim={"step_time": 0.01})
    try:
        with FakeKube(NAMESPACE) as kube, ThreadPoolExecutor(STREAMS) as pool:
            names = [f"{FULL}-engine-5d8f9-{s}" for s in ("x2k4p", "q7m1z", "b9c3t")]
            for i, name in enumerate(names):
                pod = pods.start(name, f"127.0.0.{i + 2}")
                kube.add_pod(name, pod.host, labels=labels, ports={port_name: pod.port})
            decoy = pods.start("other-engine", "127.0.0.9")  # another release's engine
            kube.add_pod("other-engine", decoy.host, ports={port_name: decoy.port},
                         labels={**labels, "app.kubernetes.io/instance": "other"})
            argv, env = router_argv(r, tmp_path / "pod", kube.kubeconfig(tmp_path / "kc"))

            with replica(argv, env) as a, replica(argv, env) as b:
                for rep in (a, b):
                    eventually(lambda rep=rep: rep.get("/ready").status_code == 200)
                    eventually(lambda rep=rep: rep.healthy_engines() == set(names))
                # Every replica hears every pod's KV events: B predicts the blocks A's request
                # left on a pod.
                assert _cached(a.complete(PREFIX + "warm up")) == 0
                eventually(lambda: _cached(b.complete(PREFIX + "from b")) > 0)

                first = threading.Semaphore(0)
                streams: list[Future[list[str]]] = [
                    pool.submit(stream, (a, b)[i % 2].url, f"{PREFIX}stream {i}", first)
                    for i in range(STREAMS)]
                for _ in range(STREAMS):
                    assert first.acquire(timeout=120)  # all 20 are streaming
                assert not any(f.done() for f in streams)
                a.proc.popen.send_signal(signal.SIGTERM)
                # A drains: unready at once (the endpoints controller drops it), refuses new
                # requests; new requests go to B and are served.
                eventually(lambda: a.get("/ready").status_code == 503)
                refused = a.complete("too late")
                assert refused.status_code == 503 and "retry-after" in refused.headers
                for i in range(5):
                    served = b.complete(f"during the drain {i}")
                    assert served.status_code == 200, served.text
                results = [f.result(timeout=180) for f in streams]
                code, output = a.proc.finish(timeout=60)
                assert code == 0, output

                with replica(argv, env) as a2:  # the Deployment's replacement
                    eventually(lambda: a2.get("/ready").status_code == 200)
                    eventually(lambda: a2.healthy_engines() == set(names))
                    # It read the pods' replay buffers on start: the prefix is known already.
                    eventually(lambda: _cached(a2.complete(PREFIX + "new replica")) > 0)
                    assert "other-engine" not in a2.healthy_engines() | b.healthy_engines()
    finally:
        pods.close()

    for i, lines in enumerate(results):
        assert lines[-1] == "data: [DONE]", (i, lines[-3:])
        chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
        assert not [c for c in chunks if "error" in c], (i, chunks[-2:])
        usage = [c["usage"] for c in chunks if c.get("usage")]
        assert usage[-1]["completion_tokens"] == MAX_TOKENS, (i, usage)

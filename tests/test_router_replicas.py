"""Acceptance (issue 17, "Replicas"): two router processes in front of four simulated `vllm
serve` pods, no shared store. One workload spread across both routers (each tenant's requests
alternate between them) gets the engines' prefix-cache hit rate of the same workload through
one router (>= 0.98x), and the two routers decide alike for the same probe prompts (>= 95%):
each replica's index follows every pod's KV events, so the indexes agree. That is checked
directly too: the first request a router sees of a tenant the other router has served is
predicted cached (its index heard the pod). Ratios of counts, not of times."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sim.config import DEFAULT_MAX_MODEL_LEN
from tests.http_pods import Pods
from tests.procs import kvroute_env, started
from tests.waits import eventually

MODEL = "Qwen/Qwen3-0.6B"
ADMIN_KEY = "replicas-admin"
GROUPS = 12  # tenants, each with a long prefix of its own
PER_GROUP = 6  # requests per tenant
HITS = re.compile(r"^vllm:prefix_cache_hits_total\{[^}]*\} (\S+)$", re.M)
QUERIES = re.compile(r"^vllm:prefix_cache_queries_total\{[^}]*\} (\S+)$", re.M)

pytestmark = pytest.mark.slow


def _prefix(group: int) -> str:
    words = " ".join(f"rule-{group}-{i}" for i in range(60))
    return f"You are assistant number {group}. Follow these house rules: {words}.\n"


def workload() -> list[tuple[int, str]]:
    """(group, prompt), tenants interleaved: each tenant's requests arrive spread out."""
    return [(g, f"{_prefix(g)}Question {k} for tenant {g}: what is {k} + {g}?")
            for k in range(PER_GROUP) for g in range(GROUPS)]


@contextlib.contextmanager
def _router(urls: dict[str, str]) -> Iterator[str]:
    args = ["router", "--port", "0", "--plain-logs", "--log-level", "WARNING",
            "--max-model-len", str(DEFAULT_MAX_MODEL_LEN)]
    for name, url in urls.items():
        args += ["--engine", f"{name}={url}"]
    with started(args, kvroute_env(KVROUTE_ADMIN_KEY=ADMIN_KEY)) as proc:
        url = proc.wait_for(r"serving \S+ on (http://[0-9.]+:\d+) ").group(1)
        proc.drain()
        with httpx.Client(base_url=url, timeout=30) as http:
            def all_ready() -> bool:
                r = http.get("/admin/engines", headers={"authorization": f"Bearer {ADMIN_KEY}"})
                return r.status_code == 200 and len(r.json()["engines"]) == len(urls) and all(
                    e["status"] == "ready" for e in r.json()["engines"])

            eventually(all_ready)
        yield url


def _hit_rate(pods: Pods) -> float:
    hits = queries = 0.0
    for pod in pods.pods.values():
        text = httpx.get(f"{pod.url}/metrics", timeout=10).text
        hits += sum(float(v) for v in HITS.findall(text))
        queries += sum(float(v) for v in QUERIES.findall(text))
    assert queries > 0
    return hits / queries


def _send(http: httpx.Client, prompt: str) -> tuple[str, int]:
    """The engine the router chose and the cached tokens it predicted."""
    r = http.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 2})
    assert r.status_code == 200, r.text
    route = dict(part.strip().split("=", 1) for part in r.headers["x-kvroute-route"].split(";"))
    return route["engine"], int(route["cached"])


def _pods(tmp: Path, run: str) -> Pods:
    pods = Pods(tmp / run, sim={"step_time": 0.002})
    (tmp / run).mkdir()
    for i in range(4):
        pods.start(f"{run}-{i}", f"127.0.0.{i + 2}")
    return pods


def test_two_replicas_route_as_one(tmp_path: Path) -> None:
    # One router: the reference hit rate.
    single = _pods(tmp_path, "one")
    try:
        with _router({f"pod-{i}": p.url for i, p in enumerate(single.pods.values())}) as url, \
                httpx.Client(base_url=url, timeout=60) as http:
            for _, prompt in workload():
                _send(http, prompt)
        reference = _hit_rate(single)
    finally:
        single.close()

    # Two routers, fresh pods (empty caches), the same workload alternating between them.
    pods = _pods(tmp_path, "two")
    try:
        urls = {f"pod-{i}": p.url for i, p in enumerate(pods.pods.values())}
        with _router(urls) as url_a, _router(urls) as url_b, \
                httpx.Client(base_url=url_a, timeout=60) as a, \
                httpx.Client(base_url=url_b, timeout=60) as b:
            heard = 0  # a router's first request of a tenant, predicted cached
            for n, (g, prompt) in enumerate(workload()):
                k = n // GROUPS
                _, cached = _send((a, b)[(k + g) % 2], prompt)
                heard += k == 1 and cached > 0
            replicated = _hit_rate(pods)
            # Probes: each tenant's prefix with a question not asked yet, to A then to B.
            agree = known = total = 0
            for g in range(GROUPS):
                for k in range(2):
                    probe = f"{_prefix(g)}Probe {k} for tenant {g}: name a colour."
                    (engine_a, cached_a), (engine_b, cached_b) = _send(a, probe), _send(b, probe)
                    total += 1
                    agree += engine_a == engine_b
                    known += cached_a > 0 and cached_b > 0
    finally:
        pods.close()
    assert reference > 0.5  # the workload is mostly shared prefixes, and one router finds them
    assert replicated >= 0.98 * reference, (replicated, reference)
    assert agree / total >= 0.95, (agree, total)
    assert known == total
    assert heard >= 0.95 * GROUPS, heard

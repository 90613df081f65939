"""bench/compare.py in miniature (kvroute and the oracle, one workload, one simulated engine, a
few seconds), so the harness cannot rot: it runs end to end, the results file has its shape, and
the engines report prefix-cache hits; the pods make the text the oracle forwards wait the given
render time. It asserts no time or percentile (those are the bench's).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

RUN_KEYS = {"requests", "errors", "hit_rate", "ttft_p50_ms", "ttft_p99_ms", "engine_ttft_mean_ms",
            "engine_queue_mean_ms", "requests_per_engine", "load_spread",
            "router_cpu_ms_per_req", "engine_cpu_ms_per_req", "total_cpu_ms_per_req",
            "router_rss_peak_mb"}


def test_compare_miniature(tmp_path: Path) -> None:
    out = tmp_path / "compare.json"
    plot = tmp_path / "compare.png"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "compare.py"), "--routers", "kvroute-http,oracle",
         "--render-time", "4,7.5", "--workloads", "tenants", "--engines", "1", "--seconds", "3",
         "--rate", "8",
         "--scale", "0.2", "--rss-seconds", "2", "--rss-routers", "kvroute-http",
         "--cpu-routers", "kvroute-http", "--cpu-workloads", "tenants", "--cpu-rate", "4",
         "--cpu-seconds", "2",
         "--json", str(out), "--plot", str(plot), "--logs", str(tmp_path / "logs")],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert set(result) == {"runs", "rss_growth", "cpu_runs", "meta"}
    run = result["runs"]["tenants"]["kvroute-http"]
    assert RUN_KEYS <= set(run)
    assert run["requests"] == 24 and run["errors"] == 0, run.get("first_error")
    # Tenants share system prompts: the engine itself counted prefix-cache hits.
    assert 0 < run["hit_rate"] < 1
    assert run["requests_per_engine"] == [24.0]
    assert not math.isnan(run["ttft_p50_ms"]) and run["router_cpu_ms_per_req"] > 0
    # kvroute's own decision for every request (x-kvroute-route), counted and logged per request.
    assert sum(run["route_reasons"].values()) == 24
    rows = (tmp_path / "logs" / "tenants-kvroute-http-requests.tsv").read_text().splitlines()
    # Per request: index, due time, TTFT, the engine's cached tokens, kvroute's decision.
    assert len(rows) == 24 and all("engine=" in row.split("\t")[4] for row in rows)
    assert all(int(row.split("\t")[3]) >= 0 for row in rows)  # every engine reported it
    assert sum(run["prediction"].values()) == 24
    assert 0 < run["engine_hit_requests"] < 24
    growth = result["rss_growth"]["kvroute-http"]
    assert growth["requests"] > 0 and growth["errors"] == 0
    meta = result["meta"]
    assert meta["engines"] == 1 and meta["routers"] == ["kvroute-http", "oracle"]
    # The oracle forwards the chat's text: the pod renders it, waiting vLLM's render time
    # (4 ms + 7.5 us a prompt token here); kvroute sends token ids, which wait for nothing.
    assert meta["pod_render"] == "vllm-time"
    assert meta["render_time"] == {"base_ms": 4.0, "us_per_token": 7.5, "points": {}}
    oracle = result["runs"]["tenants"]["oracle"]
    assert oracle["requests"] == 24 and oracle["errors"] == 0, oracle.get("first_error")
    assert oracle["pod_renders_per_req"] == 1
    assert oracle["pod_render_wait_ms_per_req"] > 4.0
    assert run["pod_render_wait_ms_per_req"] == 0
    waits = "text requests wait vLLM's render time, 4 ms + 7.5 us a prompt token"
    assert waits in (tmp_path / "logs" / "e0.log").read_text()
    # The CPU phase: a fleet of pods at vLLM's render cost, the same router at a lower rate.
    cpu = result["cpu_runs"]["tenants"]["kvroute-http"]
    assert cpu["requests"] == 8 and cpu["errors"] == 0 and cpu["total_cpu_ms_per_req"] > 0
    assert cpu["pod_renders_per_req"] == 0  # kvroute sends token ids: its pods render nothing
    assert run["pod_renders_per_req"] == 0  # kvroute's requests render nothing on the pods
    assert "CPU phase: the pods bill each text request's render at vLLM's cost" in proc.stdout
    vllm_work = "text requests also do vLLM's render work"
    assert vllm_work in (tmp_path / "logs" / "cpu" / "e0.log").read_text()
    assert vllm_work not in (tmp_path / "logs" / "e0.log").read_text()
    assert plot.stat().st_size > 0
    # The report names the run's figures and checks what it can without anchors.
    assert "| kvroute-http | 24 (0) |" in proc.stdout

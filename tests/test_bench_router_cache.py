"""bench/router.py's cache-effectiveness part (c) in miniature (every policy it compares, two
engines, a few tenants, one repetition), so the harness cannot rot: it once stopped at its first
sgl-router char-tree decision when the Dispatcher began passing a LoRA adapter's holders to
``decide``. It asserts no time or percentile (those are the bench's).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

POLICIES = {"cache_aware", "oracle", "sglang_char_tree", "shortest_queue", "round_robin"}


def test_router_cache_miniature(tmp_path: Path) -> None:
    out = tmp_path / "router_c.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "router.py"), "--parts", "c", "--requests", "32",
         "--engines", "2", "--tenants", "4", "--reps", "1", "--rate", "0", "--concurrency", "4",
         "--blocks", "64", "--json", str(out), "--plot", str(tmp_path / "router_c.png")],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert set(result["c"]) == POLICIES
    for name, r in result["c"].items():
        assert 0.0 <= r["hit_rate"] <= 1.0, (name, r)
        assert r["ttft_p50_ms"] > 0, (name, r)
    # Four tenants' shared system prompts over two engines: a cache-aware policy finds hits.
    assert result["c"]["cache_aware"]["hit_rate"] > 0.2
    assert result["c_verdict"]["hit_ratio_per_rep"]
    assert (tmp_path / "router_c.png").stat().st_size > 0

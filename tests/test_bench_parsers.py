"""bench/parsers.py in miniature (a few hundred tokens, one round, vLLM's side included), so the
harness cannot rot: it runs end to end and its results have their shape. It asserts no time
(those are the bench's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
KEYS = {"kind", "tokens", "kvroute_us_per_token", "vllm_us_per_token", "ratio"}


@pytest.mark.vllm
def test_parsers_bench_miniature(tmp_path: Path) -> None:
    out = tmp_path / "parsers.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "parsers.py"), "--tokens", "200", "--rounds", "1",
         "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert set(result) == {"scenarios", "meta"}
    rows = result["scenarios"]
    assert {r["kind"] for r in rows.values()} == {"text", "call"}
    assert any(name.startswith("hermes") for name in rows)
    assert any("qwen3" in name for name in rows)
    for row in rows.values():
        assert set(row) == KEYS
        assert row["tokens"] > 100
        assert row["kvroute_us_per_token"] > 0 and row["vllm_us_per_token"] > 0
    assert result["meta"]["rounds"] == 1
    header = "| scenario | tokens | kvroute us/token | vLLM us/token | kvroute / vLLM |"
    assert header in proc.stdout

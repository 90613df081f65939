"""bench/compare_requests.py: the counts it reads from a run's per-request log."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import compare_requests  # noqa: E402


def _line(i: int, at: float, ttft_ms: float, cached: int, engine: str) -> str:
    return f"{i}\t{at:.3f}\t{ttft_ms:.1f}\t{cached}\tengine={engine}; cached={cached}; reason=x\n"


def test_stacked_colds_and_hits_behind_a_cold_are_counted(tmp_path: Path) -> None:
    log = tmp_path / "pressure-kvroute-http-requests.tsv"
    log.write_text("".join([
        _line(0, 0.00, 200.0, 0, "a"),     # a computes a cold prefill until 0.2 s
        _line(1, 0.05, 350.0, 0, "a"),     # cold on busy a while b is free: stacked
        _line(2, 0.10, 20.0, 1504, "b"),   # a hit on free b
        _line(3, 0.15, 150.0, 1504, "a"),  # a hit behind a's prefills while b is free
        _line(4, 0.50, 180.0, 0, "b"),     # cold on b, a is free by then: not stacked
        _line(5, 0.60, 170.0, 0, "a"),     # cold on a while b computes 4: both busy after
        _line(6, 0.65, 160.0, 0, "b"),     # both engines busy: not counted
        "7\t0.700\t30.0\t-1\t\n",          # no route (another router's line): skipped
    ]))
    s = compare_requests.summary(compare_requests.read(log))
    assert (s["requests"], s["colds"], s["stacked"], s["hits_behind_cold"]) == (7, 5, 1, 1)
    assert s["p50"] == 170.0

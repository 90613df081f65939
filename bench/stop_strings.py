"""Per-token cost of stop-string matching (output/stop.py), optionally against another version.

    .venv/bin/python bench/stop_strings.py [--tokens 20000] [--rounds 5] [--baseline OLD_STOP_PY]

Feeds a stream of short text pieces through ``StopChecker.push_one`` (the pipeline's per-token
path) and prints microseconds per token for: plain text with 0, 1 and 4 stop strings that never
match, and a 10k-character stop string (``"a" * 9999 + "b"``) over plain text and over a run of
``"a"`` (the worst case for a hold-back: every token extends the pending prefix). The checker's
construction is timed separately. With ``--baseline`` (a copy of an older output/stop.py, e.g.
``git show main:output/stop.py > /tmp/stop_old.py``) the two versions run interleaved, round by
round, so drift on a busy machine hits both alike, and the ratio new/old is printed.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly hex "
         "the jovial boxer, and then: {\"k\": [1, 2]} ...\n").split(" ")
LONG = "a" * 9999 + "b"
CASES: dict[str, tuple[list[str], str]] = {
    "plain, 0 stops": ([], "plain"),
    "plain, 1 stop": (["</answer>"], "plain"),
    "plain, 4 stops": (["</answer>", "\n\nUser:", "###", "<|im_end|>"], "plain"),
    "plain, 10k stop": ([LONG], "plain"),
    "'a' run, 10k stop": ([LONG], "a-run"),
}


def _pieces(kind: str, n: int) -> list[str]:
    if kind == "a-run":
        return ["aa"] * n
    return [WORDS[i % len(WORDS)] + " " for i in range(n)]


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(mod: Any, stops: list[str], pieces: list[str]) -> tuple[float, float]:
    """(construction seconds, seconds per token) for one pass."""
    t0 = time.perf_counter()
    checker = mod.StopChecker(stops, include_in_output=False)
    t1 = time.perf_counter()
    push = checker.push_one
    for p in pieces:
        push(p)
    t2 = time.perf_counter()
    return t1 - t0, (t2 - t1) / len(pieces)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--baseline", type=Path, help="an older output/stop.py to compare against")
    args = ap.parse_args()
    from output import stop as new

    versions: dict[str, Any] = {"new": new}
    if args.baseline is not None:
        versions["old"] = _load(args.baseline, "stop_baseline")
    for case, (stops, kind) in CASES.items():
        pieces = _pieces(kind, args.tokens)
        per_tok: dict[str, list[float]] = {v: [] for v in versions}
        build: dict[str, list[float]] = {v: [] for v in versions}
        for _ in range(args.rounds):
            for name, mod in versions.items():
                b, t = _run(mod, stops, pieces)
                build[name].append(b)
                per_tok[name].append(t)
        cells = [f"{name} {statistics.median(per_tok[name]) * 1e6:7.3f} us/token "
                 f"(build {statistics.median(build[name]) * 1e3:8.2f} ms)" for name in versions]
        line = f"{case:20s} " + " | ".join(cells)
        if "old" in versions:
            ratio = statistics.median(per_tok["new"]) / statistics.median(per_tok["old"])
            line += f" | new/old {ratio:.2f}"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

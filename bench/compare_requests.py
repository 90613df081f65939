"""What one run's per-request log shows: cold prompts stacked on busy engines, hits waiting.

    .venv/bin/python bench/compare_requests.py LOGDIR/pressure-kvroute-http-requests.tsv ...

Reads the ``WORKLOAD-ROUTER[-K]-requests.tsv`` files that bench/compare.py and
bench/compare_ab.py write with ``--logs`` (one line per request: index, due time, TTFT, the
engine's cached prompt tokens, kvroute's ``x-kvroute-route``). A request the engine computed
cold (fewer than 256 cached tokens) keeps its engine busy with a prefill from its due time until
its first token. Per file it prints:

    colds               requests the engine computed cold
    stacked             cold requests sent to an engine busy with another cold prefill while
                        some engine was not
    hits behind a cold  hits sent to an engine busy with a cold prefill while some engine was not
                        (the hit waits for that prefill: the median of a cache-pressure run)
    p50 / p99           client TTFT, ms

kvroute's routes only (the other routers' logs carry no engine per request).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

HIT_TOKENS = 256  # as bench/compare.py's engine_hit_requests


@dataclass(frozen=True)
class Row:
    at: float
    ttft: float  # seconds
    cached: int
    engine: str


def read(path: Path) -> list[Row]:
    rows = []
    for line in path.read_text().splitlines():
        _, at, ttft, cached, route = line.split("\t")
        fields = dict(p.strip().split("=", 1) for p in route.split(";")) if route else {}
        if "engine" in fields:
            rows.append(Row(float(at), float(ttft) / 1e3, int(cached), fields["engine"]))
    return rows


def summary(rows: list[Row]) -> dict[str, float]:
    engines = sorted({r.engine for r in rows})
    colds = [r for r in rows if r.cached < HIT_TOKENS]
    stacked = behind = 0
    for r in rows:
        busy = {e: any(c.engine == e and c.at < r.at < c.at + c.ttft for c in colds)
                for e in engines}
        if busy[r.engine] and not all(busy.values()):
            if r.cached < HIT_TOKENS:
                stacked += 1
            else:
                behind += 1
    ttfts = sorted(r.ttft * 1e3 for r in rows)
    return {"requests": len(rows), "colds": len(colds), "stacked": stacked,
            "hits_behind_cold": behind,
            "p50": ttfts[len(ttfts) // 2] if ttfts else float("nan"),
            "p99": ttfts[min(len(ttfts) - 1, int(len(ttfts) * 0.99))] if ttfts else float("nan")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("tsv", nargs="+", type=Path)
    a = p.parse_args(argv)
    print("| run | requests | colds | stacked | hits behind a cold | TTFT p50 / p99 ms |")
    print("|---|---|---|---|---|---|")
    for path in a.tsv:
        s = summary(read(path))
        print(f"| {path.name.removesuffix('-requests.tsv')} | {s['requests']} | {s['colds']} | "
              f"{s['stacked']} | {s['hits_behind_cold']} | {s['p50']:.0f} / {s['p99']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

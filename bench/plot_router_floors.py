"""Plot bench/router.py (b) runs taken with --floors: added TTFT p50 of each path, per run.

    .venv/bin/python bench/plot_router_floors.py bench/results/router_floors_*.json \
        --out docs/img/router_floors.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PATHS = (("floor_raw", "asyncio + httptools floor"), ("floor_uvicorn", "uvicorn floor"),
         ("floor_hypercorn", "tuned Hypercorn floor"), ("router", "kvroute router (Hypercorn)"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [json.loads(path.read_text())["b"] for path in a.runs]
    fig, ax = plt.subplots(figsize=(max(8.0, 0.6 * len(runs)), 4))
    width = 0.8 / len(PATHS)
    for k, (key, label) in enumerate(PATHS):
        name = "token_in_added_p50_ms" if key == "router" else f"token_in_{key}_added_p50_ms"
        xs = [i + (k - (len(PATHS) - 1) / 2) * width for i in range(len(runs))]
        ax.bar(xs, [r[name] for r in runs], width, label=label)
    ax.plot(range(len(runs)), [r["token_in_direct_p50_ms"] for r in runs], "k^",
            label="direct path p50 (EngineClient, no HTTP)")
    ax.axhline(1.0, color="red", linestyle="--", linewidth=1, label="target: added <= 1 ms")
    # A file's trailing run number names its bar group (router_floors_12.json -> "12").
    ax.set_xticks(range(len(runs)), [p.stem.rpartition("_")[2] or p.stem for p in a.runs],
                  fontsize=8)
    ax.set_xlabel("run", fontsize=8)
    ax.set_ylabel("ms (p50)")
    ax.set_title("Added TTFT over sending the tokens straight to the engine, token-in, "
                 "max_tokens=1", fontsize=9)
    top = max(max(r["token_in_added_p50_ms"], r["token_in_direct_p50_ms"]) for r in runs)
    ax.set_ylim(0, top * 1.35)  # headroom: the legend sits above the bars
    ax.legend(fontsize=7, ncol=3, loc="upper left")
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())

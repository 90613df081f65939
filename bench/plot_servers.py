"""Plot bench/servers.py's result: each HTTP server on the two hot paths, beside its anchor.

    .venv/bin/python bench/plot_servers.py bench/results/servers.json --out docs/img/servers.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("result", type=Path)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res: dict[str, Any] = json.loads(a.result.read_text())
    servers: list[str] = res["servers"]
    fig, (ttft, cpu, rps) = plt.subplots(1, 3, figsize=(15, 4.2))

    router = res["router"]
    ttft.bar(servers, [router[s]["median"]["token_in_paired_added_p50_ms"] for s in servers],
             color="tab:blue")
    ttft.set_title("router: token-in added TTFT p50 (paired)")
    ttft.set_ylabel("ms over the direct path")

    vs = res.get("router_vs_vllm")
    if vs:
        med = vs["median"]
        names = ["vllm serve", *servers]
        values = [med["vllm_serve"]["cpu_us_per_token"],
                  *(med[f"kvroute_{s}"]["cpu_us_per_token"] for s in servers)]
        colors = ["tab:gray", *["tab:blue"] * len(servers)]
        cpu.bar(names, values, color=colors)
        for x, s in enumerate(servers, start=1):
            cpu.annotate(f"{vs['ratios'][s]:.2f}x", (x, values[x]), ha="center", va="bottom")
    cpu.set_title("API-server CPU per streamed token (real vLLM engine)")
    cpu.set_ylabel("us per token")

    rows = res["render"]["rows"]
    concs = sorted({r["concurrency"] for r in rows})
    kinds = [f"kvroute-{s}" for s in servers] + (["vllm-rs"] if res["render"].get("anchor")
                                                else [])
    width = 0.8 / len(kinds)
    for i, kind in enumerate(kinds):
        by_c = {r["concurrency"]: r["rps"] for r in rows if r["server"] == kind}
        rps.bar([c + (i - (len(kinds) - 1) / 2) * width for c in range(len(concs))],
                [by_c.get(c, 0.0) for c in concs], width,
                label=kind.removeprefix("kvroute-"),
                color="tab:gray" if kind == "vllm-rs" else None)
    rps.set_xticks(range(len(concs)), [f"c={c}" for c in concs])
    rps.set_title("render: multi-turn chat req/s")
    rps.legend(fontsize=8)
    fig.suptitle(f"HTTP servers side by side, one run (load average {res['load_average_1m']:.1f})")
    fig.tight_layout()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(a.out, dpi=110)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

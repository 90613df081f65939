"""bench/compare.py's report: per-workload tables, kvroute's ratios to each anchor, the targets
checked, and the plots, from the result JSON (so a saved run can be re-reported).

    .venv/bin/python bench/compare_report.py bench/results/compare.json \
        [--plot docs/img/compare.png]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

SUBJECT = "kvroute-http"  # kvroute cache_aware over HTTP: the same engines' face as the anchors'
SUBJECTS = ("kvroute-http", "kvroute-zmq")
NON_ORACLE = ("kvroute-http", "kvroute-zmq", "kvroute-rr", "sglang", "vllm-cache", "vllm-kv")
ANCHORS = ("sglang", "vllm-cache", "vllm-kv", "kvroute-rr")


def _f(x: float | None, fmt: str = ".2f") -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0 or math.isnan(a) or math.isnan(b):
        return None
    return a / b


def workload_table(runs: dict[str, dict[str, Any]]) -> list[str]:
    lines = ["| router | requests (errors) | hit rate | requests hit (engine) | kvroute's "
             "prediction right / over / under | TTFT p50 / p99 ms (client) | engine TTFT "
             "mean / p99 ms | engine queue mean ms | pods' render renders / wait ms per req | "
             "load spread max/mean | router CPU ms/req | total CPU ms/req | router RSS MB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in runs.items():
        pred = r.get("prediction")
        graded = ("–" if pred is None else
                  f"{pred.get('right', 0)} / {pred.get('over', 0)} / {pred.get('under', 0)}")
        lines.append(
            f"| {name} | {r['requests']} ({r['errors']}) | {_f(r['hit_rate'], '.3f')} | "
            f"{r.get('engine_hit_requests', '–')} | {graded} | "
            f"{_f(r['ttft_p50_ms'], '.1f')} / {_f(r['ttft_p99_ms'], '.1f')} | "
            f"{_f(r['engine_ttft_mean_ms'], '.1f')} / {_f(r['engine_ttft_p99_ms'], '.0f')} | "
            f"{_f(r['engine_queue_mean_ms'], '.1f')} | "
            f"{_f(r.get('pod_renders_per_req'))} / "
            f"{_f(r.get('pod_render_wait_ms_per_req'), '.1f')} | "
            f"{_f(r['load_spread'], '.2f')} | "
            f"{_f(r['router_cpu_ms_per_req'], '.2f')} | {_f(r['total_cpu_ms_per_req'], '.2f')} | "
            f"{_f(r['router_rss_peak_mb'], '.0f')} |")
    return lines


def ratio_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """kvroute cache_aware over each anchor, per workload: hit rate, TTFT p50/p99, router CPU
    per request, router RSS (peak)."""
    rows = []
    for wl, runs in result["runs"].items():
        me = runs.get(SUBJECT)
        if me is None:
            continue
        for anchor in (*ANCHORS, "oracle"):
            other = runs.get(anchor)
            if other is None:
                continue
            rows.append({
                "workload": wl, "anchor": anchor,
                "hit_rate": ratio(me["hit_rate"], other["hit_rate"]),
                "ttft_p50": ratio(me["ttft_p50_ms"], other["ttft_p50_ms"]),
                "ttft_p99": ratio(me["ttft_p99_ms"], other["ttft_p99_ms"]),
                "router_cpu": ratio(me["router_cpu_ms_per_req"], other["router_cpu_ms_per_req"]),
                "total_cpu": ratio(me["total_cpu_ms_per_req"], other["total_cpu_ms_per_req"]),
                "rss": ratio(me["router_rss_peak_mb"], other["router_rss_peak_mb"]),
            })
    return rows


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target of issue 20 per workload, for kvroute cache_aware over HTTP and over ZMQ:
    met or not, and by how much. "Other routers" are the anchors and round_robin (kvroute's
    two transports are the same router, so neither counts against the other)."""
    out = []
    for wl, runs in result["runs"].items():
        for subject in SUBJECTS:
            me = runs.get(subject)
            if me is None:
                continue
            others = {n: r for n, r in runs.items() if n in ANCHORS}
            if others:
                best_hit = max(others.items(), key=lambda kv: kv[1]["hit_rate"])
                out.append({"workload": wl, "router": subject,
                            "target": "highest hit rate of non-oracle routers",
                            "met": me["hit_rate"] >= best_hit[1]["hit_rate"],
                            "figure": f"{me['hit_rate']:.3f} vs best other {best_hit[0]} "
                                      f"{best_hit[1]['hit_rate']:.3f}"})
                for key, label in (("ttft_p50_ms", "lowest TTFT p50"),
                                   ("ttft_p99_ms", "lowest TTFT p99")):
                    best = min(others.items(), key=lambda kv: kv[1][key])
                    out.append({"workload": wl, "router": subject, "target": label,
                                "met": me[key] <= best[1][key],
                                "figure": f"{me[key]:.1f} ms vs best other {best[0]} "
                                          f"{best[1][key]:.1f} ms ({me[key] / best[1][key]:.2f}x)"})
            oracle = runs.get("oracle")
            if oracle is not None and oracle["hit_rate"] > 0:
                r = me["hit_rate"] / oracle["hit_rate"]
                out.append({"workload": wl, "router": subject,
                            "target": ">= 98% of the oracle's hit rate",
                            "met": r >= 0.98, "figure": f"{r:.3f}x"})
            if not result.get("cpu_runs"):  # a run from before the CPU phase
                out += _cpu_target(wl, subject, runs, "")
    for wl, runs in result.get("cpu_runs", {}).items():
        for subject in SUBJECTS:
            out += _cpu_target(wl, subject, runs, ", pods at vLLM's render cost")
    rss = result.get("rss_growth", {})
    me, sg = rss.get(SUBJECT), rss.get("sglang")
    if me is not None and sg is not None and sg["mb_per_100k"] > 0:
        r = me["mb_per_100k"] / sg["mb_per_100k"]
        out.append({"workload": "unique prompts", "router": SUBJECT,
                    "target": "router RSS growth per 100k unique prompts <= 0.2x SGLang's",
                    "met": r <= 0.2, "figure": f"{me['mb_per_100k']:.1f} vs "
                                               f"{sg['mb_per_100k']:.1f} MB ({r:.2f}x)"})
    return out


def _cpu_target(wl: str, subject: str, runs: dict[str, Any], how: str) -> list[dict[str, Any]]:
    me, vc = runs.get(subject), runs.get("vllm-cache")
    if me is None or vc is None or not vc["total_cpu_ms_per_req"]:
        return []
    r = me["total_cpu_ms_per_req"] / vc["total_cpu_ms_per_req"]
    return [{"workload": wl, "router": subject,
             "target": f"total CPU/request <= 0.3x vllm-router cache_aware's{how}",
             "met": r <= 0.3, "figure": f"{me['total_cpu_ms_per_req']:.1f} vs "
                                        f"{vc['total_cpu_ms_per_req']:.1f} ms ({r:.2f}x)"}]


def cpu_table(result: dict[str, Any]) -> list[str]:
    """The CPU phase: CPU per request of router and pods, pods at vLLM's render cost."""
    meta = result["meta"]
    lines = [f"CPU phase: the pods bill each text request's render at vLLM's cost "
             f"(--render-work vllm), {meta.get('cpu_seconds')} s per run at "
             f"{meta.get('cpu_rate')} req/s:", "",
             "| workload | router | requests (errors) | hit rate | pods' renders/req | router CPU "
             "ms/req | pods' CPU ms/req | total CPU ms/req | total / vllm-router cache_aware's |",
             "|---|---|---|---|---|---|---|---|---|"]
    for wl, runs in result["cpu_runs"].items():
        vc = runs.get("vllm-cache")
        for name, r in runs.items():
            rel = ratio(r["total_cpu_ms_per_req"], vc["total_cpu_ms_per_req"]) if vc else None
            lines.append(f"| {wl} | {name} | {r['requests']} ({r['errors']}) | "
                         f"{_f(r['hit_rate'], '.3f')} | {_f(r.get('pod_renders_per_req'))} | "
                         f"{_f(r['router_cpu_ms_per_req'])} | "
                         f"{_f(r['engine_cpu_ms_per_req'])} | {_f(r['total_cpu_ms_per_req'])} | "
                         f"{_f(rel)} |")
    return [*lines, ""]


def markdown(result: dict[str, Any]) -> str:
    meta = result["meta"]
    lines = [f"Run {meta['started']} UTC, {meta['elapsed_s']:.0f} s, load average "
             f"{meta['load_before']} before / {meta['load_after']} after; {meta['engines']} "
             f"sim engines, {meta['seconds']} s per run at {meta['rate']} req/s.", ""]
    rt = meta.get("render_time")
    if rt:
        lines += [f"The pods make each text request wait vLLM's render time, one at a time per "
                  f"pod (--render-work vllm-time): {rt['base_ms']:.2f} ms + "
                  f"{rt['us_per_token']:.2f} us a prompt token, measured on vLLM's render "
                  "server (bench/compare_render_time.py).", ""]
    for wl, runs in result["runs"].items():
        lines += [f"**{wl}**", "", *workload_table(runs), ""]
    rows = ratio_rows(result)
    if rows:
        lines += ["kvroute cache_aware (HTTP) / anchor (hit rate: higher is better; the rest: "
                  "lower is better):", "",
                  "| workload | anchor | hit rate | TTFT p50 | TTFT p99 | router CPU/req | "
                  "total CPU/req | router RSS |", "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['workload']} | {r['anchor']} | {_f(r['hit_rate'], '.3f')} | "
                         f"{_f(r['ttft_p50'])} | {_f(r['ttft_p99'])} | {_f(r['router_cpu'])} | "
                         f"{_f(r['total_cpu'])} | {_f(r['rss'])} |")
        lines.append("")
    rss = result.get("rss_growth", {})
    if rss:
        lines += ["| router | unique prompts sent | RSS before / after MB | MB per 100k unique "
                  "prompts |", "|---|---|---|---|"]
        for name, g in rss.items():
            lines.append(f"| {name} | {g['requests']} | {g['rss_before_mb']:.0f} / "
                         f"{g['rss_after_mb']:.0f} | {g['mb_per_100k']:.1f} |")
        lines.append("")
    if result.get("cpu_runs"):
        lines += cpu_table(result)
    t = targets(result)
    if t:
        lines += ["| workload | kvroute | target | met | figure |", "|---|---|---|---|---|"]
        lines += [f"| {x['workload']} | {x['router'].removeprefix('kvroute-')} | {x['target']} "
                  f"| {'yes' if x['met'] else '**no**'} | {x['figure']} |" for x in t]
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    wls = list(result["runs"])
    routers = [r for r in (*NON_ORACLE, "oracle") if any(r in result["runs"][w] for w in wls)]
    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5))
    width = 0.8 / max(len(routers), 1)
    panels = ((axes[0][0], "hit_rate", "prefix-cache hit rate (engines, tokens)"),
              (axes[0][1], "ttft_p50_ms", "TTFT p50, ms (client)"),
              (axes[1][0], "ttft_p99_ms", "TTFT p99, ms (client)"))
    for ax, key, title in panels:
        for i, r in enumerate(routers):
            ys = [result["runs"][w].get(r, {}).get(key, math.nan) for w in wls]
            ax.bar([x + i * width for x in range(len(wls))], ys, width, label=r)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(wls))], wls, fontsize=8)
        ax.set_title(title, fontsize=10)
        if key != "hit_rate":
            ax.set_yscale("log")
    ax = axes[1][1]
    # The CPU phase's runs (pods at vLLM's render cost) where the run has them.
    runs = result.get("cpu_runs") or result["runs"]
    cpu = [r for r in routers if r != "oracle" and any(r in runs[w] for w in runs)]
    router_ms = [_mean([runs[w][r]["router_cpu_ms_per_req"] for w in runs if r in runs[w]])
                 for r in cpu]
    engine_ms = [_mean([runs[w][r]["engine_cpu_ms_per_req"] for w in runs if r in runs[w]])
                 for r in cpu]
    ax.bar(cpu, router_ms, label="router")
    ax.bar(cpu, engine_ms, bottom=router_ms, label="engines")
    ax.set_title("CPU ms per request, mean over " + (
        f"{', '.join(runs)} (pods at vLLM's render cost)" if result.get("cpu_runs")
        else "workloads"), fontsize=10)
    ax.tick_params(axis="x", labelsize=8)
    ax.legend(fontsize=8)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8)
    fig.suptitle(f"kvroute vs SGLang Model Gateway vs vllm-router, {result['meta']['engines']} "
                 f"simulated engines ({result['meta']['started']} UTC)", fontsize=11)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)


def _mean(xs: list[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return sum(xs) / len(xs) if xs else math.nan


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("json")
    p.add_argument("--plot", help="write the figure here (PNG)")
    a = p.parse_args(argv)
    result = json.loads(Path(a.json).read_text())
    print(markdown(result))
    if a.plot:
        plot(result, Path(a.plot))
    return 0


if __name__ == "__main__":
    sys.exit(main())

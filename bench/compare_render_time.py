"""How long vLLM's own render takes on bench/compare.py's chats: the pods' render time.

    .venv/bin/python bench/compare_render_time.py [--requests 30]

A router that sends OpenAI text makes each pod it asks render it before the engine sees a token
(vllm-router's cache_aware asks EVERY pod's /v1/chat/completions/render, then sends the chat to
one); a `vllm serve` pod spends that time in its API server. bench/compare.py's pods are
simulated, and kvroute's renderer in them costs a few percent of vLLM's render, so its latency
runs start the pods with ``--render-work vllm-time --render-time BASE_MS,US_PER_TOKEN``: each
text request waits what vLLM's render takes for its prompt. Measured here: vLLM 0.32's render
server (`vllm launch render`, pinned to the machine's cores) renders the first ``--requests``
chats of four compare workloads, one at a time; its CPU per render against the chats' mean
prompt tokens gives a line (least squares): BASE_MS + US_PER_TOKEN x tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import msgspec  # noqa: E402
from sim_render_cost import NAME, WORKLOADS, bodies, cpu_per_request, start  # noqa: E402

from render.models import EMBEDDED_MODEL  # noqa: E402
from render.protocol import ChatCompletionRequest, decode_request  # noqa: E402
from render.renderer import Renderer  # noqa: E402

_CHAT = msgspec.json.Decoder(ChatCompletionRequest)


@dataclass(frozen=True)
class RenderTime:
    base_ms: float
    us_per_token: float
    # per workload: mean prompt tokens, vLLM's CPU ms per render
    points: dict[str, tuple[float, float]]

    def flag(self) -> str:
        """The sim's --render-time value."""
        return f"{self.base_ms:.3f},{self.us_per_token:.4f}"

    @classmethod
    def parse(cls, text: str) -> RenderTime:
        """``BASE_MS,US_PER_TOKEN`` (an argparse type: a ValueError is its usage error)."""
        base, per = (float(x) for x in text.split(","))
        if base < 0 or per < 0:
            raise ValueError(f"negative render time {text!r}")
        return cls(base, per, {})


def prompt_tokens(renderer: Renderer, chats: list[bytes]) -> float:
    """The chats' mean prompt tokens (kvroute's renderer: the ids vLLM computes)."""
    return statistics.fmean(len(renderer.render_chat(decode_request(_CHAT, c)).token_ids)
                            for c in chats)


def measure(logs: Path, requests: int = 30) -> RenderTime:
    logs.mkdir(parents=True, exist_ok=True)
    chats = {w: bodies(w, requests, NAME) for w in WORKLOADS}
    renderer = Renderer.load(EMBEDDED_MODEL, served_model_name=NAME)
    server = start("vllm-py", "0-1", 2, logs)
    try:
        points = {w: (prompt_tokens(renderer, c), 1e3 * cpu_per_request(server, c))
                  for w, c in chats.items()}
    finally:
        server.stop()
    fit = statistics.linear_regression([t for t, _ in points.values()],
                                       [ms for _, ms in points.values()])
    return RenderTime(max(fit.intercept, 0.0), max(fit.slope, 0.0) * 1e3, points)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=30)
    p.add_argument("--json", type=Path, help="write the fit here")
    a = p.parse_args(argv)
    rt = measure(Path(tempfile.mkdtemp(prefix="kvroute-render-time-")), a.requests)
    for w, (tokens, ms) in rt.points.items():
        model = rt.base_ms + rt.us_per_token * tokens / 1e3
        print(f"{w:10s} {tokens:7.0f} tokens  vLLM {ms:6.2f} ms/render  line {model:6.2f} ms")
    print(f"--render-time {rt.flag()}  ({rt.base_ms:.2f} ms + {rt.us_per_token:.2f} us a token)")
    if a.json:
        a.json.write_text(json.dumps(asdict(rt), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

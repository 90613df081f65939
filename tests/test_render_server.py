"""The render HTTP service end to end: a real `kvroute render` process on port 0, real HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.chat_sender import CHAT, chat_request
from tests.render_proc import ROOT, RenderService, render_server, render_service

QWEN = "Qwen/Qwen3-0.6B"
LONG = "qwen3-long"
MAX_BODY = 2_000_000
# What vLLM 0.32's Python render and vllm-rs both return for this chat on the embedded tokenizer.
HI_IDS = [151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198]
# vLLM's GenerateRequest keys, in its order (vllm/entrypoints/scale_out/.../protocol.py).
GENERATE_KEYS = [
    "request_id", "token_ids", "token_offsets", "features", "content_parts", "sampling_params",
    "model", "reasoning_ended", "reasoning_parser_kwargs", "return_token_ids", "output_mode",
    "stream", "stream_options", "cache_salt", "priority", "kv_transfer_params",
    "ec_transfer_params",
]
HI = [{"role": "user", "content": "hi"}]


SHORT = "qwen3-short"
LONG_CONTEXT = 131072


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RenderService]:
    # Qwen3's YaRN context: the same tokenizer with a 128k config, for the 100k-token chat.
    long_dir = tmp_path_factory.mktemp("qwen3-long")
    for f in (ROOT / "render/models/qwen3").iterdir():
        if f.name != "config.json":
            (long_dir / f.name).symlink_to(f)
    config = json.loads((ROOT / "render/models/qwen3/config.json").read_text())
    config["max_position_embeddings"] = LONG_CONTEXT
    (long_dir / "config.json").write_text(json.dumps(config))
    with render_service(
        "--add-model", f"{long_dir},served_model_name={LONG}",
        "--add-model", f"{ROOT}/render/models/qwen3,served_model_name={SHORT},max_model_len=4096",
        "--max-body-bytes", str(MAX_BODY),
    ) as s:
        yield s


@pytest.fixture(scope="module")
def url(service: RenderService) -> str:
    return service.url


# Servers that never get a body over --inline-max-bytes run without a render helper process: its
# model load would only be CI time (helpers: tests/test_render_offload.py).
NO_HELPER = ("--render-processes", "0")


@pytest.fixture(scope="module")
def open_url() -> Iterator[str]:
    with render_server("--allow-request-chat-template", *NO_HELPER) as u:
        yield u


def post(url: str, path: str, body: Any) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(url + path, content=content, headers={"content-type": "application/json"},
                      timeout=60)


def assert_openai_error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert set(body) == {"error"}
    err: dict[str, Any] = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == status and isinstance(err["message"], str) and err["message"]
    return err


def test_health_ping_and_models(url: str) -> None:
    assert httpx.get(url + "/health").status_code == 200
    assert httpx.get(url + "/ping").status_code == 200
    assert httpx.post(url + "/ping").status_code == 200
    models = httpx.get(url + "/v1/models").json()
    assert models["object"] == "list"
    by_id = {m["id"]: m for m in models["data"]}
    assert list(by_id) == [QWEN, LONG, SHORT]
    assert by_id[QWEN]["max_model_len"] == 40960  # config.json max_position_embeddings
    assert by_id[LONG]["max_model_len"] == LONG_CONTEXT
    assert by_id[SHORT]["max_model_len"] == 4096  # --max-model-len wins
    assert all(m["object"] == "model" for m in models["data"])


def test_chat_render_shape_and_values(url: str) -> None:
    r = post(url, "/v1/chat/completions/render", {"model": QWEN, "messages": HI, "stop": ["x"]})
    assert r.status_code == 200, r.text
    out = r.json()
    assert list(out) == GENERATE_KEYS
    assert out["token_ids"] == HI_IDS
    assert out["request_id"].startswith("chatcmpl-")
    assert out["model"] == QWEN
    sp = out["sampling_params"]
    # generation_config.json defaults, max_tokens = the rest of the context, stop strings kept
    assert (sp["temperature"], sp["top_p"], sp["top_k"]) == (0.6, 0.95, 20)
    assert sp["max_tokens"] == 40960 - len(HI_IDS)
    assert sp["stop"] == ["x"]


def test_model_absent_selects_first_and_second_model_has_its_own_context(url: str) -> None:
    default = post(url, "/v1/chat/completions/render", {"messages": HI}).json()
    assert default["token_ids"] == HI_IDS
    long = post(url, "/v1/chat/completions/render", {"model": LONG, "messages": HI}).json()
    assert long["token_ids"] == HI_IDS
    assert long["sampling_params"]["max_tokens"] == LONG_CONTEXT - len(HI_IDS)
    short = post(url, "/v1/chat/completions/render", {"model": SHORT, "messages": HI}).json()
    assert short["sampling_params"]["max_tokens"] == 4096 - len(HI_IDS)


def test_unknown_model_is_vllms_404(url: str) -> None:
    r = post(url, "/v1/chat/completions/render", {"model": "nope", "messages": HI})
    err = assert_openai_error(r, 404)
    assert err == {
        "message": f"The model `nope` does not exist. Valid aliases: {QWEN}, {LONG}, {SHORT}.",
        "type": "NotFoundError", "param": "model", "code": 404,
    }
    for path, body in (("/v1/completions/render", {"model": "nope", "prompt": "a"}),
                       ("/tokenize", {"model": "nope", "prompt": "a"}),
                       ("/detokenize", {"model": "nope", "tokens": [1]})):
        assert assert_openai_error(post(url, path, body), 404)["param"] == "model"


def test_completions_render_every_prompt_form(url: str) -> None:
    r = post(url, "/v1/completions/render", {"model": QWEN, "prompt": ["a b", "c"]})
    assert r.status_code == 200, r.text
    outs = r.json()
    assert [o["token_ids"] for o in outs] == [[64, 293], [66]]  # as vLLM's Python render answers
    assert all(list(o) == GENERATE_KEYS for o in outs)
    assert len({o["request_id"] for o in outs}) == 2
    one = post(url, "/v1/completions/render", {"prompt": "a b"}).json()
    assert [o["token_ids"] for o in one] == [[64, 293]]
    ids = post(url, "/v1/completions/render", {"prompt": [5, 6, 7]}).json()
    assert [o["token_ids"] for o in ids] == [[5, 6, 7]]
    lists = post(url, "/v1/completions/render", {"prompt": [[5], [6, 7]]}).json()
    assert [o["token_ids"] for o in lists] == [[5], [6, 7]]


def test_tokenize_detokenize(url: str) -> None:
    r = post(url, "/tokenize", {"model": QWEN, "prompt": "hello world", "return_token_strs": True})
    assert r.json() == {"count": 2, "max_model_len": 40960, "tokens": [14990, 1879],
                        "token_strs": ["hello", "Ġworld"]}
    chat = post(url, "/tokenize", {"messages": HI}).json()
    assert chat["tokens"] == HI_IDS and chat["count"] == len(HI_IDS)
    assert chat["token_strs"] is None
    no_gen = post(url, "/tokenize", {"messages": HI, "add_generation_prompt": False}).json()
    assert no_gen["tokens"] == HI_IDS[:6]
    both = post(url, "/tokenize", {"messages": HI, "continue_final_message": True})
    assert_openai_error(both, 400)
    assert post(url, "/detokenize", {"tokens": [14990, 1879]}).json() == {"prompt": "hello world"}
    special = post(url, "/detokenize", {"tokens": HI_IDS[:5]}).json()
    assert special == {"prompt": "<|im_start|>user\nhi<|im_end|>"}  # vLLM keeps special tokens
    text = "Grüße, 世界! 🚀 <think>x</think> tabs\tand  spaces"
    ids = post(url, "/tokenize", {"prompt": text}).json()["tokens"]
    assert post(url, "/detokenize", {"tokens": ids}).json()["prompt"] == text


def test_bad_input_is_openai_error_json(url: str) -> None:
    path = "/v1/chat/completions/render"
    err = assert_openai_error(post(url, path, b'{"messages": [{"role": "user"'), 400)
    assert err["type"] == "Bad Request"
    err = assert_openai_error(post(url, path, {"messages": "x"}), 400)
    assert err["param"] == "body.messages" and "Expected `array`" in err["message"]
    err = assert_openai_error(post(url, path, {"messages": [{"role": 5, "content": "x"}]}), 400)
    assert err["param"] == "body.messages.0.role"  # vLLM's naming of a field's path
    assert_openai_error(post(url, path, {}), 400)
    assert_openai_error(post(url, path, {"messages": []}), 400)
    assert_openai_error(post(url, path, b"\xff\xfe"), 400)
    assert_openai_error(post(url, path, {"messages": HI, "max_tokens": 10**6}), 400)
    assert_openai_error(post(url, "/detokenize", {"tokens": [-1]}), 400)
    # A request's own template is refused unless the operator allowed it.
    assert_openai_error(post(url, path, {"messages": HI, "chat_template": "{{ 1 }}"}), 400)
    assert httpx.get(url + "/health").status_code == 200


def test_bodies_over_the_inline_cap_answer_as_small_ones(url: str) -> None:
    # Over 64 KiB a body is decoded, rendered and encoded on a render thread: same answers, same
    # error JSON as on the loop (render/service/fast_route.py).
    text = " ".join(f"w{i % 997}x{i % 13}" for i in range(14_000))
    messages = [{"role": "user", "content": text}]
    body = json.dumps({"model": LONG, "messages": messages}).encode()
    assert len(body) > 65536
    out = post(url, "/v1/chat/completions/render", body)
    assert out.status_code == 200, out.text
    assert list(out.json()) == GENERATE_KEYS
    tokens = post(url, "/tokenize", {"model": LONG, "messages": messages}).json()["tokens"]
    assert out.json()["token_ids"] == tokens
    prompts = [text, text[: len(text) // 2]]
    outs = post(url, "/v1/completions/render", {"model": LONG, "prompt": prompts}).json()
    assert [o["token_ids"] for o in outs] == [
        post(url, "/tokenize", {"model": LONG, "prompt": p}).json()["tokens"] for p in prompts]
    err = assert_openai_error(post(url, "/v1/chat/completions/render",
                                   {"model": LONG, "messages": messages, "n": "two"}), 400)
    assert err["param"] == "body.n"
    err = assert_openai_error(post(url, "/v1/chat/completions/render",
                                   {"model": "nope", "messages": messages}), 404)
    assert "nope" in err["message"]


def test_body_over_limit_is_413(url: str) -> None:
    big = {"messages": [{"role": "user", "content": "x" * MAX_BODY}]}
    err = assert_openai_error(post(url, "/v1/chat/completions/render", big), 413)
    assert str(MAX_BODY) in err["message"]
    assert httpx.get(url + "/health").status_code == 200


def test_unknown_path_and_wrong_method(url: str) -> None:
    assert_openai_error(httpx.get(url + "/nothere"), 404)
    err = assert_openai_error(httpx.get(url + "/v1/chat/completions/render"), 405)
    assert err["type"] == "MethodNotAllowed"


def test_request_template_when_allowed_and_template_errors(open_url: str) -> None:
    path = "/v1/chat/completions/render"
    tpl = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
    r = post(open_url, path, {"messages": HI, "chat_template": tpl})
    assert r.status_code == 200, r.text
    tokens = post(open_url, "/tokenize", {"prompt": "[user]hi", "add_special_tokens": False})
    assert r.json()["token_ids"] == tokens.json()["tokens"]
    boom = "{{ raise_exception('roles must alternate, says the template') }}"
    err = assert_openai_error(post(open_url, path, {"messages": HI, "chat_template": boom}), 400)
    assert "roles must alternate, says the template" in err["message"]
    err = assert_openai_error(post(open_url, path, {"messages": HI, "chat_template": "{% if %}"}),
                              400)
    assert httpx.get(open_url + "/health").status_code == 200


def test_metrics_count_requests_errors_and_tokens(url: str) -> None:
    before = _metric(httpx.get(url + "/metrics").text, "kvroute_render_prompt_tokens_total",
                     f'model="{QWEN}"')
    post(url, "/v1/chat/completions/render", {"messages": HI})
    post(url, "/v1/chat/completions/render", {"model": "nope", "messages": HI})
    text = httpx.get(url + "/metrics").text
    assert _metric(text, "kvroute_render_prompt_tokens_total", f'model="{QWEN}"') == \
        before + len(HI_IDS)
    assert _metric(text, "kvroute_render_requests_total",
                   'route="/v1/chat/completions/render",status="404"') >= 1
    assert _metric(text, "kvroute_render_errors_total",
                   'route="/v1/chat/completions/render",type="NotFoundError"') >= 1
    assert _metric(text, "kvroute_render_request_seconds_count",
                   'route="/v1/chat/completions/render"') >= 2


def test_chat_render_same_answer_with_and_without_content_length(url: str) -> None:
    """Sized bodies take the raw ASGI route (render/service/fast_route.py), chunked ones the
    Starlette app: both must give the same answer and both must be counted."""
    path = "/v1/chat/completions/render"
    body = json.dumps({"messages": HI, "request_id": "same"}).encode()
    ok = 'route="/v1/chat/completions/render",status="200"'
    before = _metric(httpx.get(url + "/metrics").text, "kvroute_render_requests_total", ok)
    sized = post(url, path, body)
    chunked = httpx.post(url + path, content=iter([body[:7], body[7:]]),
                         headers={"content-type": "application/json"}, timeout=60)
    assert "content-length" not in chunked.request.headers
    assert sized.status_code == chunked.status_code == 200
    assert sized.headers["content-type"] == chunked.headers["content-type"] == "application/json"
    assert sized.json() == chunked.json()
    assert sized.json()["token_ids"] == HI_IDS
    after = _metric(httpx.get(url + "/metrics").text, "kvroute_render_requests_total", ok)
    assert after == before + 2


def _metric(text: str, name: str, labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and labels in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_two_workers_share_the_port() -> None:
    """Both workers answer on the one port: with one of them stopped (SIGSTOP), a fresh
    connection is accepted and answered by the other, each way round."""
    with render_service("--workers", "2", *NO_HELPER, workers=2) as service:
        pids = [int(p) for p in re.findall(r"ready on \S+ \(pid (\d+)\)", service.output)]
        assert len(set(pids)) == 2
        for stopped, serving in (pids, pids[::-1]):
            os.kill(stopped, signal.SIGSTOP)
            try:
                # One fresh keep-alive connection: its requests all reach the same worker.
                with httpx.Client(base_url=service.url, timeout=60) as c:
                    r = c.post("/v1/chat/completions/render", json={"messages": HI})
                    assert r.json()["token_ids"] == HI_IDS
                    workers = set(re.findall(r'worker="(\d+)"', c.get("/metrics").text))
                    assert workers == {str(serving)}
            finally:
                os.kill(stopped, signal.SIGCONT)


# --- the event loop stays free while a 100k-token chat renders -----------------------------


async def _roundtrip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     request: bytes) -> tuple[int, bytes]:
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    m = re.search(rb"(?i)content-length:\s*(\d+)", head)
    body = await reader.readexactly(int(m.group(1))) if m else b""
    return status, body


async def _helper_metric(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         name: str) -> float:
    status, text = await asyncio.wait_for(
        _roundtrip(reader, writer, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"), 60)
    assert status == 200
    m = re.search(rb"^" + name.encode() + rb"\{[^}]*\} (\S+)$", text, re.M)
    assert m, name
    return float(m.group(1))


async def test_health_answers_while_a_100k_token_chat_renders(service: RenderService) -> None:
    """/health is answered while a 100k-token chat is in the render helper's hands (the helper
    process, render/service/offload.py, keeps the render's CPU off the loop). The helper is stopped
    (SIGSTOP) before the chat is sent, so every probe is answered while that render provably has
    not finished; resumed, the helper answers the chat whole. How fast /health answers meanwhile
    is measured by bench/render_health.py, which checks the 5 ms p99 bound."""
    [helper] = service.wait_helpers_ready()
    host, port = service.url.removeprefix("http://").rsplit(":", 1)
    health = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    hr, hw = await asyncio.open_connection(host, int(port))  # the probes' connection
    cr, cw = await asyncio.open_connection(host, int(port))  # the chat's
    renders = await _helper_metric(hr, hw, "kvroute_render_helper_renders_total")
    rng = random.Random(7)
    vocab = ["".join(rng.choice("bcdfghklmnprstvz") + rng.choice("aeiou") for _ in range(3))
             for _ in range(3000)]
    os.kill(helper, signal.SIGSTOP)
    try:
        chat = asyncio.create_task(_roundtrip(cr, cw, chat_request(rng, vocab, LONG, CHAT)))
        # Until the server has read the chat and handed it to the helper. The gauge is the only
        # sign of that (nothing is pushed), so it is polled, backing off up to 100 ms.
        delay = 0.001
        async with asyncio.timeout(120):  # a bound on a hang only
            while await _helper_metric(hr, hw, "kvroute_render_helper_in_flight") < 1:
                assert not chat.done(), "the chat was answered without its helper"
                await asyncio.sleep(delay)
                delay = min(2 * delay, 0.1)
        for _ in range(50):
            status, _ = await asyncio.wait_for(_roundtrip(hr, hw, health), 60)
            assert status == 200
        assert not chat.done()  # all answered with the render still in the stopped helper
    finally:
        os.kill(helper, signal.SIGCONT)
    try:
        status, body = await asyncio.wait_for(chat, 240)
    finally:
        hw.close()
        cw.close()
    assert status == 200, body[:300]
    assert len(json.loads(body)["token_ids"]) >= 100_000
    with httpx.Client(base_url=service.url, timeout=60) as c:
        after = c.get("/metrics").text
    assert re.search(r"^kvroute_render_helper_in_flight\{[^}]*\} 0\.0$", after, re.M)
    m = re.search(r"^kvroute_render_helper_renders_total\{[^}]*\} (\S+)$", after, re.M)
    assert m and float(m.group(1)) == renders + 1  # rendered in the helper, not on a thread


# --- fuzzing: no input gives a 5xx ----------------------------------------------------------

_scalar = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                    st.floats(allow_nan=False), st.text(max_size=20))
_json = st.recursive(_scalar, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)
_part = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "refusal", "bogus"]),
                           "text": st.one_of(st.text(max_size=30), _scalar)}),
    st.text(max_size=10), _json)
_content = st.one_of(st.none(), st.text(max_size=60), st.lists(_part, max_size=3), _json)
_message = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant", "tool", "developer", "x"]),
         "content": _content},
        optional={"tool_calls": st.one_of(_json, st.lists(st.fixed_dictionaries(
            {"id": st.text(max_size=12), "type": st.just("function"),
             "function": st.fixed_dictionaries({"name": st.text(max_size=8),
                                                "arguments": st.one_of(st.text(max_size=20),
                                                                       _json)})}), max_size=2)),
                  "tool_call_id": _scalar, "name": _scalar, "reasoning": _scalar}),
    _json)
_sampling = {k: st.one_of(_scalar, _json) for k in (
    "max_tokens", "temperature", "top_p", "top_k", "stop", "n", "seed", "logit_bias",
    "stop_token_ids", "response_format", "logprobs", "top_logprobs", "priority", "cache_salt",
    "request_id", "tools", "tool_choice", "chat_template_kwargs", "add_generation_prompt",
    "continue_final_message", "structured_outputs", "min_tokens", "stream_options")}
_chat = st.fixed_dictionaries({"messages": st.lists(_message, max_size=4)}, optional={
    "model": st.sampled_from([QWEN, SHORT, "nope", None]), **_sampling})
_completion = st.fixed_dictionaries({"prompt": st.one_of(
    st.text(max_size=40), st.lists(st.integers(-5, 200000), max_size=5),
    st.lists(st.text(max_size=10), max_size=3), _json)}, optional=_sampling)
_tokenize = st.one_of(
    st.fixed_dictionaries({"prompt": _scalar}, optional={"add_special_tokens": _scalar,
                                                         "return_token_strs": _scalar}),
    st.fixed_dictionaries({"messages": st.lists(_message, max_size=3)},
                          optional={"add_generation_prompt": _scalar, "tools": _json}))
_detokenize = st.fixed_dictionaries({"tokens": st.one_of(
    st.lists(st.integers(-3, 2**64), max_size=6), _json)}, optional={"model": _scalar})
_case = st.one_of(
    st.tuples(st.just("/v1/chat/completions/render"), st.one_of(_chat, _json)),
    st.tuples(st.just("/v1/completions/render"), st.one_of(_completion, _json)),
    st.tuples(st.just("/tokenize"), st.one_of(_tokenize, _json)),
    st.tuples(st.just("/detokenize"), st.one_of(_detokenize, _json)),
)


@pytest.fixture(scope="module")
def client(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=60) as c:
        yield c


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=_case, garble=st.sampled_from([None, None, None, "truncate", "bytes"]))
def test_fuzz_never_5xx(client: httpx.Client, case: tuple[str, Any], garble: str | None) -> None:
    path, body = case
    raw = json.dumps(body).encode()
    if garble == "truncate":
        raw = raw[: len(raw) // 2]
    elif garble == "bytes":
        raw = raw.replace(b'"', b"\xc3", 1)
    r = client.post(path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code < 500, (path, raw[:400], r.text[:400])
    if r.status_code >= 400:
        assert_openai_error(r, r.status_code)
    else:
        json.loads(r.content)

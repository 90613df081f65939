"""Structured outputs and bad_words through the router on a REAL headless vLLM engine.

The router checks each constraint and resolves its backend as vLLM's frontend does
(render/structured.py): the engine builds the grammar and the output satisfies it; a constraint
no backend takes is the router's 400 and never reaches the engine. ``bad_words`` reaches the
engine as the token ids vLLM's frontend computes, so a banned token is never sampled.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from devtools.cluster import ClusterOptions, LocalCluster
from render.errors import BadRequestError
from render.protocol import ChatCompletionRequest
from tests.engines import TINY_MODEL, EngineProc
from tests.structured_corpus import cases

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def cluster(vllm_engine: EngineProc) -> Iterator[LocalCluster]:
    e = vllm_engine
    assert e.ready is not None
    spec = e.linked()
    # Served as Qwen3 is (hermes): vLLM honours a named tool_choice only with a tool parser,
    # which it loads only with --enable-auto-tool-choice.
    with LocalCluster(ClusterOptions(external=(spec,), model=str(TINY_MODEL), ready_timeout=120,
                                     tool_call_parser="hermes",
                                     enable_auto_tool_choice=True)) as c:
        yield c


@pytest.fixture(scope="module")
def http(cluster: LocalCluster) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=cluster.base_url, timeout=120) as c:
        yield c


def _chat(http: httpx.Client, cluster: LocalCluster, content: str = "Answer me",
          **extra: Any) -> httpx.Response:
    body = {"model": cluster.state.models.registry.names()[0], "temperature": 0,
            "messages": [{"role": "user", "content": content}], "max_tokens": 24, **extra}
    return http.post("/v1/chat/completions", json=body)


def _text(r: httpx.Response) -> tuple[str, str]:
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return choice["message"]["content"] or "", choice["finish_reason"]


# Each constraint, a request, and what a finished ("stop") answer must satisfy.
CONSTRAINED: list[tuple[str, dict[str, Any], Any]] = [
    ("json_object", {"response_format": {"type": "json_object"}},
     lambda t: isinstance(json.loads(t), dict)),
    ("json_schema", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "colour", "schema": {"type": "string", "enum": ["red", "green"]}}}},
     lambda t: json.loads(t) in ("red", "green")),
    # Terminating schemas: a random-weight model may fill a free-form object with whitespace.
    ("json", {"structured_outputs": {"json": {"anyOf": [{"type": "boolean"},
                                                        {"type": "integer", "minimum": 0,
                                                         "maximum": 9}]}}},
     lambda t: json.loads(t) in (True, False, *range(10))),
    ("regex", {"structured_outputs": {"regex": "(yes|no)[0-9]"}},
     lambda t: re.fullmatch("(yes|no)[0-9]", t) is not None),
    ("choice", {"structured_outputs": {"choice": ["alpha", "beta gamma"]}},
     lambda t: t in ("alpha", "beta gamma")),
    ("grammar (EBNF)", {"structured_outputs": {"grammar": 'root ::= "up" | "down"'}},
     lambda t: t in ("up", "down")),
    ("grammar (Lark)", {"structured_outputs": {"grammar": 'start: "left" | "right"'}},
     lambda t: t in ("left", "right")),
    ("regex via guidance", {"structured_outputs": {"regex": "[a-c]{2}"}},
     lambda t: re.fullmatch("[a-c]{2}", t) is not None),
]


@pytest.mark.parametrize(("name", "extra", "check"), CONSTRAINED, ids=[c[0] for c in CONSTRAINED])
def test_constraint_holds_on_the_real_engine(http: httpx.Client, cluster: LocalCluster,
                                             name: str, extra: dict[str, Any],
                                             check: Any) -> None:
    stopped = 0
    for prompt in ("Answer me", "Pick one", "Go"):
        text, finish = _text(_chat(http, cluster, prompt, **extra))
        assert finish in ("stop", "length")
        if finish == "stop":
            stopped += 1
            assert check(text), (name, text)
    if name != "json_object":  # a random-weight model may ramble inside a free-form object
        assert stopped > 0, name


@pytest.mark.parametrize("extra", [
    {"structured_outputs": {"json": {"type": "foo"}}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "integer", "minimum": 5, "maximum": 1}}}},
    {"structured_outputs": {"regex": "(abc"}},
    {"structured_outputs": {"grammar": "root ::= undefined_rule"}},
    {"structured_outputs": {"choice": []}},
    {"structured_outputs": {"regex": "a", "choice": ["a"]}},
    {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
    {"response_format": {"type": "structural_tag", "format": {"type": "nope"}}},
], ids=["bad type", "empty range", "bad regex", "bad grammar", "empty choice", "two kinds",
        "format and constraint", "bad structural tag"])
def test_invalid_constraint_is_the_routers_400(http: httpx.Client, cluster: LocalCluster,
                                               extra: dict[str, Any]) -> None:
    before = _routed_prompt_tokens(http)
    r = _chat(http, cluster, **extra)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "BadRequestError"
    # Refused before routing: no prompt reached an engine.
    assert _routed_prompt_tokens(http) == before


def _routed_prompt_tokens(http: httpx.Client) -> float:
    text = http.get("/metrics").text
    found = re.search(r"^kvroute_prompt_tokens_total (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def test_bad_words_reach_the_engine(http: httpx.Client, cluster: LocalCluster) -> None:
    renderer = cluster.state.models.registry.get(None)
    body = {"max_tokens": 8, "ignore_eos": True, "return_token_ids": True}
    for prompt in ("Tell me a story", "Hello there", "Count to three", "Why", "Name a colour"):
        free = _chat(http, cluster, prompt, **body).json()["choices"][0]["token_ids"]
        # A sampled token that is a whole bad word by vLLM's rule (as written, or spaced).
        word = next((w for w in (renderer.decode([t]) for t in free)
                     if [renderer.encode(w, False)[0]] in _banned(renderer, w)
                     and len(renderer.encode(w, False)) == 1), None)
        if word is not None:
            break
    else:
        pytest.fail("no sampled token is a one-token word")
    token = renderer.encode(word, False)[0]
    assert token in free
    banned = _chat(http, cluster, prompt, bad_words=[word], **body).json()
    ids = banned["choices"][0]["token_ids"]
    # The engine banned the word's token: greedy decoding took another one, every time.
    assert token not in ids, (word, ids)
    assert ids != free


def _banned(renderer: Any, word: str) -> list[list[int]]:
    from render.bad_words import bad_words_token_ids

    return bad_words_token_ids([word], lambda text: renderer.encode(text, False)) or []


def test_no_structured_request_fails_the_engine(http: httpx.Client,
                                                cluster: LocalCluster) -> None:
    """Every corpus request is the router's 400 or the engine's 200; the engine lives on."""
    renderer = cluster.state.models.registry.get(None)
    statuses: dict[int, int] = {}
    sticky = []
    for extra in cases(odd=60):
        if "bad_words" in extra:
            continue
        r = _chat(http, cluster, max_tokens=6, **extra)
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        if r.status_code == 200:
            continue
        if r.status_code == 400:
            assert r.json()["error"]["type"] == "BadRequestError"
            continue
        # vLLM's engine builds every grammar with the backend of its first structured request
        # (xgrammar here): a request vLLM's "auto" sends to guidance, because xgrammar refuses
        # it, fails there as it does behind `vllm serve` (docs/operations.md).
        resolved = _resolve(renderer, extra)
        assert resolved == "guidance", (extra, r.status_code, r.text)
        sticky.append(extra)
    assert statuses.get(200, 0) > 50 and statuses.get(400, 0) > 30, statuses
    assert len(sticky) <= 12, sticky
    text, _ = _text(_chat(http, cluster, max_tokens=4))
    assert isinstance(text, str)


def _resolve(renderer: Any, extra: dict[str, Any]) -> str | None:
    import msgspec

    req = msgspec.json.decode(json.dumps({"messages": [{"role": "user", "content": "x"}],
                                          **extra}), type=ChatCompletionRequest)
    try:
        so = renderer.render_chat(req).sampling_params.structured_outputs
    except BadRequestError:
        return None
    return None if so is None else str(so._backend)


UNIT_TOOL: dict[str, Any] = {"type": "function", "function": {
    "name": "pick_unit", "description": "Pick a temperature unit",
    "parameters": {"type": "object", "properties": {"unit": {"type": "string",
                                                             "enum": ["c", "f"]}},
                   "required": ["unit"], "additionalProperties": False}}}


def _unit_args(arguments: str) -> dict[str, Any]:
    """A call's arguments, checked against the tool's schema."""
    args = json.loads(arguments)
    assert isinstance(args, dict) and set(args) == {"unit"} and args["unit"] in ("c", "f"), args
    return args


def test_a_named_tool_choice_is_a_parsed_call_valid_for_its_schema(
        http: httpx.Client, cluster: LocalCluster) -> None:
    """tool_choice names a function: the engine decodes under the tool's JSON schema (vLLM's
    structured output for it) and the answer is that call, collected and streamed alike."""
    named = {"type": "function", "function": {"name": "pick_unit"}}
    finished, seen = 0, []
    no_padding = _whitespace_bias(cluster)
    for prompt in ("Which unit?", "Pick one", "Go", "Celsius or Fahrenheit?"):
        r = _chat(http, cluster, prompt, tools=[UNIT_TOOL], tool_choice=named, max_tokens=48,
                  logit_bias=no_padding)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        seen.append((choice["finish_reason"], choice["message"]))
        if choice["finish_reason"] != "stop":
            continue  # a random-weight model may pad the object with whitespace to the limit
        finished += 1
        [call] = choice["message"]["tool_calls"]
        assert call["type"] == "function" and call["function"]["name"] == "pick_unit"
        collected = _unit_args(call["function"]["arguments"])
        streamed = _streamed_call(http, cluster, prompt, named, no_padding)
        assert streamed[0] == "pick_unit" and _unit_args(streamed[1]) == collected
    assert finished > 0, seen


def _whitespace_bias(cluster: LocalCluster) -> dict[str, int]:
    """Whitespace-only tokens biased away: the JSON grammar lets a random-weight model pad an
    object with whitespace until max_tokens, and greedy decoding does."""
    vocab = cluster.state.models.registry.get(None).tokenizer.get_vocab()
    return {str(i): -100 for piece, i in vocab.items() if piece and set(piece) <= set("ĠĊĉč")}


def _streamed_call(http: httpx.Client, cluster: LocalCluster, prompt: str,
                   named: dict[str, Any], bias: dict[str, int]) -> tuple[str, str]:
    body = {"model": cluster.state.models.registry.names()[0], "temperature": 0,
            "logit_bias": bias, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 48,
            "tools": [UNIT_TOOL], "tool_choice": named, "stream": True}
    name, arguments = "", ""
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for ch in json.loads(line[6:]).get("choices", []):
                for tc in ch["delta"].get("tool_calls") or []:
                    name += tc.get("function", {}).get("name") or ""
                    arguments += tc.get("function", {}).get("arguments") or ""
    return name, arguments

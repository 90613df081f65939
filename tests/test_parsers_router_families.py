"""Every tool-call and reasoning parser end to end: the official openai client, the router serving
each family's tokenizer with vLLM's parser flags (paired as vLLM serves the model), and a sim
scripted (``vllm_xargs.kvroute_sim_token_ids``) to emit the corpus's output for that parser.

One router per parser configuration, each started once. The outputs are the corpus's two-call
cases (tests/parser_corpus.py), alone and after the family's reasoning block.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import openai
import pytest

from devtools.cluster import ClusterOptions, LocalCluster
from output.parsers.registry import TOOL_PARSERS
from sim.tokens import TokenTable
from tests.parser_corpus import TOOLS, all_cases
from tests.parser_oracle import eos_id, model_dir, tokenizer

pytestmark = pytest.mark.families

CORPUS = {c.id: c.output for c in all_cases()}
MESSAGES: list[Any] = [{"role": "user", "content": "Weather in Paris, and the time?"}]
PARIS = [("get_weather", {"city": "Paris"}), ("get_time", {})]
# XML parameters are typed by the tool's schema: "3" is an integer for get_weather's days.
PARIS_DAYS = [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {})]
THOUGHT = "Need weather."

RANDOM_ID = re.compile(r"chatcmpl-tool-[0-9a-f]{16}")
KIMI_ID = re.compile(r"functions\.(get_weather|get_time):\d+")
MISTRAL_ID = re.compile(r"[A-Za-z0-9]{9}")


@dataclass(frozen=True)
class Served:
    """A model as vLLM serves it: tokenizer family, parser flags, and what its calls look like."""

    family: str
    tool_parser: str
    reasoning_parser: str | None
    calls: str  # the corpus's two-call output (its case id)
    expected: list[tuple[str, dict[str, Any]]]
    call_id: re.Pattern[str] = RANDOM_ID
    # The reasoning script's block before the calls and the reasoning_content it gives; None:
    # the family's tokenizer cannot spell the parser's markers (vLLM refuses or ignores them).
    think: tuple[str, str] | None = None
    # Template switches: thinking off for the calls alone, on for the reasoning script.
    off: dict[str, Any] = field(default_factory=dict)
    on: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return "+".join(p for p in (self.tool_parser, self.reasoning_parser) if p)


QWEN_OFF = {"enable_thinking": False}
SERVED = [
    # Qwen3-Coder-style XML calls with Qwen3's reasoning.
    Served("qwen3", "qwen3_coder", "qwen3", "qwen3_coder/two_calls", PARIS_DAYS,
           think=(f"<think>\n{THOUGHT}\n</think>\n\n", f"\n{THOUGHT}\n"), off=QWEN_OFF),
    # GLM-4.7 (glm47 calls, glm45 reasoning). No GLM or Kimi tokenizer fixture: their markers
    # are text in the Qwen3 vocabulary, as in the corpus.
    Served("qwen3", "glm47", "glm45", "glm47/two_calls", PARIS_DAYS,
           think=(f"<think>{THOUGHT}</think>", THOUGHT), off=QWEN_OFF),
    Served("qwen3", "kimi_k2", "kimi_k2", "kimi_k2/two_calls", PARIS, KIMI_ID,
           think=(f"<think>{THOUGHT}</think>", THOUGHT), off={**QWEN_OFF, "thinking": False}),
    # DeepSeek V3 / V3.1 calls. The fixture's DeepSeek-V3 vocabulary has no <think> token:
    # vLLM refuses the deepseek_r1 / deepseek_v3 reasoning parsers with it.
    Served("deepseek_v3_1", "deepseek_v3", None, "deepseek_v3/two_calls", PARIS),
    Served("deepseek_v3_1", "deepseek_v31", None, "deepseek_v31/two_calls", PARIS),
    # Llama 3.x JSON calls and the pythonic lists (no Llama 4 fixture: the Llama 3.1 vocabulary,
    # as in the corpus).
    Served("llama3_1", "llama3_json", None, "llama3_json/two_calls", PARIS),
    Served("llama3_1", "pythonic", None, "pythonic/two_calls", PARIS),
    Served("llama3_1", "llama4_pythonic", None, "llama4_pythonic/two_calls", PARIS),
    # gpt-oss: Harmony channels carry both reasoning and calls.
    Served("gpt_oss", "openai", "openai_gptoss", "openai/two_calls", PARIS,
           think=(f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant",
                  THOUGHT)),
    # Mistral: [TOOL_CALLS] is a special token of tekken. Nemo's vocabulary has no [THINK]
    # token (Magistral's has): the reasoning markers stay text there, in vLLM too.
    Served("mistral_nemo", "mistral", "mistral", "mistral/two_calls", PARIS, MISTRAL_ID),
]
# vLLM's other names for the same formats: the registry serves them with the same parser.
ALIASES = {"qwen3_xml": "qwen3_coder", "glm45": "glm47", "llama4_json": "llama3_json",
           "qwen3_json": "hermes"}


@pytest.fixture(scope="module", params=SERVED, ids=lambda s: s.name)
def served(request: pytest.FixtureRequest) -> Iterator[tuple[Served, Any]]:
    s: Served = request.param
    path = model_dir(s.family)
    if not (path / "tokenizer.json").exists():
        pytest.fail(f"{path} missing: run `bash scripts/fixtures.sh` (or deselect -m families)")
    opts = ClusterOptions(engines=1, sim={"step_time": 0.0005}, sim_tokens=_sim_tokens(path),
                          tool_call_parser=s.tool_parser, reasoning_parser=s.reasoning_parser,
                          enable_auto_tool_choice=True,
                          model=None if s.family == "qwen3" else str(path))
    with LocalCluster(opts) as cluster, openai.OpenAI(
            base_url=cluster.base_url + "/v1", api_key="x", max_retries=0) as client:
        model = client.models.list().data[0].id
        yield s, lambda text, kwargs, **kw: client.chat.completions.create(
            model=model, messages=MESSAGES, tools=list[Any](TOOLS), max_tokens=200,
            extra_body={"vllm_xargs": {"kvroute_sim_token_ids": _ids(s.family, text)},
                        **({"chat_template_kwargs": kwargs} if kwargs else {})}, **kw)


@cache
def _sim_tokens(path: Path) -> TokenTable:
    """One sim vocabulary per family, shared by its routers."""
    return TokenTable.from_model_dir(path)


def _ids(family: str, text: str) -> list[int]:
    """The text as the model's tokens, then its EOS (the sim stops there)."""
    return [*tokenizer(family).encode(text, add_special_tokens=False).ids, eos_id(family)]


def _scripts(s: Served) -> list[tuple[str, dict[str, Any], str | None]]:
    """(output, template switches, expected reasoning): the calls alone, then after reasoning."""
    out: list[tuple[str, dict[str, Any], str | None]] = [(CORPUS[s.calls], s.off, None)]
    if s.think is not None:
        block, reasoning = s.think
        out.append((block + CORPUS[s.calls], s.on, reasoning))
    return out


def _calls(s: Served, calls: list[tuple[str, str, str]]) -> None:
    """The calls are the expected ones: names, arguments as JSON, ids in the family's format."""
    assert [(name, json.loads(args)) for _, name, args in calls] == s.expected
    assert all(s.call_id.fullmatch(call_id) for call_id, _, _ in calls), calls


def test_aliases_are_the_same_parser() -> None:
    for alias, name in ALIASES.items():
        assert TOOL_PARSERS[alias] is TOOL_PARSERS[name]
    # hermes (with qwen3 reasoning) is served in tests/test_parsers_router.py.
    assert {s.tool_parser for s in SERVED} | set(ALIASES) | {"hermes"} == set(TOOL_PARSERS)


def test_collected(served: tuple[Served, Any]) -> None:
    s, ask = served
    for text, kwargs, reasoning in _scripts(s):
        r = ask(text, kwargs)
        msg = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls", (text, msg)
        assert msg.content is None, msg
        assert getattr(msg, "reasoning_content", None) == reasoning, msg
        _calls(s, [(c.id, c.function.name, c.function.arguments) for c in msg.tool_calls])
        assert all(c.type == "function" for c in msg.tool_calls)


def test_streamed(served: tuple[Served, Any]) -> None:
    s, ask = served
    for text, kwargs, reasoning in _scripts(s):
        folded = _fold(list(ask(text, kwargs, stream=True)))
        assert folded["finish"] == "tool_calls", (text, folded)
        assert folded["content"] == "", folded
        assert folded["reasoning"] == (reasoning or ""), folded
        _calls(s, folded["calls"])


def _fold(chunks: list[Any]) -> dict[str, Any]:
    """A client's fold of the stream; a call's first delta names it (index, id, type, name)."""
    content, reasoning, finish = [], [], None
    calls: dict[int, list[str]] = {}
    for chunk in chunks:
        for ch in chunk.choices:
            d = ch.delta
            content.append(d.content or "")
            reasoning.append(getattr(d, "reasoning_content", None) or "")
            assert (getattr(d, "reasoning", None) or "") == reasoning[-1]
            for tc in d.tool_calls or []:
                if tc.index not in calls:
                    assert tc.id and tc.type == "function" and tc.function.name, tc
                    calls[tc.index] = [tc.id, tc.function.name, ""]
                else:
                    assert tc.id is None and tc.function.name is None, tc
                calls[tc.index][2] += tc.function.arguments or ""
            finish = ch.finish_reason or finish
    return {"content": "".join(content), "reasoning": "".join(reasoning), "finish": finish,
            "calls": [(i, n, a) for i, n, a in (calls[k] for k in sorted(calls))]}

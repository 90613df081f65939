"""Chunking never changes a parsed answer, and the stream folds to exactly the collected body.

Every corpus case (tests/parser_corpus.py) runs through the real output pipeline with its
tokens one per engine step, in random steps of 2-8 tokens (as speculative decoding / MTP deliver
them), and through the choice parser as single characters of text (every marker split at every
boundary); the SSE stream folded by a client equals the collected body in each. No vLLM here:
tests/test_parsers_oracle.py holds the answers to vLLM's.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.parser_corpus import all_cases
from tests.parser_oracle import Case, fold_sse, model_dir, normal, parsers_for, run_kvroute

CASES = all_cases()
# Families whose tokenizer is a fixture (scripts/fixtures.sh) rather than the embedded Qwen3.
NEEDS_FIXTURES = sorted({c.family for c in CASES if c.family != "qwen3"})


def _mark(case: Case) -> Any:
    marks = [pytest.mark.families] if case.family != "qwen3" else []
    return pytest.param(case, id=case.id, marks=marks)


def _skip_without(case: Case) -> None:
    if not (model_dir(case.family) / "tokenizer.json").exists():
        pytest.skip(f"no {case.family} tokenizer: run scripts/fixtures.sh")


def _by_chars(case: Case) -> dict[str, Any]:
    """The choice parser fed one character at a time: every marker split at every boundary."""
    factory = parsers_for(case)
    if factory is None:  # no parser applies to this model (e.g. no [THINK] token)
        return {"content": case.output, "reasoning": "", "calls": []}
    parser = factory(0)
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, list[str]] = {}
    pieces = list(case.output) or [""]
    for i, piece in enumerate(pieces):
        delta = parser.parse(piece, [], i == len(pieces) - 1)
        if delta is None:
            continue
        content.append(delta.content or "")
        reasoning.append(delta.reasoning_content or "")
        for tc in delta.tool_calls or []:
            fn = tc.function
            assert fn is not None
            if tc.index not in calls:
                assert fn.name is not None
                calls[tc.index] = [fn.name, ""]
            calls[tc.index][1] += fn.arguments or ""
    return {"content": "".join(content), "reasoning": "".join(reasoning),
            "calls": [tuple(calls[k]) for k in sorted(calls)]}


def _parts(answer: dict[str, Any]) -> dict[str, Any]:
    """What any chunking must leave equal (ids are random, finish_reason is per step)."""
    return {"content": answer["content"] or "", "reasoning": answer["reasoning"] or "",
            "calls": [(c["name"], c["arguments"]) for c in answer["tool_calls"]]}


@pytest.mark.parametrize("case", [_mark(c) for c in CASES])
def test_stream_folds_to_the_collected_body(case: Case) -> None:
    _skip_without(case)
    for sizes in ([1], [3, 2, 8, 5, 4, 7, 2, 6], [64]):
        collected = run_kvroute(case, sizes)
        streamed = run_kvroute(case, sizes, stream=True)
        # A stream has no message: its content is what the deltas said, "" or none at all.
        assert normal({**streamed, "content": streamed["content"] or None}) == normal(
            {**collected, "content": collected["content"] or None})
        assert _parts(streamed) == _parts(run_kvroute(case))
    assert _by_chars(case) == _parts(run_kvroute(case))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(index=st.integers(0, len(CASES) - 1),
       sizes=st.lists(st.integers(2, 8), min_size=1, max_size=12))
def test_random_multi_token_steps_change_nothing(index: int, sizes: list[int]) -> None:
    case = CASES[index]
    if not (model_dir(case.family) / "tokenizer.json").exists():
        return
    assert _parts(run_kvroute(case, sizes, stream=True)) == _parts(run_kvroute(case))


def test_the_corpus_is_big_enough() -> None:
    from tests.parser_corpus import by_parser

    counts = by_parser(CASES)
    assert all(n >= 30 for n in counts.values()), counts


def test_fold_sse_reads_what_the_pipeline_writes() -> None:
    case = next(c for c in CASES if c.id == "hermes/two_calls")
    folded = fold_sse([b'data: {"choices": []}\n\n'])
    assert folded["tool_calls"] == [] and folded["content"] is None
    assert len(run_kvroute(case, stream=True)["tool_calls"]) == 2

"""Sending a parity case and comparing two answers field by field (tests/test_parity_vllm.py).

An answer is reduced to a flat ``view``: a dict from a field's path (``choices[0].message.content``,
``stream.kinds``, ``error.type``) to its value. Two views are compared key by key; the differing
paths, with list indexes folded (``choices[].logprobs...``), are the fields that differ.

What is set aside: ids (unless the case compares them), ``created``, ``system_fingerprint``,
tool-call ids (random on both sides) and null-valued keys (a field written as null and a field
left out read the same to a JSON client). Streams are compared as a client assembles them:
per choice the concatenated content, reasoning, token ids, logprobs, tool calls, finish and stop
reason; the chunk kinds in order (role, finish, usage, error: content chunks before the finish
are left out, since vLLM merges outputs that queue and how many there are, if any, varies);
each kind's key layout (a content chunk's when both sides sent one); and the final usage. A
case with ``compare_chunks`` also compares how its chunks hold its tokens (``stream_interval``).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

import httpx

from tests.parity_corpus import Case

# Logprobs of the same model on two engine processes agree to float noise.
LOGPROB_TOLERANCE = 1e-3
_ASIDE = ("created", "system_fingerprint")


@dataclass
class Answer:
    status: int
    body: Any  # the decoded JSON body (non-stream or a refused stream), else None
    events: list[Any] | None  # a stream's decoded data events, "[DONE]" kept as the string
    text: str  # the raw body


def send(client: httpx.Client, base_url: str, case: Case) -> Answer:
    """Send ``case`` to the server at ``base_url`` and read the whole answer."""
    headers = dict(case.headers)
    if case.content_type is not None:
        headers["content-type"] = case.content_type
    content = case.raw if case.raw is not None else (
        json.dumps(case.body).encode() if case.body is not None else b"")
    request = client.build_request(case.method, base_url + case.path, headers=headers,
                                   content=content if case.method == "POST" else None)
    if case.content_type is None:
        request.headers.pop("content-type", None)
    response = client.send(request)
    text = response.text
    ctype = response.headers.get("content-type", "")
    if ctype.startswith("text/event-stream"):
        events = [e if e == "[DONE]" else _json(e)
                  for e in (line[len("data: "):] for line in text.split("\n")
                            if line.startswith("data: "))]
        return Answer(response.status_code, None, events, text)
    return Answer(response.status_code, _json(text), None, text)


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def view(case: Case, answer: Answer) -> dict[str, Any]:
    """The comparable facets of one answer."""
    out: dict[str, Any] = {"status": answer.status}
    if answer.events is None:
        body = answer.body
        if isinstance(body, dict) and "error" in body:
            _error(out, "error", body["error"], case)
        elif isinstance(body, dict):
            _flatten(out, "", _clean(body, case, top=True))
            for key in [k for k in out if _folded(k) in case.aside]:
                del out[key]
        else:
            out["body"] = answer.text if body is None else body
        return out
    _stream(out, case, answer.events)
    return out


def _error(out: dict[str, Any], prefix: str, err: Any, case: Case) -> None:
    if not isinstance(err, dict):
        out[prefix] = err
        return
    out[f"{prefix}.type"] = err.get("type")
    out[f"{prefix}.code"] = err.get("code")
    if case.compare_message:
        out[f"{prefix}.message"] = err.get("message")
        out[f"{prefix}.param"] = err.get("param")


def _clean(value: Any, case: Case, top: bool = False) -> Any:
    """Null keys dropped, ids and timestamps set aside."""
    if isinstance(value, dict):
        aside = set(_ASIDE) if top else set()
        if top and not case.compare_id:
            aside.add("id")
        if "function" in value and "type" in value:  # a tool call: its id is random
            aside.add("id")
        if value.get("token") == "" and "logprob" in value:
            # A token that is part of a multi-byte character: kvroute's bytes are its raw
            # bytes, vLLM's those of its "" (docs/parity.md, on purpose).
            aside.add("bytes")
        return {k: _clean(v, case) for k, v in value.items()
                if v is not None and k not in aside}
    if isinstance(value, list):
        return [_clean(v, case) for v in value]
    return value


def _flatten(out: dict[str, Any], prefix: str, value: Any) -> None:
    if isinstance(value, dict):
        if not value:
            out[prefix] = {}
        for k, v in value.items():
            _flatten(out, f"{prefix}.{k}" if prefix else k, v)
    elif isinstance(value, list) and value and isinstance(value[0], dict | list):
        out[prefix + ".len"] = len(value)
        for i, v in enumerate(value):
            _flatten(out, f"{prefix}[{i}]", v)
    else:
        out[prefix] = value


def _kind(chunk: dict[str, Any], choice: dict[str, Any] | None) -> str:
    if choice is None:
        return "usage" if chunk.get("usage") is not None else "empty"
    delta = choice.get("delta") or {}
    if choice.get("finish_reason") is not None:
        return "finish"
    if delta.get("role") is not None:
        return "role"
    return "content"


def _stream(out: dict[str, Any], case: Case, events: list[Any]) -> None:
    out["stream.done"] = bool(events) and events[-1] == "[DONE]"
    chunks = [e for e in events if e != "[DONE]"]
    kinds: dict[int, list[str]] = {}
    layout: dict[str, Any] = {}
    acc: dict[int, dict[str, Any]] = {}
    tail: list[str] = []
    for chunk in chunks:
        if not isinstance(chunk, dict):
            tail.append("garbage")
            continue
        if "error" in chunk:
            tail.append("error")
            _error(out, "stream.error", chunk["error"], case)
            continue
        for key in ("prompt_token_ids", "prompt_text", "prompt_logprobs", "kv_transfer_params"):
            if chunk.get(key) is not None:
                out[f"stream.{key}"] = chunk[key]
        if case.compare_id:
            out["stream.id"] = chunk.get("id")
        choices = chunk.get("choices") or []
        if not choices:
            kind = _kind(chunk, None)
            tail.append(kind)
            layout.setdefault(kind, _skeleton(_clean(chunk, case, top=True)))
            if chunk.get("usage") is not None:
                out["stream.usage"] = _clean(chunk["usage"], case)
            continue
        for choice in choices:
            i = choice.get("index", 0)
            kind = _kind(chunk, choice)
            kinds.setdefault(i, []).append(kind)
            layout.setdefault(kind, _skeleton(_clean(chunk, case, top=True)))
            _fold(acc.setdefault(i, {}), choice, chunk, case.compare_chunks)
    for i in sorted(kinds):
        out[f"stream.kinds[{i}]"] = _runs(_without_early_content(kinds[i]))
        sizes = acc[i].pop("chunk_sizes", None)
        if sizes is not None and case.body is not None:
            out[f"stream.choices[{i}].interval"] = _interval(sizes, case.body["stream_interval"])
        for key, value in sorted(acc[i].items()):
            out[f"stream.choices[{i}].{key}"] = value
    out["stream.tail"] = _runs(tail)
    for kind, skeleton in sorted(layout.items()):
        out[f"stream.layout.{kind}"] = skeleton


def _fold(acc: dict[str, Any], choice: dict[str, Any], chunk: dict[str, Any],
          chunks: bool) -> None:
    """One chunk's choice folded into what a client assembles for that choice."""
    delta = choice.get("delta")
    if delta is None:  # completions: text on the choice itself
        delta = {"content": choice.get("text")}
    for key in ("content", "reasoning", "reasoning_content"):
        if delta.get(key):
            acc[key] = acc.get(key, "") + delta[key]
    for tc in delta.get("tool_calls") or ():
        calls = acc.setdefault("tool_calls", {})
        cur = calls.setdefault(str(tc.get("index")), {"name": "", "arguments": ""})
        fn = tc.get("function") or {}
        cur["name"] += fn.get("name") or ""
        cur["arguments"] += fn.get("arguments") or ""
    if choice.get("token_ids") is not None:
        acc["token_ids"] = acc.get("token_ids", []) + choice["token_ids"]
    lp = choice.get("logprobs")
    if lp is not None:
        if "content" in lp:  # chat
            acc["logprobs.content"] = acc.get("logprobs.content", []) + [
                _clean(entry, Case("", "", None)) for entry in lp["content"] or []]
        else:  # completions: parallel lists
            for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                acc[f"logprobs.{key}"] = acc.get(f"logprobs.{key}", []) + (lp.get(key) or [])
    if choice.get("finish_reason") is not None:
        acc["finish_reason"] = choice["finish_reason"]
        acc["stop_reason"] = choice.get("stop_reason")
    if chunk.get("usage") is not None:  # continuous usage: the choice's last count
        acc["usage_last"] = _clean(chunk["usage"], Case("", "", None))
    if chunks:
        if choice.get("token_ids"):
            acc.setdefault("chunk_sizes", []).append(len(choice["token_ids"]))


def _interval(sizes: list[int], interval: int) -> tuple[int, bool]:
    """``stream_interval`` as chunks show it: the first token alone, then at least ``interval``
    tokens a chunk until the last (vLLM merges outputs that queue: a chunk may hold more)."""
    return sizes[0], all(size >= interval for size in sizes[1:-1])


def _without_early_content(kinds: list[str]) -> list[str]:
    """A choice's kinds without its content chunks before the finish: vLLM merges outputs that
    queue, so a choice's whole text may come with its finish. Content after it stays (wrong)."""
    last = len(kinds) - 1 - kinds[::-1].index("finish") if "finish" in kinds else len(kinds)
    return [k for i, k in enumerate(kinds) if k != "content" or i > last]


def _runs(kinds: list[str]) -> str:
    """``role,content,content,finish`` -> ``role content finish``: how many content chunks the
    engine's steps make depends on timing in vLLM (outputs that queue are merged)."""
    parts: list[str] = []
    for kind in kinds:
        if not parts or parts[-1] != kind:
            parts.append(kind)
    return " ".join(parts)


def _skeleton(value: Any, key: str = "") -> Any:
    """The keys of a chunk, nested, with leaves replaced by their JSON type. A completions
    ``top_logprobs`` entry maps tokens to logprobs: its keys are data, not layout (with n > 1
    the first chunk may be another choice's on either side)."""
    if isinstance(value, dict):
        if key == "top_logprobs" and "logprob" not in value:
            return {"<token>": _skeleton(next(iter(value.values())))} if value else {}
        return {k: _skeleton(v, k) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [_skeleton(value[0], key)] if value else []
    return type(value).__name__


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float | int) and not isinstance(b, bool):
        return math.isclose(a, b, abs_tol=LOGPROB_TOLERANCE)
    if isinstance(a, int | float) and isinstance(b, float) and not isinstance(a, bool):
        return math.isclose(a, b, abs_tol=LOGPROB_TOLERANCE)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


_MISSING = "<absent>"


def differences(oracle: dict[str, Any], ours: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Paths whose values differ: path -> (vLLM's value, kvroute's)."""
    out = {}
    for key in sorted(oracle.keys() | ours.keys()):
        a, b = oracle.get(key, _MISSING), ours.get(key, _MISSING)
        if key == "stream.layout.content" and _MISSING in (a, b):
            continue  # one side's text all came with its finish chunk (see the docstring)
        if not _same(a, b):
            out[key] = (a, b)
    return out


def _folded(path: str) -> str:
    return re.sub(r"\[\d+\]", "[]", path)


def field_names(diff: dict[str, tuple[Any, Any]]) -> list[str]:
    """The differing paths with list indexes folded, each once."""
    return sorted({_folded(k) for k in diff})

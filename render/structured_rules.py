"""vLLM's structured-output decision rules, restated without xgrammar (which needs torch).

vLLM 0.32's frontend picks a backend per request (``SamplingParams._validate_structured_outputs``):
under "auto" it asks xgrammar first and falls back to guidance (llguidance) when xgrammar refuses,
or to outlines when the schema holds what llguidance cannot take either. This module holds the
pure rules that decision reads, as predicates over the request's own values:

- ``xgrammar_json_gaps``: the JSON-schema features vLLM declares unsupported by xgrammar
  (``has_xgrammar_unsupported_json_features``): such a schema never goes to xgrammar under auto.
- ``guidance_json_gaps``: ``patternProperties`` anywhere, which sends a schema past guidance.
- ``xgrammar_regex_gap``: the regex syntax xgrammar's converter refuses while llguidance's regex
  crate takes it (Unicode classes, inline flags, named groups, a dangling escape), so that
  "xgrammar refuses" is predicted where only xgrammar itself could tell.
- ``choice_as_grammar``: the EBNF vLLM's xgrammar path turns a ``choice`` into (byte-exact: it
  is what the engine receives), and ``grammar_is_likely_lark``: Lark or EBNF syntax.
"""

from __future__ import annotations

import re
from typing import Any

# The string formats xgrammar's JSON-schema converter implements (vLLM's list).
XGRAMMAR_STRING_FORMATS = frozenset({
    "email", "date", "time", "date-time", "duration", "ipv4", "ipv6", "hostname", "uuid",
    "uri", "uri-reference", "uri-template", "json-pointer", "relative-json-pointer",
})
_ARRAY_KEYS = ("uniqueItems", "contains", "minContains", "maxContains")


def _types(node: dict[str, Any]) -> set[str]:
    kind = node.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list):
        return {k for k in kind if isinstance(k, str)}
    return set()


def _shaped_and_bounded(node: dict[str, Any]) -> bool:
    """A pattern or format together with a length bound."""
    return ("pattern" in node or "format" in node) and (
        "minLength" in node or "maxLength" in node)


def _xgrammar_gap_here(node: dict[str, Any]) -> bool:
    """Whether this one schema object uses a feature vLLM keeps away from xgrammar."""
    kinds = _types(node)
    if kinds & {"integer", "number"} and "multipleOf" in node:
        return True
    if "array" in kinds and any(k in node for k in _ARRAY_KEYS):
        return True
    if "string" in kinds and (
        ("format" in node and node["format"] not in XGRAMMAR_STRING_FORMATS)
        or _shaped_and_bounded(node)
    ):
        return True
    if "object" in kinds and "propertyNames" in node:
        names = node["propertyNames"]
        if isinstance(names, dict) and _shaped_and_bounded(names):
            return True
        if "patternProperties" in node or "properties" in node:
            return True
        if node.get("unevaluatedProperties", True) is not True:
            return True
    patterns = node.get("patternProperties")
    if "object" in kinds and isinstance(patterns, dict) and (
        "properties" in node or len(patterns) > 1
    ):
        return True
    all_of = node.get("allOf")
    return isinstance(all_of, list) and len(all_of) >= 2


def _any_object(value: Any, test: Any) -> bool:
    """Whether ``test`` holds for ``value`` (a dict) or any dict nested in its dicts and lists,
    walked as vLLM walks a schema: every value of a dict, every dict item of a list."""
    stack = [value]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        if test(node):
            return True
        for child in node.values():
            if isinstance(child, dict):
                stack.append(child)
            elif isinstance(child, list):
                stack.extend(item for item in child if isinstance(item, dict))
    return False


def xgrammar_json_gaps(schema: Any) -> bool:
    """vLLM's ``has_xgrammar_unsupported_json_features``."""
    return _any_object(schema, _xgrammar_gap_here)


def guidance_json_gaps(schema: Any) -> bool:
    """vLLM's ``has_guidance_unsupported_json_features``: ``patternProperties`` anywhere."""
    return _any_object(schema, lambda node: "patternProperties" in node)


# Regex syntax llguidance accepts and xgrammar's regex converter refuses: Unicode property
# classes (\p{..}, \P{..}), inline flag groups ((?i), (?i:...)), named groups ((?P<n>, (?<n>).
_XGRAMMAR_REGEX_GAPS = re.compile(r"\\[pP]|\(\?[a-zA-Z-]+[:)]|\(\?P?<[A-Za-z_]")


def xgrammar_regex_gap(pattern: str) -> bool:
    """Whether xgrammar's regex converter refuses ``pattern`` where llguidance's takes it."""
    if _XGRAMMAR_REGEX_GAPS.search(_drop_escaped_backslashes(pattern)):
        return True
    # A trailing lone backslash: llguidance reads it as a literal, xgrammar as an error.
    tail = len(pattern) - len(pattern.rstrip("\\"))
    return tail % 2 == 1


def _drop_escaped_backslashes(pattern: str) -> str:
    """``pattern`` with each ``\\\\`` pair blanked, so ``\\\\p`` is not read as ``\\p``."""
    return pattern.replace("\\\\", "__")


_COMMENT = re.compile(r"(#|//).*$")


def grammar_is_likely_lark(grammar: str) -> bool:
    """vLLM's test: a grammar is Lark unless a line (comments removed) holds ``::=``."""
    if not grammar:
        return False
    for line in grammar.split("\n"):
        if "::=" in _COMMENT.sub("", line):
            return False
    return True


_EBNF_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _ebnf_literal(text: str) -> str:
    out = []
    for ch in text:
        if ch in _EBNF_ESCAPES:
            out.append(_EBNF_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def choice_as_grammar(choice: list[str]) -> str:
    """The EBNF grammar vLLM's xgrammar path sends for a ``choice``: ``root ::= "a" | "b"``."""
    return "root ::= " + " | ".join(_ebnf_literal(c) for c in choice)

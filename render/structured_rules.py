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

import math
import re
from collections.abc import Callable
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
# classes (\p{..}, \P{..}), inline flag groups ((?i), (?i:...)), Python's named groups (?P<n>.
_XGRAMMAR_REGEX_GAPS = re.compile(r"\\[pP]|\(\?[a-zA-Z-]+[:)]|\(\?P<")


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


_EMPTY_ALTERNATIVE = re.compile(r"\|\s*(\||\)|\Z|[A-Za-z_][\w-]*\s*::=)")


def ebnf_empty_alternative(grammar: str) -> bool:
    """An EBNF rule with an empty alternative (``a | `` or ``a | | b``), which xgrammar's
    parser refuses and llguidance's converter reads as the empty string. Quoted text aside."""
    unquoted = re.sub(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]', '""', grammar)
    text = "\n".join(_COMMENT.sub("", line) for line in unquoted.split("\n"))
    return _EMPTY_ALTERNATIVE.search(text) is not None


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


# -- what xgrammar's JSON-schema converter refuses --------------------------------------------
# xgrammar (vLLM calls it in strict mode: unlisted items and properties are not allowed) converts
# the sub-schemas a schema's type reaches (an object's properties, an array's items, every
# anyOf/oneOf/allOf branch, what a $ref points at) and refuses, in each, bounds that leave
# nothing to generate, an empty enum, an unknown type, a $ref to nowhere and a pattern its regex
# converter cannot read (a const or enum is converted as its values alone). llguidance
# (compiling leniently) stands in for the rest of its parse; the llguidance errors below have no
# xgrammar counterpart (it checks no satisfiability beyond those bounds, follows self-references
# with sibling keys, reads only string patterns, and resolves only the $refs it reaches), so
# they are left to the walk.

_JSON_TYPES = frozenset({"string", "integer", "number", "boolean", "object", "array", "null"})
_LENIENT_ONLY = ("Unsatisfiable schema", "circular references", "regex parse error",
                 "does not exist", "Failed to generate regex for integer range")


def xgrammar_shares_llguidance_error(message: str) -> bool:
    """Whether xgrammar refuses a schema llguidance (lenient) refused with ``message``."""
    return not any(marker in message for marker in _LENIENT_ONLY)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _empty_range(node: dict[str, Any], integer: bool) -> bool:
    low, high = _number(node.get("minimum")), _number(node.get("maximum"))
    xlow, xhigh = _number(node.get("exclusiveMinimum")), _number(node.get("exclusiveMaximum"))
    if integer:
        lows = [math.ceil(low) if low is not None else None,
                math.floor(xlow) + 1 if xlow is not None else None]
        highs = [math.floor(high) if high is not None else None,
                 math.ceil(xhigh) - 1 if xhigh is not None else None]
        lo = max((v for v in lows if v is not None), default=None)
        hi = min((v for v in highs if v is not None), default=None)
        return lo is not None and hi is not None and lo > hi
    if low is not None and high is not None and low > high:
        return True
    return any(a is not None and b is not None and a >= b
               for a, b in ((xlow, high), (low, xhigh), (xlow, xhigh)))


def _bigger(node: dict[str, Any], low: str, high: str) -> bool:
    a, b = _number(node.get(low)), _number(node.get(high))
    return a is not None and b is not None and a > b


def _kinds(node: dict[str, Any]) -> set[str]:
    """The types xgrammar converts ``node`` as: its ``type``, else read from its keywords."""
    kinds = _types(node)
    if "type" not in node:
        if "properties" in node or "additionalProperties" in node:
            kinds.add("object")
        if "items" in node or "prefixItems" in node:
            kinds.add("array")
    return kinds


def _refused_here(node: dict[str, Any], kinds: set[str], regex_ok: Callable[[str], bool]) -> bool:
    if isinstance(node.get("type"), str | list) and not _types(node) <= _JSON_TYPES:
        return True
    if node.get("enum") == []:
        return True
    multiple = _number(node.get("multipleOf"))
    if multiple is not None and multiple <= 0:
        return True
    if kinds & {"integer", "number"} and _empty_range(node, "number" not in kinds):
        return True
    if "string" in kinds:
        pattern = node.get("pattern")
        if _bigger(node, "minLength", "maxLength") or (
                isinstance(pattern, str) and not regex_ok(pattern)):
            return True
    if "array" in kinds:
        prefix = node.get("prefixItems")
        room = len(prefix) if isinstance(prefix, list) else 0
        min_items = _number(node.get("minItems"))
        if _bigger(node, "minItems", "maxItems") or (
                node.get("items", False) is False and min_items is not None
                and min_items > room):
            return True
    if "object" in kinds:
        props = node.get("properties")
        room = len(props) if isinstance(props, dict) else 0
        min_props = _number(node.get("minProperties"))
        if _bigger(node, "minProperties", "maxProperties") or (
                node.get("additionalProperties", False) is False and min_props is not None
                and min_props > room and "patternProperties" not in node):
            return True
    return False


def _reached(node: dict[str, Any], kinds: set[str]) -> list[Any]:
    """The sub-schemas xgrammar converts along with ``node``."""
    out: list[Any] = []
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(node.get(key), list):
            out += node[key]
    if "object" in kinds:
        for key in ("properties", "patternProperties"):
            if isinstance(node.get(key), dict):
                out += node[key].values()
        out.append(node.get("additionalProperties"))
    if "array" in kinds:
        if isinstance(node.get("prefixItems"), list):
            out += node["prefixItems"]
        out.append(node.get("items"))
    return [s for s in out if isinstance(s, dict)]


def _pointer(root: Any, ref: str) -> Any:
    """The sub-schema a local ``$ref`` names, or None if it names nothing."""
    if not ref.startswith("#"):
        return None
    node = root
    for part in (p for p in ref[1:].split("/") if p):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def xgrammar_json_refusal(schema: Any, regex_ok: Callable[[str], bool]) -> bool:
    """Whether xgrammar's converter refuses ``schema`` on a check of its own (module notes
    above); ``regex_ok(pattern)``: whether its regex converter reads a string pattern."""
    if not isinstance(schema, dict):
        return False
    stack: list[dict[str, Any]] = [schema]
    seen: set[int] = set()
    while stack and len(seen) < 10_000:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        ref = node.get("$ref")
        if isinstance(ref, str):
            target = _pointer(schema, ref)
            if not isinstance(target, dict | bool):
                return True
            if isinstance(target, dict):
                stack.append(target)
        if "const" in node or node.get("enum"):
            continue  # converted as its values: the rest of the node is not read
        kinds = _kinds(node)
        if _refused_here(node, kinds, regex_ok):
            return True
        stack.extend(_reached(node, kinds))
    return False


def ref_loop(schema: Any) -> bool:
    """Whether some schema object holds a ``$ref`` whose chain of ``$ref``s comes back to it.
    xgrammar converts a schema with a ``$ref`` as the ``$ref``'s target alone, so such a chain
    matches no value: the grammar an engine builds for it admits no token, and vLLM's engine
    fails the request (llguidance refuses it: circular references with sibling keys)."""
    stack = [schema] if isinstance(schema, dict) else []
    seen: set[int] = set()
    while stack and len(seen) < 10_000:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        chain: set[int] = set()
        here: Any = node
        while isinstance(here, dict) and isinstance(here.get("$ref"), str):
            if id(here) in chain:
                return True
            chain.add(id(here))
            here = _pointer(schema, here["$ref"])
        for value in node.values():
            if isinstance(value, dict):
                stack.append(value)
            elif isinstance(value, list):
                stack.extend(v for v in value if isinstance(v, dict))
    return False

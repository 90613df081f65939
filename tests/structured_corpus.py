"""Structured-output requests for the referee test: hand-picked cases plus seeded odd schemas.

Each case is the extra body of a chat request (``response_format``, ``structured_outputs``,
``bad_words``, ``tool_choice``/``tools``); tests/test_render_structured.py sends every one
through render and through vLLM 0.32's own frontend code and compares what each would send.
"""

from __future__ import annotations

import json
import random
from typing import Any

REGEXES = [
    "[a-z]+", "(a|b)*c", r"\d{3}-\d{4}", "", "^abc$", "a*?", "[[:alpha:]]", r"\w+@\w+\.com", ".",
    "a{100}", "(a+)+b", r"\x41", r"[^\n]*", "(?:ab)+", "a|", r"\A", "yes|no", r"\s*", "[0-9]{1,3}",
    # refused by both
    "(?=a)b", r"(a)\1", "[z-a]", "(abc", r"\bfoo\b", "a{2,1}", "*a", "a{,3}",
    # xgrammar refuses, llguidance takes: vLLM falls back to guidance
    r"\p{L}+", "(?i)abc", "(?P<x>a)", "(?<y>b)c", "\\", r"\P{Lu}",
    # llguidance refuses, xgrammar takes
    r"\Z",
]
GRAMMARS = [
    'root ::= "a"', "root ::= foo", "root ::= [a-z]+", 'root ::= "" ', 'root ::= ("a" ',
    'start ::= "a"', 'root ::= "yes" | "no"', 'root ::= item+\nitem ::= [0-9] ","',
    'start: "a"', "start: /[a-z]+/", "start: foo", 'start: "a" | "b"', 'start: A\nA: "x"',
    "garbage ::: ", 'start: %json {"type":"object"}', 'start: <[TOOL_CALLS]> "a"',
    'root ::= "a" | ', "# comment\nstart: \"x\"",
]
CHOICES: list[list[str]] = [
    ["a", "b"], ["yes", "no", "maybe"], [""], ['say "hi"', "back\\slash", "new\nline", "\x01"],
    ["ünï", "日本"], [],
]
SCHEMAS: list[Any] = [
    {"type": "object"}, {"type": "foo"}, {"type": "string", "format": "email"},
    {"type": "string", "pattern": "[a-z"}, {"$ref": "#/defs/x"},
    {"type": "integer", "minimum": 5, "maximum": 1}, {"type": "array", "minItems": 3,
                                                       "maxItems": 1},
    {"enum": []}, {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]},
    {"anyOf": []}, {"type": "number", "minimum": 1.5}, {"const": {"a": 1}},
    {"not": {"type": "string"}}, {"if": {"type": "string"}, "then": {"minLength": 1}},
    {"type": ["string", "null"]}, {"type": "string", "pattern": "(?=a)"},
    {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    {"type": "object", "properties": {"a": {"$ref": "#"}}},
    {"oneOf": [{"type": "string"}, {"type": "integer"}]},
    {"type": "object", "minProperties": 2, "maxProperties": 1},
    {"foo": "bar"}, {"type": "object", "properties": {"a": 1}},
    {"dependentRequired": {"a": ["b"]}}, {},
    {"type": "integer", "multipleOf": 3}, {"type": "array", "uniqueItems": True},
    {"type": "string", "format": "color"}, {"type": "string", "pattern": "a+", "maxLength": 4},
    {"type": "object", "patternProperties": {"^a": {"type": "string"}}},
    {"type": "object", "patternProperties": {"^a": {}, "^b": {}}},
    {"type": "object", "properties": {"x": {}}, "patternProperties": {"^a": {}}},
    {"allOf": [{"type": "string"}, {"enum": ["yes", "no"]}]},
    {"type": "object", "propertyNames": {"pattern": "^a"}, "properties": {"a": {}}},
    {"type": "object", "properties": {"name": {"type": "string", "enum": ["x", "y"]}},
     "required": ["name"], "additionalProperties": False},
    '{"type": "object"}', "not json", "[1, 2]", "5", '{"type": "foo"}',
]


def tag(fmt: Any) -> dict[str, Any]:
    return {"type": "structural_tag", "format": fmt}


LEGACY_TAG = {"type": "structural_tag", "triggers": ["<f"],
              "structures": [{"begin": "<f>", "schema": {"type": "object"}, "end": "</f>"}]}
TAGS: list[Any] = [
    LEGACY_TAG,
    {**LEGACY_TAG, "triggers": ["<g"]},
    {**LEGACY_TAG, "triggers": []},
    {**LEGACY_TAG, "structures": []},
    {**LEGACY_TAG, "structures": [{"begin": "<f>", "schema": {"type": "foo"}, "end": "</f>"}]},
    tag({"type": "const_string", "value": "hi"}), tag({"type": "nope"}),
    tag({"type": "regex", "pattern": "(a"}), tag({"type": "regex", "pattern": "a+"}),
    tag({"type": "triggered_tags", "triggers": ["<f"], "tags": [
        {"type": "tag", "begin": "<f>", "content": {"type": "json_schema",
                                                    "json_schema": {"type": "object"}},
         "end": "</f>"}]}),
    tag({"type": "triggered_tags", "triggers": ["<g"], "tags": [
        {"type": "tag", "begin": "<f>", "content": {"type": "any_text"}, "end": "</f>"}]}),
    tag({"type": "token", "token": "<|im_end|>"}),
    tag({"type": "grammar", "grammar": "root ::= foo"}),
    tag({"type": "sequence", "elements": []}), tag({"type": "any_text"}),
    tag({"type": "sequence", "elements": [{"type": "const_string", "value": "a"},
                                          {"type": "json_schema", "json_schema": True}]}),
]


def _odd_schema(rng: random.Random, depth: int = 0) -> Any:
    """A random schema built from the keywords the backends disagree on most."""
    kinds = ["string", "integer", "number", "boolean", "object", "array", "null"]
    node: dict[str, Any] = {}
    if rng.random() < 0.8:
        node["type"] = rng.choice(kinds) if rng.random() < 0.8 else rng.sample(kinds, 2)
    extras: list[tuple[str, Any]] = [
        ("minimum", rng.randint(-3, 3)), ("maximum", rng.randint(-3, 3)),
        ("multipleOf", rng.choice([2, 0.5])), ("minLength", rng.randint(0, 4)),
        ("maxLength", rng.randint(0, 4)), ("pattern", rng.choice(["^[a-z]+$", "a|b", "(?i)x",
                                                                  r"\p{L}", "("])),
        ("format", rng.choice(["date", "email", "uuid", "color", "byte"])),
        ("enum", rng.choice([["a", "b"], [1, "x"], []])), ("const", rng.choice(["k", 3])),
        ("minItems", rng.randint(0, 3)), ("maxItems", rng.randint(0, 3)),
        ("uniqueItems", True), ("contains", {"type": "integer"}),
        ("additionalProperties", rng.choice([False, True, {"type": "string"}])),
        ("required", ["a"]), ("not", {"type": "null"}), ("minProperties", 1),
        ("propertyNames", {"pattern": "^[a-z]+$"}),
        ("patternProperties", {"^x": {"type": "integer"}}),
        ("$ref", rng.choice(["#", "#/nowhere"])), ("description", "d"),
    ]
    for key, value in rng.sample(extras, rng.randint(0, 3)):
        node[key] = value
    if depth < 2 and rng.random() < 0.5:
        node["properties"] = {f"p{i}": _odd_schema(rng, depth + 1)
                              for i in range(rng.randint(1, 2))}
    if depth < 2 and rng.random() < 0.3:
        node["items"] = _odd_schema(rng, depth + 1)
    if depth < 2 and rng.random() < 0.2:
        key = rng.choice(["anyOf", "oneOf", "allOf"])
        node[key] = [_odd_schema(rng, depth + 1) for _ in range(rng.randint(1, 2))]
    return node


def cases(odd: int = 200, seed: int = 15) -> list[dict[str, Any]]:
    """The request extras, hand-picked first, then ``odd`` seeded random schemas."""
    out: list[dict[str, Any]] = [
        {"response_format": {"type": "json_object"}},
        {"response_format": {"type": "text"}},
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
        {"response_format": {"type": "json_schema",
                             "json_schema": {"name": "x", "schema": {"type": "integer"}}}},
        {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
        {"response_format": {"type": "json_object"},
         "structured_outputs": {"json": {"type": "string"}}},
        {"structured_outputs": {"regex": "a", "grammar": 'start: "a"'}},
        {"structured_outputs": {"regex": "a", "choice": ["a"]}},
        {"structured_outputs": {"disable_any_whitespace": True}},
        {"structured_outputs": {"json_object": True}},
        {"structured_outputs": {"json_object": False}},
        {"structured_outputs": {"json": "  "}},
        {"structured_outputs": {"grammar": " "}},
        {"structured_outputs": {"structural_tag": " "}},
        {"structured_outputs": {"regex": "a\x00b"}},
        {"structured_outputs": {"json": {"type": "object"}, "_backend": "guidance"}},
        {"structured_outputs": {"choice": ["a"]}, "tool_choice": {
            "type": "function", "function": {"name": "f"}},
         "tools": [{"type": "function", "function": {"name": "f"}}]},
        {"bad_words": ["hello", " world", "Hello there", "  spaced", "ünï"]},
        {"bad_words": ["x"] * 3 + [f"w{i}" for i in range(70)]},
    ]
    out += [{"structured_outputs": {"regex": r}} for r in REGEXES]
    out += [{"structured_outputs": {"grammar": g}} for g in GRAMMARS]
    out += [{"structured_outputs": {"choice": c}} for c in CHOICES]
    out += [{"structured_outputs": {"json": s}} for s in SCHEMAS]
    out += [{"response_format": {"type": "json_schema", "json_schema": {"name": "s",
                                                                        "schema": s}}}
            for s in SCHEMAS if isinstance(s, dict)]
    out += [{"response_format": t} for t in TAGS]
    out += [{"structured_outputs": {"structural_tag": json.dumps(t)}} for t in TAGS]
    rng = random.Random(seed)
    out += [{"structured_outputs": {"json": _odd_schema(rng)}} for _ in range(odd)]
    return out

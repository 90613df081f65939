"""Structural tags: whether xgrammar would take one, told from its documented shapes.

vLLM checks every structural tag (from ``response_format`` or ``structured_outputs``) by
compiling it with xgrammar, whatever the configured backend. Two shapes exist: the legacy
``{"structures": [{"begin", "schema", "end"}], "triggers": [...]}`` and xgrammar's format tree
``{"type": "structural_tag", "format": {...}}``. ``check_structural_tag`` walks either, checks
each node's fields as xgrammar's models declare them and each begin against its triggers, and
compiles the schemas, regexes and grammars inside through ``compiles`` (render/structured.py's
xgrammar prediction). Token-based formats name tokenizer tokens, which vLLM's check (run without
a tokenizer) refuses: so are they here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

Compiles = Callable[[str, str], bool]

_TOKEN_FORMATS = frozenset({"token", "exclude_token", "any_tokens", "token_triggered_tags",
                            "token_dispatch"})


class _Invalid(Exception):
    pass


def check_structural_tag(text: str, compiles: Compiles) -> str | None:
    """None if xgrammar is predicted to take the structural tag ``text``, else why not."""
    try:
        tag = json.loads(text)
        if not isinstance(tag, dict):
            raise _Invalid("not a JSON object")
        if "structures" in tag:
            _legacy(tag, compiles)
        else:
            _format(tag.get("format"), compiles)
    except (_Invalid, ValueError, RecursionError) as exc:
        return str(exc) or type(exc).__name__
    return None


def _legacy(tag: dict[str, Any], compiles: Compiles) -> None:
    structures, triggers = tag.get("structures"), tag.get("triggers")
    if not isinstance(structures, list) or not structures:
        raise _Invalid("structures must be a non-empty list")
    triggers = _strings(triggers, "triggers", allow_empty=False)
    for s in structures:
        if not isinstance(s, dict):
            raise _Invalid("each structure is an object")
        _string(s.get("end"), "end")
        _begins_with_trigger(_string(s.get("begin"), "begin"), triggers)
        _schema(s.get("schema"), compiles)


def _format(node: Any, compiles: Compiles) -> None:
    if not isinstance(node, dict):
        raise _Invalid("a format is an object")
    kind = node.get("type")
    if kind in _TOKEN_FORMATS:
        raise _Invalid(f"{kind} needs the model's tokenizer")
    if kind == "const_string":
        _string(node.get("value"), "value")
    elif kind in ("json_schema", "qwen_xml_parameter"):
        _schema(node.get("json_schema"), compiles)
    elif kind == "any_text":
        _strings(node.get("excludes", []), "excludes", allow_empty=True)
    elif kind in ("regex", "grammar"):
        spec = _string(node.get("pattern" if kind == "regex" else "grammar"), kind)
        if not compiles(kind, spec):
            raise _Invalid(f"the {kind} does not compile")
    elif kind in ("sequence", "or"):
        elements = node.get("elements")
        if not isinstance(elements, list) or not elements:
            raise _Invalid(f"{kind} needs a non-empty elements list")
        for element in elements:
            _format(element, compiles)
    elif kind == "tag":
        _tag(node, compiles)
    elif kind == "triggered_tags":
        triggers = _strings(node.get("triggers"), "triggers", allow_empty=False)
        for tag in _tags(node, compiles):
            _begins_with_trigger(tag["begin"], triggers)
    elif kind == "tags_with_separator":
        _string(node.get("separator"), "separator")
        _tags(node, compiles)
    elif kind in ("optional", "plus", "star"):
        _format(node.get("content"), compiles)
    elif kind == "repeat":
        low, high = node.get("min"), node.get("max")
        if not (isinstance(low, int) and _is_int(low) and _is_int(high)) or low < 0:
            raise _Invalid("repeat needs integer min and max")
        _format(node.get("content"), compiles)
    elif kind == "dispatch":
        rules = node.get("rules")
        if not isinstance(rules, list) or not rules:
            raise _Invalid("dispatch needs a non-empty rules list")
        for rule in rules:
            if not isinstance(rule, list) or len(rule) != 2:
                raise _Invalid("a dispatch rule is a [trigger, format] pair")
            _string(rule[0], "trigger")
            _format(rule[1], compiles)
    else:
        raise _Invalid(f"unknown format type {kind!r}")


def _tags(node: dict[str, Any], compiles: Compiles) -> list[dict[str, Any]]:
    tags = node.get("tags")
    if not isinstance(tags, list) or not tags:
        raise _Invalid("tags must be a non-empty list")
    for tag in tags:
        _tag(tag, compiles)
    return tags


def _tag(tag: Any, compiles: Compiles) -> None:
    if not isinstance(tag, dict) or tag.get("type", "tag") != "tag":
        raise _Invalid("a tag is an object of type 'tag'")
    _string(tag.get("begin"), "begin")
    end = tag.get("end")
    if not isinstance(end, str):
        _strings(end, "end", allow_empty=False)
    _format(tag.get("content"), compiles)


def _schema(schema: Any, compiles: Compiles) -> None:
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise _Invalid("a schema is an object or a boolean")
    if not compiles("json", json.dumps(schema)):
        raise _Invalid("the schema does not compile")


def _begins_with_trigger(begin: str, triggers: list[str]) -> None:
    if not any(begin.startswith(t) for t in triggers):
        raise _Invalid(f"begin {begin!r} starts with none of the triggers {triggers!r}")


def _string(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise _Invalid(f"{name} must be a string")
    return value


def _strings(value: Any, name: str, *, allow_empty: bool) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _Invalid(f"{name} must be a list of strings")
    if not value and not allow_empty:
        raise _Invalid(f"{name} must not be empty")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)

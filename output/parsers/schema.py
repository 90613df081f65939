"""Parameter values written as text (XML-style calls) typed by the tool's JSON schema.

As vLLM's ``coerce_to_schema_type``: a property's types come from its ``type`` (a name or a
list), its ``enum`` values and its ``anyOf``/``oneOf``/``allOf`` branches (none found: string);
the text becomes the first of null, integer, number, boolean, object, array, string it parses as
(so "03106" stays a string when the schema says string, and ``["integer", "null"]`` takes both
"7" and "null"); text no type takes is parsed as JSON if it is JSON, else kept as a string.
Non-finite numbers never come out (they are not JSON).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

_ALIASES = {
    "str": "string", "text": "string", "varchar": "string", "char": "string", "enum": "string",
    "int": "integer", "int32": "integer", "int64": "integer", "uint": "integer",
    "uint32": "integer", "uint64": "integer", "long": "integer", "short": "integer",
    "unsigned": "integer", "float": "number", "float32": "number", "float64": "number",
    "double": "number", "bool": "boolean", "dict": "object", "arr": "array", "list": "array",
    "sequence": "array",
}
_ORDER = ("null", "integer", "number", "boolean", "object", "array", "string")
_MISSING = object()


def properties(tools: Sequence[dict[str, Any]] | None, name: str) -> dict[str, Any]:
    """The named function's parameter properties ({} when unknown)."""
    for tool in tools or ():
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and fn.get("name") == name:
            params = fn.get("parameters") or {}
            props = params.get("properties", {}) if isinstance(params, dict) else {}
            return props if isinstance(props, dict) else {}
    return {}


def types_of(schema: Any) -> set[str]:
    if not isinstance(schema, dict):
        return {"string"}
    found: set[str] = set()
    kind = schema.get("type")
    if isinstance(kind, str):
        found.add(kind)
    elif isinstance(kind, list):
        found.update(k for k in kind if isinstance(k, str))
    enum = schema.get("enum")
    if isinstance(enum, list):
        for v in enum:
            found.add("null" if v is None else "boolean" if isinstance(v, bool) else
                      "integer" if isinstance(v, int) else "number" if isinstance(v, float)
                      else "string" if isinstance(v, str) else "array" if isinstance(v, list)
                      else "object" if isinstance(v, dict) else "string")
    for key in ("anyOf", "oneOf", "allOf"):
        branches = schema.get(key)
        if isinstance(branches, list):
            for b in branches:
                found |= types_of(b)
    return found or {"string"}


def is_text(schema: Any) -> bool:
    """Whether the value stays the text as written (so it may stream before it ends)."""
    return {_ALIASES.get(t.strip().lower(), t.strip().lower()) for t in types_of(schema)} == {
        "string"}


def _finite(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (ValueError, TypeError):
        return False
    return True


def coerce(text: str, schema: Any) -> Any:
    """``text`` as the JSON value the schema says it is."""
    kinds = {_ALIASES.get(t.strip().lower(), t.strip().lower()) for t in types_of(schema)}
    for kind in _ORDER:
        if kind not in kinds:
            continue
        value = _as(kind, text)
        if value is not _MISSING:
            return value
    try:
        parsed = json.loads(text)
    except ValueError:
        return text
    return parsed if _finite(parsed) else text


def _as(kind: str, text: str) -> Any:
    if kind == "string":
        return text
    if kind == "null":
        return None if text.lower() == "null" else _MISSING
    if kind == "integer":
        try:
            return int(text)
        except ValueError:
            return _MISSING
    if kind == "number":
        try:
            number = float(text)
        except ValueError:
            return _MISSING
        if not math.isfinite(number):
            return _MISSING
        return number if number != int(number) else int(number)
    if kind == "boolean":
        low = text.lower().strip()
        return True if low in ("true", "1") else False if low in ("false", "0") else _MISSING
    try:
        parsed = json.loads(text)
    except ValueError:
        return _MISSING
    return parsed if _finite(parsed) else _MISSING


def dumps(value: Any) -> str:
    """A value as vLLM writes arguments: ``json.dumps(..., ensure_ascii=False)``."""
    return json.dumps(value, ensure_ascii=False)

"""What checking a structured-output request costs render (render/structured.py), per request.

    .venv/bin/python bench/structured_validation.py [--rounds 5] [--repeat 200]

For each constraint kind (a json_object, a small and a larger JSON schema, a regex, a choice, an
EBNF and a Lark grammar, a legacy structural tag) times ``StructuredOutputs.resolve`` with the
verdict cache off (every request compiles with llguidance: the cost of a schema seen for the
first time) and on (a schema seen before: the common case of an application sending the same
schema again and again), interleaved round by round so drift on a busy machine hits both alike.
Prints microseconds per request (median of the rounds) and the ratio uncached/cached.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from render.structured import StructuredOutputs  # noqa: E402
from wire.sampling import StructuredOutputsParams  # noqa: E402

_PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
        "address": {"type": "object", "properties": {
            "street": {"type": "string"}, "city": {"type": "string"},
            "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city"]},
        "role": {"enum": ["admin", "user", "guest"]},
    },
    "required": ["name", "age", "role"],
}
CASES: dict[str, StructuredOutputsParams] = {
    "json_object": StructuredOutputsParams(json_object=True),
    "json, 1 enum": StructuredOutputsParams(json={"type": "string", "enum": ["a", "b"]}),
    "json, 6 properties": StructuredOutputsParams(json=_PERSON),
    "json, 6 props as text": StructuredOutputsParams(json=json.dumps(_PERSON)),
    "regex": StructuredOutputsParams(regex=r"[A-Z][a-z]{2,9} [0-9]{1,4}(st|nd|rd|th)"),
    "choice (4)": StructuredOutputsParams(choice=["red", "green", "blue", "yellow"]),
    "grammar (EBNF)": StructuredOutputsParams(
        grammar='root ::= item ("," item)*\nitem ::= [a-z]+'),
    "grammar (Lark)": StructuredOutputsParams(grammar='start: item ("," item)*\nitem: /[a-z]+/'),
    "structural tag": StructuredOutputsParams(structural_tag=json.dumps({
        "type": "structural_tag", "triggers": ["<fn"],
        "structures": [{"begin": "<fn=get>", "schema": _PERSON, "end": "</fn>"}]})),
}


def _time(checker: StructuredOutputs, params: StructuredOutputsParams, repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        checker.resolve(params)
    return (time.perf_counter() - start) / repeat * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=200)
    args = ap.parse_args()
    cold, warm = StructuredOutputs(cache_entries=0), StructuredOutputs()
    print(f"{'constraint':<24}{'uncached us':>14}{'cached us':>12}{'ratio':>9}")
    for name, params in CASES.items():
        a: list[float] = []
        b: list[float] = []
        for _ in range(args.rounds):
            a.append(_time(cold, params, args.repeat))
            b.append(_time(warm, params, args.repeat))
        ua, ub = statistics.median(a), statistics.median(b)
        print(f"{name:<24}{ua:>14.1f}{ub:>12.1f}{ua / ub:>8.1f}x")


if __name__ == "__main__":
    main()

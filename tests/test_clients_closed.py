"""Every client a test (or a dev tool or bench harness the tests run) opens is closed by it: an
OpenAI SDK client or an httpx client is made in a ``with`` (or by tests/openai_clients.py's
fixture, which closes its own).

A client left to the garbage collector goes in a reference cycle, collected in whichever test
runs the next full collection; its socket may be finalized before the client's close and warn,
and under ``filterwarnings = error`` that fails an unrelated test (tests/openai_clients.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SCANNED = [TESTS, TESTS.parent / "devtools", TESTS.parent / "bench"]
CLIENTS = {"OpenAI", "AsyncOpenAI", "Client", "AsyncClient"}
# Where a client's close is the caller's, written out by hand.
OWNED = {"openai_clients.py": "the fixture closes what it made"}


def _opened_outside_with(source: str) -> list[int]:
    tree = ast.parse(source)
    in_with = {id(item.context_expr) for node in ast.walk(tree)
               if isinstance(node, ast.With | ast.AsyncWith) for item in node.items}
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or id(node) in in_with:
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else ""
        if name in {"OpenAI", "AsyncOpenAI"} or (owner == "httpx" and name in CLIENTS):
            lines.append(node.lineno)
    return lines


def test_the_check_sees_a_client_outside_a_with() -> None:
    assert _opened_outside_with("import openai\nc = openai.OpenAI(base_url='u')\n") == [2]
    assert _opened_outside_with("import httpx\nc = httpx.Client()\n") == [2]
    assert _opened_outside_with("import httpx\nwith httpx.Client() as c:\n    pass\n") == []
    assert _opened_outside_with("from openai import OpenAI\n"
                                "with OpenAI() as a, OpenAI() as b:\n    pass\n") == []


def test_no_test_leaves_a_client_to_the_garbage_collector() -> None:
    found = {p.name: lines for d in SCANNED for p in sorted(d.glob("*.py")) if p.name not in OWNED
             if (lines := _opened_outside_with(p.read_text()))}
    assert found == {}, f"clients made outside a `with` (file: lines): {found}"

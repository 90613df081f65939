"""The request path reads typed state: no handler takes its state as ``Any``, none reads
Starlette's untyped ``request.state``; the lifespans store one typed object per service.

mypy --strict checks a field read only when the object it is read from has a type: a parameter
``st: Any`` or an attribute of ``request.state`` (Starlette's ``State.__getattr__`` returns Any)
turns every check below it off, silently. These modules run on every request.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REQUEST_PATH = [
    "render/service/fast_route.py",
    "render/service/server.py",
    "render/service/state.py",
    "router/front/app.py",
    "output/collect.py",
    "router/front/fast_path.py",
    "router/front/handlers.py",
    "router/front/multi_prompt.py",
    "router/front/respond.py",
    "output/sse.py",
    "router/front/state.py",
]
STATE_NAMES = {"st", "state", "app_state", "live"}
# The one crossing from Starlette's untyped scope["state"] to the typed object, per service: it
# takes the raw mapping and checks the object's type (isinstance) before returning it typed.
ACCESSORS = {"router_state", "render_state"}


def _is_any(annotation: ast.expr | None) -> bool:
    if annotation is None:
        return True  # unannotated: Any to mypy
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        annotation = ast.parse(annotation.value, mode="eval").body
    return any((isinstance(n, ast.Name) and n.id == "Any")
               or (isinstance(n, ast.Attribute) and n.attr == "Any")
               for n in ast.walk(annotation))  # Any itself, or inside: dict[str, Any]


def untyped_state(source: str) -> list[str]:
    """Where ``source`` takes or reads state untyped: a state parameter annotated ``Any`` (or
    not at all), a read of ``<x>.state.<field>``, a state attribute annotated ``Any``, or a
    ``SimpleNamespace`` (the attribute bag the router's state used to be)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name not in ACCESSORS:
            args = node.args
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                if arg.arg in STATE_NAMES and _is_any(arg.annotation):
                    found.append(f"line {arg.lineno}: {node.name}({arg.arg}: Any)")
        elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)
              and isinstance(node.value, ast.Attribute) and node.value.attr == "state"):
            found.append(f"line {node.lineno}: reads .state.{node.attr}")
        elif (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Attribute | ast.Name)
              and (getattr(node.target, "attr", None) or getattr(node.target, "id", None))
              in STATE_NAMES and _is_any(node.annotation)):
            found.append(f"line {node.lineno}: state annotated Any")
        elif isinstance(node, ast.Name) and node.id == "SimpleNamespace":
            found.append(f"line {node.lineno}: SimpleNamespace")
    return found


@pytest.mark.parametrize("module", REQUEST_PATH)
def test_request_path_takes_no_untyped_state(module: str) -> None:
    assert untyped_state((ROOT / module).read_text()) == []


def test_the_check_catches_each_untyped_form() -> None:
    """Each form the old request path used is caught (so the test above can fail)."""
    cases = {
        "from typing import Any\nasync def open_chat(st: Any, body: bytes) -> None: ...": 1,
        "async def ready(request):\n    return request.state.lifecycle.draining": 1,
        "def f(state) -> None: ...": 1,
        "def _render(state: dict[str, Any], path: str) -> None: ...": 1,
        "class R:\n    def __init__(self, state: 'Any') -> None:\n        self.st = state": 1,
        "from types import SimpleNamespace\nx = SimpleNamespace(a=1)": 1,
        "def f(st: RouterState) -> int:\n    return st.render.limits.max_body_bytes": 0,
        "def f(app) -> None:\n    app.state.live = 1": 0,  # a store, by the lifespan
    }
    for source, count in cases.items():
        assert len(untyped_state(source)) == count, source

"""No package reaches into a private part of a library it serves with.

An AST scan of every top-level package (render/, router/, radix/ and any other directory with an
``__init__.py``, tests/ excepted) for, where the library is one of ``LIBRARIES``:
- ``from lib[.mod] import _name`` and imports of a private module (``lib._mod``);
- ``X._name`` where ``X`` is a name bound by an import from the library, or a variable annotated
  with a type imported from it (``def f(h: Histogram): h._sum``);
- ``getattr/setattr/hasattr/delattr(X, "_name")`` and ``vars(X)["_name"]`` / ``vars(X).get(...)``
  on such an ``X``;
- in a class deriving from a library class: ``super()._name``, and ``self._name`` that the class
  never assigns or defines itself (the base's private state).
Dunder names (``__module__``) are public. A release may change any private name silently, so
kvroute uses these libraries through their public API and configuration only.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LIBRARIES = frozenset({"hypercorn", "h11", "h11_mypyc", "starlette", "asyncio", "prometheus_client",
                       "uvicorn", "granian"})
NOT_PACKAGES = frozenset({"tests"})


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__")) \
        and name != "_"


def _from_library(module: str | None) -> bool:
    return module is not None and module.split(".")[0] in LIBRARIES


def packages(root: Path) -> list[Path]:
    return sorted(d for d in root.iterdir()
                  if d.is_dir() and (d / "__init__.py").exists() and d.name not in NOT_PACKAGES)


class _Scan(ast.NodeVisitor):
    def __init__(self, where: str) -> None:
        self.where = where
        self.found: list[str] = []
        self.library_names: set[str] = set()  # names bound to library modules or objects
        self.library_types: set[str] = set()  # of those, the ones used as annotations' types
        self.typed: list[set[str]] = [set()]  # per function scope: variables of library types
        # Per class: (derives from a library class, its own attributes, its attributes holding
        # library objects: ``self.metric = metric`` with ``metric: Histogram``).
        self.classes: list[tuple[bool, set[str], set[str]]] = []

    def report(self, node: ast.AST, what: str) -> None:
        self.found.append(f"{self.where}:{getattr(node, 'lineno', 0)}: {what}")

    # -- what comes from a library ---------------------------------------------------------------

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if _from_library(alias.name):
                if any(_private(part) for part in alias.name.split(".")):
                    self.report(node, f"import {alias.name}")
                self.library_names.add(alias.asname or alias.name.split(".")[0])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or not _from_library(node.module):
            return
        assert node.module is not None
        if any(_private(part) for part in node.module.split(".")):
            self.report(node, f"from {node.module} import ...")
        for alias in node.names:
            if _private(alias.name):
                self.report(node, f"from {node.module} import {alias.name}")
            self.library_names.add(alias.asname or alias.name)
            self.library_types.add(alias.asname or alias.name)

    def _is_library(self, node: ast.expr) -> bool:
        """A name (or attribute chain on one) bound to a library, a variable of its types, or an
        attribute of ``self`` that holds one."""
        while isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "self" and self.classes \
                    and node.attr in self.classes[-1][2]:
                return True
            node = node.value
        return isinstance(node, ast.Name) and (
            node.id in self.library_names or any(node.id in scope for scope in self.typed))

    def _holds_library(self, targets: list[ast.expr], value: ast.expr | None) -> None:
        if value is None or not self._is_library(value):
            return
        for t in targets:
            if isinstance(t, ast.Name):
                self.typed[-1].add(t.id)
            elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) \
                    and t.value.id == "self" and self.classes:
                self.classes[-1][2].add(t.attr)

    def _library_annotation(self, ann: ast.expr | None) -> bool:
        if ann is None:
            return False
        return any(isinstance(n, ast.Name) and n.id in self.library_types
                   or isinstance(n, ast.Attribute) and self._is_library(n)
                   for n in ast.walk(ann))

    # -- scopes ----------------------------------------------------------------------------------

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        args = node.args
        scope = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs,
                                 *(x for x in (args.vararg, args.kwarg) if x))
                 if self._library_annotation(a.annotation)}
        self.typed.append(scope)
        self.generic_visit(node)
        self.typed.pop()

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if isinstance(node.target, ast.Name) and self._library_annotation(node.annotation):
            self.typed[-1].add(node.target.id)
        self._holds_library([node.target], node.value)
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        self._holds_library(node.targets, node.value)
        self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        derived = any(self._is_library(b) for b in node.bases)
        own = {n.name for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
        for n in ast.walk(node):
            targets = n.targets if isinstance(n, ast.Assign) else \
                [n.target] if isinstance(n, ast.AnnAssign | ast.AugAssign) else []
            for t in targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) \
                        and t.value.id == "self":
                    own.add(t.attr)
                elif isinstance(t, ast.Name):
                    own.add(t.id)
        for n in node.body:  # __slots__ names are the class's own too
            if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__"
                                                 for t in n.targets):
                own.update(c.value for c in ast.walk(n.value)
                           if isinstance(c, ast.Constant) and isinstance(c.value, str))
        self.classes.append((derived, own, set()))
        self.generic_visit(node)
        self.classes.pop()

    # -- the accesses ----------------------------------------------------------------------------

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if _private(node.attr):
            value = node.value
            if self._is_library(value):
                self.report(node, f"{ast.unparse(node)}")
            elif self.classes and self.classes[-1][0]:
                derived_own = self.classes[-1][1]
                is_super = isinstance(value, ast.Call) and isinstance(value.func, ast.Name) \
                    and value.func.id == "super"
                is_self = isinstance(value, ast.Name) and value.id == "self"
                if is_super or (is_self and node.attr not in derived_own):
                    self.report(node, f"{ast.unparse(node)} (a library base's private part)")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("getattr", "setattr", "hasattr", "delattr") \
                and len(node.args) >= 2 and self._is_library(node.args[0]) \
                and isinstance(node.args[1], ast.Constant) \
                and isinstance(node.args[1].value, str) and _private(node.args[1].value):
            self.report(node, ast.unparse(node))
        # vars(lib).get("_name")
        if isinstance(func, ast.Attribute) and self._vars_of_library(func.value) and node.args \
                and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and _private(node.args[0].value):
            self.report(node, ast.unparse(node))
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        # vars(lib)["_name"]
        key = node.slice
        if self._vars_of_library(node.value) and isinstance(key, ast.Constant) \
                and isinstance(key.value, str) and _private(key.value):
            self.report(node, ast.unparse(node))
        self.generic_visit(node)

    def _vars_of_library(self, node: ast.expr) -> bool:
        return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
            and node.func.id == "vars" and len(node.args) == 1 and self._is_library(node.args[0])


def scan_source(source: str, where: str = "<source>") -> list[str]:
    scan = _Scan(where)
    scan.visit(ast.parse(source, where))
    return scan.found


def violations(root: Path) -> list[str]:
    """Every private library access in ``root``'s packages, as ``path:line: expression``."""
    found: list[str] = []
    for package in packages(root):
        for path in sorted(package.rglob("*.py")):
            found += scan_source(path.read_text(), str(path.relative_to(root)))
    return found


def test_the_packages_use_no_private_part_of_a_library() -> None:
    assert {p.name for p in packages(ROOT)} >= {"render", "router", "radix"}
    assert violations(ROOT) == []


@pytest.mark.parametrize("source", [
    "from prometheus_client import Histogram\ndef f(h: Histogram) -> None:\n    h._sum.inc(1)\n",
    "from prometheus_client import Histogram\nx: Histogram = make()\nx._buckets\n",
    "import hypercorn.protocol.h11 as p\nvars(p)['h11'] = 1\nvars(p)['_x'] = 1\n",
    "import hypercorn.asyncio.task_group as m\nh = vars(m).get('_handle')\n",
    "import asyncio\nasyncio.events._get_running_loop()\n",
    "import asyncio\nq = asyncio.Queue()\ngetattr(asyncio, '_x')\n",
    "from starlette.routing import _wrap\n",
    "from prometheus_client import Histogram\nfrom typing import Any\n"
    "class T:\n    def __init__(self, metric: Histogram) -> None:\n        self.metric = metric\n"
    "    def flush(self) -> None:\n        m: Any = self.metric\n        m._sum.inc(1)\n",
    "from granian._granian import ASGIWorker\n",
    "import h11._util\n",
    "from hypercorn.asyncio.task_group import TaskGroup\n"
    "class Lean(TaskGroup):\n    def spawn(self) -> None:\n        self._loop.call_soon(f)\n",
    "from hypercorn.protocol.h11 import H11Protocol\n"
    "class P(H11Protocol):\n    async def _send_h11_event(self, e):\n"
    "        await super()._send_h11_event(e)\n",
])
def test_the_scan_finds_private_uses(source: str) -> None:
    assert len(scan_source(source)) == 1, scan_source(source)


@pytest.mark.parametrize("source", [
    "import asyncio\ntype(asyncio.get_running_loop()).__module__\n",
    "from prometheus_client.registry import Collector\n"
    "class C(Collector):\n    __slots__ = ('_t',)\n"
    "    def collect(self):\n        return self._t\n",
    "from prometheus_client.registry import Collector\n"
    "class C(Collector):\n    def __init__(self, t):\n        self._t = t\n"
    "    def collect(self):\n        return self._t\n",
    "import uvicorn\nclass S(uvicorn.Server):\n    def _own(self):\n        return 1\n"
    "    def run(self):\n        return self._own()\n",
    "class Mine:\n    def f(self, other):\n        return other._x, self._y\n",
])
def test_the_scan_passes_public_and_own_uses(source: str) -> None:
    assert scan_source(source) == []

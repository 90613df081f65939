"""The house's import rules: which package may import which, and no import cycles.

The request path runs one way (HTTP -> render -> route -> engine link -> output -> HTTP), and
the packages import the same way: ``wire`` and ``radix`` import nothing of ours; render's
library only the wire types and the error tree (``serving.errors``, which imports nothing of
ours); the output pipeline the wire types, render's library and the error tree; the simulated
engine only the wire types, and to find and read a model's files (the embedded model, a Hub id,
its context length) render's model-file helpers, lazily; its HTTP face (``sim.http``, loaded
only when asked for) renders and answers as `vllm serve` does, with render, output and serving.
Engine discovery imports nothing of ours.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OURS = {"wire", "radix", "render", "serving", "output", "router", "sim", "discovery", "devtools",
        "kvroute"}

# package (a folder, dotted) -> the packages of ours it may import; the most specific key wins.
ALLOWED: dict[str, set[str]] = {
    "wire": {"wire"},
    "radix": {"radix"},
    "render": {"render", "wire", "serving.errors"},
    "render.service": {"render", "wire", "serving", "output"},
    "serving": {"serving"},
    "serving.errors": {"serving.errors"},
    "output": {"output", "wire", "render", "serving.errors"},
    "sim": {"sim", "wire", "render.models", "render.model_files", "render.hub"},
    # The HTTP face speaks `vllm serve`'s API: it renders, answers through the output pipeline
    # and serves on the project's HTTP server, as the router does (imported only with --port).
    "sim.http": {"sim", "wire", "render", "output", "serving"},
    "discovery": {"discovery"},
    "router": {"router", "wire", "radix", "render", "serving", "output", "discovery"},
    "devtools": OURS - {"kvroute"},
    "kvroute": OURS,
}


# ... except these, inside what a rule allows: render's library never imports its HTTP service.
DENIED: dict[str, set[str]] = {"render": {"render.service"}}


def _modules() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for top in sorted(OURS):
        for path in (ROOT / top).rglob("*.py"):
            if "models" in path.relative_to(ROOT).parts[1:2] and top == "render":
                continue  # render/models holds data files, not code
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join(parts)] = path
    return mods


def _imports(path: Path, *, module_level_only: bool) -> set[str]:
    """Dotted names of our modules that ``path`` imports (``from a import b`` counts ``a.b``
    when that is a module, else ``a``). Imports under ``if TYPE_CHECKING`` never run."""
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            nested = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            if module_level_only and nested:
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                found.update(f"{child.module}.{a.name}" for a in child.names)
                found.add(child.module)
            visit(child, top and not nested)

    visit(tree, True)
    return {name for name in found if name.split(".")[0] in OURS}


def _all_imports(path: Path) -> set[str]:
    """Every module name ``path`` imports, of any package, function-level imports included."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _owner(module: str, table: dict[str, set[str]]) -> str:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in table:
            return ".".join(parts[:n])
    raise AssertionError(f"{module}: no import rule for its package")


def _within(target: str, packages: set[str]) -> bool:
    return any(target == a or target.startswith(a + ".") for a in packages)


def _allowed(target: str, package: str) -> bool:
    return _within(target, ALLOWED[package]) and not _within(target, DENIED.get(package, set()))


def test_every_package_has_a_rule() -> None:
    for module in _modules():
        _owner(module, ALLOWED)


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_dependency_direction(package: str) -> None:
    mods = _modules()
    offenders: dict[str, list[str]] = {}
    for module, path in mods.items():
        if _owner(module, ALLOWED) != package:
            continue
        bad = sorted(t for t in _imports(path, module_level_only=False)
                     if (t in mods or t.rpartition(".")[0] in mods)
                     and not _allowed(t, package))
        if bad:
            offenders[module] = bad
    assert offenders == {}


def test_no_import_cycles() -> None:
    """Module-level imports of our modules form no cycle (Tarjan's strongly connected parts)."""
    mods = _modules()
    graph = {m: sorted(t for t in _imports(p, module_level_only=True) if t in mods and t != m)
             for m, p in mods.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def strongconnect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                cycles.append(sorted(part))

    for v in graph:
        if v not in index:
            strongconnect(v)
    assert cycles == []


def test_the_rules_can_fail(tmp_path: Path) -> None:
    """The scanner sees a forbidden import and a cycle when they are there."""
    bad = tmp_path / "m.py"
    bad.write_text("import router.front.app\nfrom render import renderer\n"
                   "def f():\n    import sim.engine\n")
    assert _imports(bad, module_level_only=True) == {
        "router.front.app", "render", "render.renderer"}
    assert "sim.engine" in _imports(bad, module_level_only=False)
    assert not _allowed("router.front.app", "output")
    assert not _allowed("render.service.server", "render")
    assert _allowed("render.renderer", "render")


def test_the_packages_never_import_transformers() -> None:
    """transformers is in the test extra only (tests and scripts use it as a reference)."""
    users = sorted(module for module, path in _modules().items()
                   if "transformers" in {n.split(".")[0] for n in _all_imports(path)})
    assert users == []

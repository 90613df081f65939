"""The dependency direction of the packages: radix <- render <- router, never the other way."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = {"radix": {"render", "router"}, "render": {"router", "radix"}}


def _imported_top_levels(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_dependency_direction(package: str) -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(_imported_top_levels(path) & FORBIDDEN[package])
        for path in (ROOT / package).rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_packages_never_import_transformers() -> None:
    """transformers is in the test extra only (tests and scripts use it as a reference)."""
    users = [
        str(path.relative_to(ROOT))
        for package in ("radix", "render", "router")
        for path in (ROOT / package).rglob("*.py")
        if "transformers" in _imported_top_levels(path)
    ]
    assert users == []

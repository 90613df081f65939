"""render: GPU-less OpenAI -> token-in rendering (tokenizer, chat template, sampling params).

The package exports resolve on first use, so importing a light submodule (``render.models``,
``render.errors``) does not load the tokenizer and template stack.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from render.errors import RenderError
    from render.registry import ModelRegistry
    from render.renderer import Renderer

__all__ = ["ModelRegistry", "RenderError", "Renderer"]

_HOMES = {"ModelRegistry": "render.registry", "RenderError": "render.errors",
          "Renderer": "render.renderer"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'render' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value

"""``ModelRegistry``: several loaded models in one process, selected by the request's ``model``."""

from __future__ import annotations

from collections.abc import Iterator

from render.errors import ModelNotFoundError
from render.renderer import Renderer


class ModelRegistry:
    """Renderers by served name; the first one added answers requests that name no model.

    An alias is another name for a served model's renderer: a LoRA adapter's model name renders
    with its base model's tokenizer and template, as vLLM renders adapter requests. Aliases are
    not served names (``names()``), and may come and go at run time (dynamic adapters).
    """

    def __init__(self, renderers: list[Renderer] | None = None) -> None:
        self._by_name: dict[str, Renderer] = {}
        self._aliases: dict[str, Renderer] = {}
        for r in renderers or []:
            self.add(r)

    def add(self, renderer: Renderer) -> None:
        name = renderer.served_model_name
        if name in self._by_name or name in self._aliases:
            raise ValueError(f"model name {name!r} is served twice")
        self._by_name[name] = renderer

    def add_alias(self, alias: str, model: str | None) -> None:
        """Serve ``model``'s renderer (None: the default model's) under ``alias`` too."""
        if alias in self._by_name:
            raise ValueError(f"{alias!r} is a served model's name")
        self._aliases[alias] = self.get(model)

    def remove_alias(self, alias: str) -> None:
        self._aliases.pop(alias, None)

    def aliases(self) -> dict[str, str]:
        """Each alias with the served name of the model it renders for."""
        return {alias: r.served_model_name for alias, r in self._aliases.items()}

    def get(self, model: str | None) -> Renderer:
        """The renderer for ``model`` (None: the default one); unknown names are a 404."""
        if model is None:
            if not self._by_name:
                raise ModelNotFoundError("<none>")
            return next(iter(self._by_name.values()))
        renderer = self._by_name.get(model)
        if renderer is None:
            renderer = self._aliases.get(model)
            if renderer is None:
                raise ModelNotFoundError(model)
        return renderer

    def names(self) -> list[str]:
        return list(self._by_name)

    def __iter__(self) -> Iterator[Renderer]:
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)

"""``ModelRegistry``: several loaded models in one process, selected by the request's ``model``."""

from __future__ import annotations

from collections.abc import Iterator

from render.errors import ModelNotFoundError
from render.renderer import Renderer


class ModelRegistry:
    """Renderers by served name; the first one added answers requests that name no model."""

    def __init__(self, renderers: list[Renderer] | None = None) -> None:
        self._by_name: dict[str, Renderer] = {}
        for r in renderers or []:
            self.add(r)

    def add(self, renderer: Renderer) -> None:
        if renderer.served_model_name in self._by_name:
            raise ValueError(f"model name {renderer.served_model_name!r} is served twice")
        self._by_name[renderer.served_model_name] = renderer

    def get(self, model: str | None) -> Renderer:
        """The renderer for ``model`` (None: the default one); unknown names are a 404."""
        if model is None:
            if not self._by_name:
                raise ModelNotFoundError("<none>")
            return next(iter(self._by_name.values()))
        try:
            return self._by_name[model]
        except KeyError:
            raise ModelNotFoundError(model) from None

    def names(self) -> list[str]:
        return list(self._by_name)

    def __iter__(self) -> Iterator[Renderer]:
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)

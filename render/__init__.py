"""render: GPU-less OpenAI -> token-in rendering (tokenizer, chat template, sampling params)."""

from render.errors import RenderError
from render.registry import ModelRegistry
from render.renderer import Renderer

__all__ = ["ModelRegistry", "RenderError", "Renderer"]

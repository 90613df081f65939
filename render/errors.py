"""The request errors render raises: members of the one tree drawn in serving/errors.py.

``RenderError`` is render's name for the tree's base, ``APIError``: any of them carries its HTTP
status, OpenAI error type and param, and pickles whole (render/service/offload.py's helpers send
them back).
"""

from __future__ import annotations

from serving.errors import APIError as RenderError
from serving.errors import (
    BadRequestError,
    ContextLengthError,
    InputProcessorError,
    ModelNotFoundError,
    TemplateLimitError,
    TemplateUnavailableError,
    vllm_message,
)

__all__ = [
    "BadRequestError",
    "ContextLengthError",
    "InputProcessorError",
    "ModelNotFoundError",
    "RenderError",
    "TemplateLimitError",
    "TemplateUnavailableError",
    "vllm_message",
]

"""Render errors: one small hierarchy the HTTP layer maps to OpenAI's error JSON.

    RenderError(status, message, type, param)      base; `status` is the HTTP status to answer with
     ├── BadRequestError        400  invalid_request_error  (bad fields, template refusals)
     │    └── ContextLengthError 400  prompt/max_tokens beyond the context
     ├── ModelNotFoundError     404  NotFoundError          (unknown `model`)
     └── TemplateUnavailableError 400 no chat template / request template not allowed

The HTTP layer renders any of them as ``{"error": {"message", "type", "param", "code": status}}``.
They pickle whole (a render helper process sends them back: render/service/offload.py).
"""

from __future__ import annotations

from typing import Any


class RenderError(Exception):
    """An error the client caused, with the HTTP status and OpenAI error type to report."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param

    def to_dict(self) -> dict[str, object]:
        """OpenAI's error body."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.status,
            }
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.status}, {self.message!r}, param={self.param!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Exception pickles as ``cls(*args)``, and args here is (message,): RenderError itself
        # would fail to unpickle (and break the helper pool), ModelNotFoundError would nest its
        # message. Rebuilt from the fields instead, whatever the subclass's constructor takes.
        return (_rebuild, (type(self), self.args, self.__dict__))


def _rebuild(cls: type[RenderError], args: tuple[Any, ...], state: dict[str, Any]) -> RenderError:
    exc = cls.__new__(cls, *args)
    exc.args = args
    exc.__dict__.update(state)
    return exc


class BadRequestError(RenderError):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(400, message, "BadRequestError", param)


class ContextLengthError(BadRequestError):
    """The prompt, or the prompt plus max_tokens, does not fit in the model's context."""


class TemplateUnavailableError(BadRequestError):
    """No chat template for this model, or a request template the operator did not allow."""


class ModelNotFoundError(RenderError):
    def __init__(self, model: str) -> None:
        super().__init__(404, f"The model `{model}` does not exist.", "NotFoundError", "model")

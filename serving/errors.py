"""Every error either service answers with, and the one function that writes it as OpenAI's JSON.

    APIError(status, message, type, param)   base (render calls it RenderError); pickles whole
     ├── BadRequestError          400 BadRequestError           bad fields, template refusals
     │    ├── ContextLengthError                                prompt/max_tokens past the context
     │    ├── TemplateUnavailableError                          no chat template / not allowed
     │    ├── InputProcessorError                               refused as the engine takes it
     │    ├── InvalidUserInputError 400 InvalidUserInput        a LoRA load/unload vLLM refuses
     │    ├── TemplateLimitError                                a request's template over its limits
     │    └── InvalidJSONError    400 Bad Request               bad JSON or schema; param = its path
     ├── AuthenticationError      401 AuthenticationError       missing or wrong API key
     ├── NotFoundError            404 NotFoundError             unknown path
     │    └── ModelNotFoundError                                unknown `model` (param "model")
     ├── BodyTooLarge             413 Request Entity Too Large  body over the limit
     ├── ClientGoneError          499 (no body)                 the client left before its answer
     ├── EngineRefusedError       the engine's 4xx              an HTTP engine refused the input
     ├── OverloadedError          429 RateLimitError            the router's queue is full
     │                            503 ServiceUnavailable        no slot in time / no engine
     ├── ServiceUnavailableError  503 ServiceUnavailable        (retry-after: 1)
     │    ├── ShuttingDownError                                 the router is draining
     │    └── EngineLinkError                                   the engine link failed
     │         ├── EngineDeadError          died: ENGINE_CORE_DEAD, or silent too long
     │         ├── EngineUnavailableError   unknown, not (yet) connected, client closed
     │         └── UtilityCallError         a utility call answered with a failure
     └── InternalServerError      500 InternalServerError       a bug, or the engine's report
          └── EngineOutputError   its code (4xx: BadRequestError)  the engine failed the request

``error_body(exc)`` turns any exception into ``{"error": {"message", "type", "param", "code"}}``
(vLLM's ``ErrorResponse(error=ErrorInfo(...))``); one that is not an ``APIError`` is read by
``api_error`` first (msgspec's decode errors are bad JSON, anything else a 500). The same body is
a JSON response (serving/http_errors.py, for Starlette and the raw-ASGI fast paths alike), the
in-band error event of a stream that has started (``sse_event``) and a collected answer's body
(``error_json``), so a failure reads the same whichever way the answer goes out.

This module imports nothing of ours and no HTTP framework: the render library raises these as
plain exceptions, and the helper processes of render/service/offload.py send them back pickled.
"""

from __future__ import annotations

import re
from typing import Any, TypedDict

import msgspec

_ENCODER = msgspec.json.Encoder()
# msgspec ends its messages with " - at `$.messages[0].role`".
_PATH = re.compile(r" - at `\$\.?([^`]*)`$")
_INDEX = re.compile(r"\[(\d+)\]")


class ErrorInfo(TypedDict):
    message: str
    type: str
    param: str | None
    code: int


class ErrorBody(TypedDict):
    error: ErrorInfo


class APIError(Exception):
    """An error with the HTTP status, OpenAI error type and offending parameter to report."""

    def __init__(self, status: int, message: str, type: str = "BadRequestError",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param

    def headers(self) -> dict[str, str]:
        """Headers the HTTP answer carries besides the JSON body's."""
        return {}

    def to_dict(self) -> ErrorBody:
        """OpenAI's error body."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.status}}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.status}, {self.message!r}, param={self.param!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Exception pickles as ``cls(*args)``, and args here is (message,): the base would fail
        # to unpickle (and break render's helper pool), ModelNotFoundError would nest its
        # message. Rebuilt from the fields instead, whatever the subclass's constructor takes.
        return (_rebuild, (type(self), self.args, self.__dict__))


def _rebuild(cls: type[APIError], args: tuple[Any, ...], state: dict[str, Any]) -> APIError:
    exc = cls.__new__(cls, *args)
    exc.args = args
    exc.__dict__.update(state)
    return exc


class BadRequestError(APIError):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(400, message, "BadRequestError", param)


def vllm_message(message: str, parameter: str | None = None, value: object = None) -> str:
    """``message`` as vLLM's ``VLLMValidationError`` words it: the parameter and the value it
    refused appended (``... (parameter=top_p, value=0.0)``), when it names them."""
    extras = []
    if parameter is not None:
        extras.append(f"parameter={parameter}")
    if value is not None:
        extras.append(f"value={value}")
    return f"{message} ({', '.join(extras)})" if extras else message


class ContextLengthError(BadRequestError):
    """The prompt, or the prompt plus max_tokens, does not fit in the model's context."""


class InputProcessorError(BadRequestError):
    """Refused by the checks vLLM runs as it hands a request to its engine (its input processor:
    ``SamplingParams.verify``, the prompt's token ids). vLLM's streamed answer has started by
    then, so a streamed request gets this as an SSE error event after a 200; anything else as
    a 400."""


class TemplateUnavailableError(BadRequestError):
    """No chat template for this model, or a request template the operator did not allow."""


class InvalidUserInputError(BadRequestError):
    """A LoRA adapter load or unload vLLM refuses (its error type for those)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.type = "InvalidUserInput"


class TemplateLimitError(BadRequestError):
    """A request's own chat template took more time or memory than its render may; ``limit``
    says which: "time", "memory", or "ended" (its render process ended)."""

    def __init__(self, message: str, limit: str) -> None:
        super().__init__(message, "chat_template")
        self.limit = limit


class InvalidJSONError(BadRequestError):
    """The body is not JSON, or not the request's schema (msgspec's message and path)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message, param)
        self.type = "Bad Request"  # vLLM's type for a request that fails validation


class AuthenticationError(APIError):
    def __init__(self, message: str = "Invalid or missing API key.") -> None:
        super().__init__(401, message, "AuthenticationError")

    def headers(self) -> dict[str, str]:
        # Answered before the body was read, so the server closes the connection (h11 cannot
        # find the next request's start): said up front, a keep-alive client opens a new one
        # instead of writing into a closing socket.
        return {"www-authenticate": "Bearer", "connection": "close"}


class NotFoundError(APIError):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(404, message, "NotFoundError", param)


class ModelNotFoundError(NotFoundError):
    def __init__(self, model: str, valid: str | None = None) -> None:
        # vLLM's own wording (serve/engine/serving.py), so clients matching on it keep working.
        message = f"The model `{model}` does not exist."
        super().__init__(message if valid is None else f"{message} Valid aliases: {valid}.",
                         "model")


class BodyTooLarge(APIError):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"Request body exceeds the limit of {limit} bytes.",
                         "Request Entity Too Large")
        self.limit = limit

    def headers(self) -> dict[str, str]:
        # The rest of the body is never read: the server closes the connection after this
        # answer, and says so, or a keep-alive client would send its next request into it.
        return {"connection": "close"}


class ClientGoneError(APIError):
    """The client disconnected before its answer started: nobody reads the answer, whose status
    only marks the request in logs and metrics."""

    def __init__(self, message: str = "The client disconnected.") -> None:
        super().__init__(499, message, "ClientClosedRequest")


class EngineRefusedError(APIError):
    """An HTTP engine (a `vllm serve` pod) refused the request as the client's error: its 4xx
    status, error type, message and parameter go to the client as they came; never retried on
    another engine (it would refuse the same input)."""


class OverloadedError(APIError):
    """No engine slot now: 429 when the wait queue is full, 503 when waiting timed out or no
    engine is healthy; ``retry_after`` seconds go in the Retry-After header."""

    def __init__(self, status: int, message: str, retry_after: int) -> None:
        super().__init__(status, message,
                         "RateLimitError" if status == 429 else "ServiceUnavailable")
        self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        return {"retry-after": str(self.retry_after)}


class ServiceUnavailableError(APIError):
    def __init__(self, message: str) -> None:
        super().__init__(503, message, "ServiceUnavailable")

    def headers(self) -> dict[str, str]:
        return {"retry-after": "1"}


class ShuttingDownError(ServiceUnavailableError):
    def __init__(self, message: str = "The router is shutting down.") -> None:
        super().__init__(message)

    def headers(self) -> dict[str, str]:
        return {"retry-after": "1", "connection": "close"}


class EngineLinkError(ServiceUnavailableError):
    """The engine link failed; ``str(exc)`` is the link's own account of it."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"Engine failed: {detail}")
        self.args = (detail,)


class EngineDeadError(EngineLinkError):
    """The engine serving a request died; its in-flight requests are lost."""


class EngineUnavailableError(EngineLinkError):
    """The engine is unknown, not connected, or the client is closed."""


class UtilityCallError(EngineLinkError):
    """The engine ran the utility method and reported a failure."""


class InternalServerError(APIError):
    def __init__(self, message: str, status: int = 500) -> None:
        super().__init__(status, message, "InternalServerError")


class EngineOutputError(InternalServerError):
    """The engine reported a failed request (finish_reason ERROR or an attached error). Its
    code is the engine's: a 4xx is the request's fault (the engine refused its input), typed
    as vLLM types a bad request; else a 500."""

    def __init__(self, message: str, code: int = 500) -> None:
        super().__init__(message, code)
        if 400 <= code < 500:
            self.type = "BadRequestError"

    @property
    def code(self) -> int:
        return self.status


def api_error(exc: BaseException) -> APIError:
    """``exc`` as a member of the tree: itself, bad JSON for msgspec's errors, else a 500."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, msgspec.DecodeError):  # ValidationError included
        message = str(exc)
        m = _PATH.search(message)
        if m is not None:
            return InvalidJSONError(message, _body_param(m.group(1)))
        # A document that is no request object at all: vLLM's "body" (bad JSON names none).
        valid_json = isinstance(exc, msgspec.ValidationError)
        return InvalidJSONError(message, "body" if valid_json else None)
    return InternalServerError(f"Internal error: {type(exc).__name__}: {exc}")


def _body_param(path: str) -> str:
    """msgspec's path of a field (``messages[0].role``) as vLLM names it for a request that
    fails validation (``body.messages.0.role``; the body itself: ``body``)."""
    return "body" + ("." + _INDEX.sub(r".\1", path) if path else "")


def error_body(exc: BaseException) -> ErrorBody:
    """OpenAI's error JSON for any exception: the one builder of it."""
    return api_error(exc).to_dict()


def error_json(exc: BaseException) -> bytes:
    """The error body encoded: a JSON response's or a collected answer's."""
    return _ENCODER.encode(error_body(exc))


def sse_event(exc: BaseException) -> bytes:
    """The error as the in-band ``data:`` event that ends a stream already under way."""
    return b"data: " + error_json(exc) + b"\n\n"

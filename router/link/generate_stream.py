"""One request on a pod: the generate request written out, its SSE chunks read into outputs.

The request is the engine request as vLLM's ``/inference/v1/generate`` takes it
(``wire.token_api.TokenGenerateRequest``, streamed, usage asked for). The router keeps what it
does for every engine: stop strings stay in the router (the pod gets none and ends only on EOS,
stop tokens or length; the router aborts it on a match, as it does a ZMQ engine), so the pod
need not detokenize. Each SSE chunk becomes the ``EngineCoreOutput`` a ZMQ engine would send:
delta token ids, logprob rows, finish and stop reason; the finishing output waits for the usage
chunk behind it, whose cached-token count becomes its ``prefill_stats`` (a pod started with
``--enable-prompt-tokens-details`` reports it).

Logprobs: a pod lists the first ``max(k, 1)`` candidates of each position (the sampled token
first), one fewer than completions show (``k + 1``), so the pod is asked for ``k + 1`` where
the engines' ``max_logprobs`` allows; the rows are rebuilt by rank (column 0 the sampled
token, column r the rank-r token), as the engine's arrays hold them.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from router.link.request_stream import RequestStream
from serving.errors import (
    APIError,
    BadRequestError,
    EngineDeadError,
    EngineLinkError,
    EngineRefusedError,
    EngineUnavailableError,
)
from wire.engine import EngineCoreOutput, EngineCoreRequest, EngineError, FinishReason
from wire.ndarrays import LogprobRows
from wire.sampling import SamplingParams
from wire.token_api import (
    GENERATE_PATH,
    ErrorResponse,
    GenerateLogprobsContent,
    GenerateStreamOptions,
    StreamChunk,
    TokenGenerateRequest,
)

_ENCODER = msgspec.json.Encoder()
_CHUNK = msgspec.json.Decoder(StreamChunk)
_ERROR = msgspec.json.Decoder(ErrorResponse)
_USAGE = GenerateStreamOptions(include_usage=True)
_FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH,
           "abort": FinishReason.ABORT, "error": FinishReason.ERROR,
           "repetition": FinishReason.REPETITION}
_DONE = b"[DONE]"
_DEFAULT_MAX_TOKENS = SamplingParams().max_tokens
# Largest error body or single SSE event kept; a pod's are a few hundred bytes.
MAX_EVENT_BYTES = 16 * 1024 * 1024


def generate_body(request: EngineCoreRequest, max_logprobs: int) -> bytes:
    """The JSON body of ``POST /inference/v1/generate`` for one engine request."""
    params = request.sampling_params
    if params is None:
        raise BadRequestError("pooling requests are not supported on HTTP engines")
    if params.prompt_logprobs is not None:
        raise BadRequestError("prompt_logprobs are not available from HTTP engines (vLLM's "
                              "streaming generate API does not return them)",
                              "prompt_logprobs")
    k = params.logprobs
    if k is not None and k >= 0 and (max_logprobs < 0 or k + 1 <= max_logprobs):
        k += 1
    sent = msgspec.structs.replace(
        params, stop=None, include_stop_str_in_output=False, output_text_buffer_length=0,
        detokenize=False, logprobs=k)
    lora = request.lora_request
    body = TokenGenerateRequest(
        request_id=request.request_id, token_ids=request.prompt_token_ids or [],
        sampling_params=sent, model=lora.lora_name if lora is not None else None,
        stream=True, stream_options=_USAGE, cache_salt=request.cache_salt,
        priority=request.priority)
    if sent.max_tokens != _DEFAULT_MAX_TOKENS:
        return _ENCODER.encode(body)
    # omit_defaults drops max_tokens equal to SamplingParams' default (16), and a pod given no
    # max_tokens generates up to its context length: send it explicitly.
    raw = msgspec.to_builtins(body)
    raw["sampling_params"]["max_tokens"] = sent.max_tokens
    return _ENCODER.encode(raw)


def request_bytes(host: str, path: str, body: bytes, auth: bytes = b"") -> bytes:
    """A whole HTTP/1.1 POST (``auth``: an ``authorization`` header line, or nothing)."""
    return b"".join((
        b"POST ", path.encode(), b" HTTP/1.1\r\nhost: ", host.encode(),
        b"\r\ncontent-type: application/json\r\naccept: text/event-stream\r\n", auth,
        b"content-length: ", str(len(body)).encode(), b"\r\n\r\n", body))


def rows_from_content(content: list[GenerateLogprobsContent], k: int) -> LogprobRows:
    """The engine's logprob rows (width k + 1: sampled, then ranks 1..k) from a pod's entries.
    A rank the pod did not list repeats the sampled token, which every reader skips."""
    width = k + 1 if k >= 0 else 1 + max((len(c.top_logprobs) for c in content), default=0)
    ids: list[int] = []
    lps: list[float] = []
    ranks: list[int] = []
    for c in content:
        by_rank = {t.rank: t for t in c.top_logprobs if t.rank}
        ids.append(c.token_id)
        lps.append(c.logprob)
        ranks.append(c.rank or 0)
        for r in range(1, width):
            t = by_rank.get(r)
            if t is None:
                ids.append(c.token_id)
                lps.append(c.logprob)
            else:
                ids.append(t.token_id)
                lps.append(t.logprob)
    return LogprobRows(ids, lps, ranks, width)


class GenerateReader:
    """Reads one generate response into the request's stream (``router.link.http_conn.Reader``).

    ``done(reader, error)`` runs once, when the stream has finished or failed."""

    __slots__ = ("stream", "request_id", "logprobs", "done", "status", "tokens", "_buf",
                 "_final", "_ended", "_error_body")

    def __init__(self, stream: RequestStream, logprobs: int | None,
                 done: Callable[[GenerateReader, EngineLinkError | APIError | None], None]
                 ) -> None:
        self.stream = stream
        self.request_id = stream.request_id
        self.logprobs = logprobs
        self.done = done
        self.status = 0
        self.tokens = 0
        self._buf = b""
        self._final: EngineCoreOutput | None = None
        self._ended = False
        self._error_body = b""

    @property
    def started(self) -> bool:
        """The pod answered (a response head arrived)."""
        return self.status != 0

    def on_head(self, status: int) -> None:
        self.status = status

    def on_body(self, data: bytes) -> None:
        if self._ended:
            return
        if self.status != 200:
            if len(self._error_body) < MAX_EVENT_BYTES:
                self._error_body += data
            return
        buf = self._buf + data if self._buf else data
        start = 0
        while (end := buf.find(b"\n\n", start)) >= 0:
            event = buf[start:end]
            start = end + 2
            if event.startswith(b"data: "):
                self._event(event[6:])
            elif event.startswith(b"data:"):
                self._event(event[5:])
            if self._ended:
                return
        self._buf = buf[start:]
        if len(self._buf) > MAX_EVENT_BYTES:
            self._fail(EngineUnavailableError("an SSE event of the pod exceeds "
                                              f"{MAX_EVENT_BYTES} bytes"))

    def on_end(self) -> None:
        if self._ended:
            return
        if self.status != 200:
            self._fail(self._refusal())
        else:
            self._close()

    def on_error(self, exc: EngineLinkError) -> None:
        if not self._ended:
            self._fail(exc)

    # ---- events ----

    def _event(self, payload: bytes) -> None:
        if payload == _DONE:
            self._close()
            return
        try:
            chunk = _CHUNK.decode(payload)
        except msgspec.DecodeError as exc:
            self._fail(EngineUnavailableError(f"the pod sent an unreadable event ({exc})"))
            return
        if chunk.error is not None:
            err = chunk.error
            if self.tokens == 0 and 400 <= err.code < 500:
                # An input the pod refused (e.g. a token id outside its vocabulary): the
                # client's error, as if answered before the stream started.
                self._fail(EngineRefusedError(err.code, err.message, err.type or
                                              "BadRequestError", err.param))
                return
            self._finish(EngineCoreOutput(self.request_id, [], finish_reason=FinishReason.ERROR,
                                          error=EngineError(err.code, err.message)))
            return
        for choice in chunk.choices:
            ids = choice.token_ids or []
            self.tokens += len(ids)
            rows = None
            lp = choice.logprobs
            if lp is not None and lp.content and self.logprobs is not None:
                rows = rows_from_content(lp.content, self.logprobs)
            reason = choice.finish_reason
            out = EngineCoreOutput(self.request_id, ids, rows,
                                   finish_reason=_FINISH.get(reason, FinishReason.ERROR)
                                   if reason is not None else None,
                                   stop_reason=choice.stop_reason)
            if reason is None:
                self.stream.push(out)
            else:
                self._final = out  # sent with the usage chunk behind it
        usage = chunk.usage
        if usage is not None and self._final is not None:
            details = usage.prompt_tokens_details
            if details is not None and details.cached_tokens is not None:
                self._final.prefill_stats = {"num_prompt_tokens": usage.prompt_tokens,
                                             "num_cached_tokens": details.cached_tokens}

    def _refusal(self) -> EngineLinkError | APIError:
        status = self.status
        message = f"the engine answered HTTP {status}"
        kind, param = "", None
        try:
            body = _ERROR.decode(self._error_body)
        except msgspec.DecodeError:
            body = None
        if body is not None and body.error is not None:
            message, kind, param = body.error.message or message, body.error.type, body.error.param
        elif body is not None and body.detail is not None:
            message = str(body.detail)
        if 400 <= status < 500 and status not in (408, 429):
            return EngineRefusedError(status, message, kind or "BadRequestError", param)
        # 5xx, 408 and 429: the pod cannot take it now; another engine may.
        return EngineUnavailableError(f"engine answered HTTP {status}: {message}")

    def _close(self) -> None:
        """The response ended: its finishing output, or a failure if it had none."""
        final, self._final = self._final, None
        if final is not None:
            self._finish(final)
        else:
            self._fail(EngineDeadError("the engine's stream ended without a finish reason"))

    def _finish(self, out: EngineCoreOutput) -> None:
        self._ended = True
        self.stream.finish(out)
        self.done(self, None)

    def _fail(self, exc: EngineLinkError | APIError) -> None:
        self._ended = True
        self.stream.fail(exc)
        self.done(self, exc)


__all__ = ["GENERATE_PATH", "EngineRefusedError", "GenerateReader", "generate_body",
           "request_bytes", "rows_from_content"]

"""Route one rendered request to an engine and open its streams, retrying once before any token."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Collection, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import msgspec

from render.errors import BadRequestError
from router.kvfeed.kv_subscriber import kv_namespace
from router.link.engine_state import EngineStatus
from router.link.request_stream import ChoiceStream, RequestStream
from router.link.transport import EngineLinks
from router.obs.metrics import RouterMetrics
from router.routing.adapters import Adapters
from router.routing.admission import Admission
from router.routing.policy import Decision, NoEngineError, Policy
from router.routing.resume import ResumableStream, resumable
from serving.errors import APIError, EngineLinkError, OverloadedError
from wire.engine import EngineCoreOutput, EngineCoreRequest, FinishReason, LoRARequest
from wire.sampling import SamplingParams

log = logging.getLogger("kvroute.router")

BREAKER_BASE = 5.0  # seconds an engine is skipped after a failure before its first token
BREAKER_MAX = 60.0


class Placed(Protocol):
    """Engine streams holding router slots: one routed request, or several (multi_prompt.py)."""

    @property
    def streams(self) -> list[ChoiceStream]: ...


@dataclass(slots=True)
class Routed:
    """A request placed on an engine: its decision and one stream per choice, first output read."""

    decision: Decision
    uncached_tokens: int
    streams: list[ChoiceStream]
    first: list[EngineCoreOutput]
    attempts: int = 1
    _prefilled: bool = field(default=False)

    @property
    def request_ids(self) -> list[str]:
        return [s.request_id for s in self.streams]

    async def outputs(self, index: int) -> AsyncIterator[EngineCoreOutput]:
        """Every output of choice ``index``, the already-read first one included."""
        yield self.first[index]
        if self.first[index].finished:
            return
        async for out in self.streams[index]:
            yield out


class Dispatcher:
    """Chooses the engine (policy over healthy engines with free slots), submits, retries once."""

    def __init__(self, client: EngineLinks, policy: Policy, admission: Admission,
                 metrics: RouterMetrics, clock: Callable[[], float] = time.monotonic,
                 adapters: Adapters | None = None, max_resumes: int = 0) -> None:
        self.client = client
        # The LoRA adapters and the engines that loaded each (None: no adapter is served).
        self.adapters = adapters
        # How often one choice may go on on another engine after its engine died (0: never).
        self.max_resumes = max_resumes
        self.policy = policy
        self.admission = admission
        self.metrics = metrics
        self.clock = clock
        # Circuit breaker: an engine that failed a request before its first token is skipped
        # for a while (doubling per consecutive failure), even if its link still looks up.
        self._suspect_until: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        # Engines whose in-flight gauge reads the admission ledger (set up on first use).
        self._gauged: set[str] = set()
        # Engines being removed (DELETE /admin/engines/NAME): their requests finish, no new one
        # is placed on them.
        self.draining: set[str] = set()

    def healthy(self) -> list[str]:
        now = self.clock()
        draining = self.draining
        return [n for n, e in self.client.engines.items()
                if e.status is EngineStatus.READY and self._suspect_until.get(n, 0.0) <= now
                and n not in draining]

    def _failed(self, engine: str) -> None:
        count = self._failures.get(engine, 0) + 1
        self._failures[engine] = count
        self._suspect_until[engine] = self.clock() + min(BREAKER_BASE * 2 ** (count - 1),
                                                         BREAKER_MAX)

    def _succeeded(self, engine: str) -> None:
        if self._failures.pop(engine, None) is not None:
            self._suspect_until.pop(engine, None)

    def _engine_stats(self, engine: str) -> tuple[int, int]:
        counts = self.client.engines[engine].queue_counts
        return counts.num_running_reqs, counts.num_waiting_reqs

    async def open(
        self, request_id: str, tokens: Sequence[int], params: SamplingParams, *,
        lora: LoRARequest | None = None, cache_salt: str | None = None, priority: int = 0,
        session_id: str | None = None,
    ) -> Routed:
        """Place the request (n choices fanned out as vLLM does) and wait for its first outputs.

        Raises OverloadedError (no slot / no engine) or EngineLinkError (failed twice before a
        token). A LoRA request goes only to engines that loaded its adapter.
        """
        namespace = kv_namespace(lora.lora_name if lora else None, cache_salt)
        excluded: set[str] = set()
        holders: frozenset[str] | None = None
        if lora is not None:
            excluded, holders = self._lora_engines(lora)
        last_error: EngineLinkError | None = None
        for attempt in (1, 2):
            chosen = await self._choose(tokens, namespace, excluded, holders)
            if chosen is None:
                break
            decision, note = chosen
            children = _fan_out(request_id, tokens, params, params.n, lora, cache_salt,
                                priority, session_id)
            try:
                routed = await self._place(request_id, len(tokens), children, decision, note,
                                           attempt)
            except (EngineLinkError, StopAsyncIteration) as exc:
                # Nothing reached the client yet: try another engine, once.
                last_error = exc if isinstance(exc, EngineLinkError) else EngineLinkError(str(exc))
                engine = decision.engine
                self.policy.index.forget_routed(engine, tokens, namespace)
                excluded.add(engine)
                self._failed(engine)
                if attempt == 1:
                    self.metrics.retries.inc()
                log.warning("engine failed before the first token", extra={
                    "request_id": request_id, "engine": engine, "error": str(exc)})
                continue
            if any(out.error is not None or out.finish_reason == FinishReason.ERROR
                   for out in routed.first):
                # The engine refused the request (its answer says why): it caches nothing.
                self.policy.index.forget_routed(decision.engine, tokens, namespace)
                return routed
            if lora is not None and self.adapters is not None:
                self.adapters.routed(decision.engine, lora)
            if self.max_resumes and resumable(params):
                self._resumable(routed, children)
            return routed
        if last_error is not None:
            raise last_error
        if lora is not None:
            raise OverloadedError(503, f"No healthy engine has the LoRA adapter "
                                       f"'{lora.lora_name}' loaded; retry later.",
                                  self.admission.retry_after)
        raise OverloadedError(503, "No healthy engine is available; retry later.",
                         self.admission.retry_after)

    def _lora_engines(self, lora: LoRARequest) -> tuple[set[str], frozenset[str]]:
        """The engines a LoRA request must not go to (they did not load its adapter), and
        those holding it loaded now."""
        if self.adapters is None:
            return set(self.client.engines), frozenset()
        usable = self.adapters.usable(lora)
        return {e for e in self.client.engines if e not in usable}, self.adapters.holders(lora)

    def _resumable(self, routed: Routed, children: list[EngineCoreRequest]) -> None:
        """Each unfinished choice goes on on another engine if its engine dies (resume.py)."""
        lora, salt, priority = children[0].lora_request, children[0].cache_salt, \
            children[0].priority

        async def reopen(request_id: str, tokens: Sequence[int], params: SamplingParams,
                         excluded: Collection[str]) -> tuple[RequestStream, EngineCoreOutput]:
            return await self._reopen(request_id, tokens, params, lora, salt, priority,
                                      set(excluded))

        for i, stream in enumerate(routed.streams):
            if isinstance(stream, RequestStream) and not routed.first[i].finished:
                routed.streams[i] = ResumableStream(
                    stream, children[i], routed.first[i], reopen=reopen,
                    release=self.admission.release, abort=self.client.abort,
                    metrics=self.metrics, max_resumes=self.max_resumes)

    async def _reopen(self, request_id: str, tokens: Sequence[int], params: SamplingParams,
                      lora: LoRARequest | None, cache_salt: str | None, priority: int,
                      excluded: set[str]) -> tuple[RequestStream, EngineCoreOutput]:
        """Place one resumed choice on an engine not in ``excluded`` and read its first output;
        raises OverloadedError (no engine) or the engine's error (no retry: the caller ends the
        stream)."""
        namespace = kv_namespace(lora.lora_name if lora else None, cache_salt)
        holders: frozenset[str] | None = None
        if lora is not None:
            blocked, holders = self._lora_engines(lora)
            excluded |= blocked
        chosen = await self._choose(tokens, namespace, excluded, holders)
        if chosen is None:
            raise OverloadedError(503, "No healthy engine is available to resume on.",
                                  self.admission.retry_after)
        decision, note = chosen
        child = EngineCoreRequest(request_id, list(tokens), None, params, None, time.time(),
                                  lora, cache_salt, None, priority=priority)
        try:
            routed = await self._place(request_id, len(tokens), [child], decision, note, 1)
        except StopAsyncIteration as exc:
            raise EngineLinkError(f"the resumed request ended at once ({exc!r})") from None
        except EngineLinkError:
            self._failed(decision.engine)
            raise
        stream = routed.streams[0]
        assert isinstance(stream, RequestStream)
        log.warning("stream resumed on another engine", extra={
            "request_id": request_id, "engine": decision.engine, "tokens": len(tokens)})
        return stream, routed.first[0]

    async def _choose(self, tokens: Sequence[int], namespace: Hashable, excluded: set[str],
                      holders: frozenset[str] | None = None
                      ) -> tuple[Decision, Callable[[], object]] | None:
        """The policy's decision over the open healthy engines not excluded, waiting for a slot
        if none is open (or others queue first); None: no engine to wait for."""
        admission = self.admission

        def candidates() -> list[str]:
            return [e for e in admission.open_engines(self.healthy()) if e not in excluded]

        live = self.healthy()
        if excluded:
            live = [e for e in live if e not in excluded]
        if not live:
            return None
        # wait_for_slot returns at once when nobody queues and an engine has a slot: that
        # check is made here on the engines just listed, without a second listing.
        open_now = admission.open_engines(live)
        if not open_now or admission.queued:
            await admission.wait_for_slot(lambda: bool(candidates()))
            open_now = candidates()
        loads = admission.loads(open_now, self._engine_stats)
        try:
            return self.policy.decide(tokens, namespace, loads, self.clock(), holders)
        except NoEngineError:
            return None

    async def _place(self, request_id: str, prompt_tokens: int,
                     children: list[EngineCoreRequest], decision: Decision,
                     note: Callable[[], object], attempt: int) -> Routed:
        """Submit the children on the decided engine and read their first outputs. On failure
        the children are aborted and their slots given back before the error goes up."""
        engine = decision.engine
        uncached = prompt_tokens - decision.cached_tokens
        share = uncached // len(children)
        for _ in children:
            self.admission.take(engine, share)
        streams: list[ChoiceStream] = []
        noted = False
        try:
            for child in children:
                streams.append(await self.client.submit(engine, child))
            # The ADD is on its way: the bookkeeping below overlaps the engine's work. The
            # note goes in before any await, so no later decision can miss this route.
            note()
            self._log_decision(request_id, decision, prompt_tokens, attempt)
            noted = True
            if len(streams) == 1:
                first = [await anext(streams[0])]
            else:
                first = list(await asyncio.gather(*(anext(s) for s in streams)))
        except ValueError as exc:  # the engine client refused a duplicate request id
            await self._withdraw(engine, share, [s.request_id for s in streams], len(children))
            raise BadRequestError(str(exc), "request_id") from exc
        except asyncio.CancelledError:
            # The client left while its prompt was queued or prefilling: the engine must
            # not spend the prefill on nobody, and the slots go back.
            await self._withdraw(engine, share, [c.request_id for c in children], len(children))
            self.metrics.aborts.labels("client_disconnect").inc(len(children))
            raise
        except (EngineLinkError, StopAsyncIteration):
            await self._withdraw(engine, share, [c.request_id for c in children], len(children))
            if not noted:
                self._log_decision(request_id, decision, prompt_tokens, attempt)
            raise
        except APIError:
            # An HTTP engine refused the request as the client's error (its 4xx): no retry.
            await self._withdraw(engine, share, [c.request_id for c in children], len(children))
            raise
        for _ in children:
            self.admission.prefilled(engine, share)
        if self._failures:
            self._succeeded(engine)
        self._opened_metrics(engine, decision.cached_tokens, first[0])
        return Routed(decision, uncached, streams, first, attempt)

    async def _withdraw(self, engine: str, share: int, request_ids: list[str],
                        children: int) -> None:
        """Abort what was submitted and give every child's slot and prefill share back."""
        with contextlib.suppress(EngineLinkError):
            await self.client.abort(request_ids)
        for _ in range(children):
            self.admission.prefilled(engine, share)
            self.admission.release(engine)

    def _opened_metrics(self, engine: str, predicted_cached: int,
                        first: EngineCoreOutput) -> None:
        m = self.metrics
        if engine not in self._gauged:
            self._gauged.add(engine)
            admission = self.admission
            m.in_flight.labels(engine).set_function(lambda: admission.in_flight(engine))
        key = (engine,)
        m.predicted_cached_tally.inc(key, predicted_cached)
        reported = _cached_tokens(first)
        if reported is not None:
            m.engine_cached_tally.inc(key, reported)
            m.prediction_error_tally.observe(reported - predicted_cached)

    def _log_decision(self, request_id: str, decision: Decision, prompt_tokens: int,
                      attempt: int) -> None:
        self.metrics.decisions_tally.inc((self.policy.config.name, decision.reason,
                                          decision.engine))
        if log.isEnabledFor(logging.INFO):
            log.info("route", extra={"request_id": request_id, "engine": decision.engine,
                                     "cached": decision.cached_tokens, "reason": decision.reason,
                                     "prompt_tokens": prompt_tokens, "attempt": attempt})

    def done(self, routed: Placed) -> None:
        """Give the slots back (call once, whatever the outcome)."""
        for stream in routed.streams:
            self.admission.release(stream.engine)

    async def abort(self, routed: Placed, cause: str) -> None:
        pending = [s.request_id for s in routed.streams if not s.finished]
        if pending:
            self.metrics.aborts.labels(cause).inc(len(pending))
            with contextlib.suppress(EngineLinkError):
                await self.client.abort(pending)


def _fan_out(request_id: str, tokens: Sequence[int], params: SamplingParams, n: int,
             lora: LoRARequest | None, cache_salt: str | None, priority: int,
             session_id: str | None = None) -> list[EngineCoreRequest]:
    now = time.time()
    if n == 1:
        return [EngineCoreRequest(request_id, list(tokens), None, params, None, now, lora,
                                  cache_salt, None, priority=priority, session_id=session_id)]
    out = []
    for i in range(n):
        # vLLM's ParentRequest: child i is "{i}_{id}" with n=1 and seed + i when seeded.
        seed = None if params.seed is None else params.seed + i
        child = msgspec.structs.replace(params, n=1, seed=seed)
        out.append(EngineCoreRequest(f"{i}_{request_id}", list(tokens), None, child, None, now,
                                     lora, cache_salt, None, priority=priority,
                                     session_id=session_id))
    return out


def _cached_tokens(out: EngineCoreOutput) -> int | None:
    stats = out.prefill_stats
    if stats is None:
        return None
    value = stats.get("num_cached_tokens")
    return int(value) if isinstance(value, int) else None

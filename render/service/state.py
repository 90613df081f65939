"""The render service's typed state: built in the lifespan, read by every render handler.

The router serves render's endpoints too (rendering in process) and holds one of these inside its
own state, built by ``RenderState`` from explicit arguments, not from a render ServerConfig.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from output.detokenize import TokenDecoder
from output.parsers.registry import ModelParsers
from render.registry import ModelRegistry
from render.renderer import Renderer
from render.service.config import RenderLimits
from render.service.derender import Derenderer
from render.service.loading import Codecs, find_model
from render.service.lora_modules import LoRAModule
from render.service.offload import Rendered, RenderHelper
from render.service.sandbox import TemplateSandbox
from serving.metrics import RenderMetrics

T = TypeVar("T")
log = logging.getLogger(__name__)
# The key of the RenderState in the lifespan state (and so in every request's scope["state"]).
STATE_KEY = "kvroute.render"


class Models:
    """The loaded renderers, each with the lock that serialises its renders in this worker.

    A Renderer is not thread-safe (its caches mutate), and big renders run on a thread while small
    ones run on the loop, so every render of a model takes its asyncio lock first: waiting for it
    never blocks the loop, and the lock is uncontended on the common path.
    """

    def __init__(self, registry: ModelRegistry, created: int,
                 parsers: dict[str, ModelParsers] | None = None) -> None:
        self.registry = registry
        # Each model's output parsers by served name (derender, and the router's answers).
        self.parsers = parsers or {}
        self._derenderers: dict[str, Derenderer] = {}
        self.locks = {name: asyncio.Lock() for name in registry.names()}
        self.costs = {name: RenderCost() for name in registry.names()}
        self.created = created

    def get(self, name: str | None) -> Renderer:
        return find_model(self.registry, name)

    def derenderer(self, name: str) -> Derenderer:
        """The model's derender, built on first use (its detokenizer tables take ~0.1 s)."""
        found = self._derenderers.get(name)
        if found is None:
            renderer = self.get(name)
            found = self._derenderers[name] = Derenderer(
                name, TokenDecoder(renderer.tokenizer), self.parsers.get(name))
        return found


class RenderCost:
    """One model's CPU seconds per body byte, to predict a render's cost.

    Small requests carry a fixed overhead, so their per-byte cost over-predicts big ones: the
    estimate errs towards the thread, the side that never blocks the loop. It rises to a dearer
    sample at once and falls back slowly: renders served from the segment cache cost a fraction
    of a fresh text's, and a run of them must not send the next fresh 400 KB body to the loop.
    """

    def __init__(self) -> None:
        self.per_byte: float | None = None

    def predict(self, size: int) -> float | None:
        return None if self.per_byte is None else size * self.per_byte

    def observe(self, size: int, seconds: float) -> None:
        sample = seconds / max(size, 1)
        if self.per_byte is None or sample > self.per_byte:
            self.per_byte = sample
        else:
            self.per_byte = 0.9 * self.per_byte + 0.1 * sample


class Budget(Protocol):
    """Where a body renders by its size (RenderLimits, or a ServerConfig)."""

    @property
    def offload_bytes(self) -> int: ...
    @property
    def inline_max_bytes(self) -> int: ...
    @property
    def inline_budget_ms(self) -> float: ...


def _timed(cost: RenderCost, size: int, fn: Callable[..., T], *args: Any) -> T:
    t0 = time.thread_time()  # this thread's CPU: a render waiting for the GIL costs nothing
    try:
        return fn(*args)
    finally:
        cost.observe(size, time.thread_time() - t0)


def render_pool(threads: int, renderers: Iterable[Renderer]) -> ThreadPoolExecutor:
    """The render thread pool with every thread started and each model's tokenizer used once in it.

    ThreadPoolExecutor starts its threads on demand, and a tokenizer's first encode in a thread
    pays a one-time setup there (fastokens' per-thread state: a few ms alone, ~50 ms measured in a
    router under load), so the first big body of a fresh process paid both: the one request whose
    TTFT stood ~45 ms above every other router's in bench/compare.py. Blocking: call it off the
    loop, before serving."""
    models = tuple(renderers)
    one_at_a_time = threading.Lock()  # a Renderer is not thread-safe (class Models)

    def warm() -> None:
        try:
            with one_at_a_time:
                for r in models:
                    r.warm_up()
        except Exception:  # a thread that raises here would break the pool: it just stays cold
            log.exception("render thread warm-up failed")

    pool = ThreadPoolExecutor(threads, thread_name_prefix="render", initializer=warm)
    # A task that holds its thread until all are held makes the pool start the next thread.
    started = threading.Barrier(threads)
    for future in [pool.submit(started.wait, 30.0) for _ in range(threads)]:
        try:
            future.result()
        except threading.BrokenBarrierError:
            log.warning("render threads: not all started within 30 s")
    return pool


async def render_in(models: Models, budget: Budget, pool: ThreadPoolExecutor,
                    renderer: Renderer, size: int, fn: Callable[..., T], *args: Any) -> T:
    """Runs ``fn`` under the model's lock: on the loop when small or predicted cheap (a thread
    handoff costs more than a fast render), else on the render pool."""
    name = renderer.served_model_name
    cost = models.costs[name]
    async with models.locks[name]:
        predicted = cost.predict(size)
        if size <= budget.offload_bytes or (
            size <= budget.inline_max_bytes
            and predicted is not None
            and predicted * 1e3 <= budget.inline_budget_ms
        ):
            return _timed(cost, size, fn, *args)
        return await asyncio.get_running_loop().run_in_executor(
            pool, _timed, cost, size, fn, *args
        )


@dataclass(frozen=True, slots=True, eq=False)
class RenderState:
    """What a render handler reads: the models, limits, pool, codecs, metrics, helpers."""

    models: Models
    roots: tuple[Path, ...]  # each model's directory, in registry order (GET /v1/models)
    limits: RenderLimits
    pool: ThreadPoolExecutor
    codecs: Codecs
    metrics: RenderMetrics
    helper: RenderHelper | None  # None: every body renders in this process (the router)
    # The static adapters whose names render with a base model (their aliases in the registry).
    lora_modules: tuple[LoRAModule, ...] = ()
    # Requests' own chat templates (render/service/sandbox.py); None: not allowed here.
    sandbox: TemplateSandbox | None = None

    async def offloaded(self, path: str, body: bytes) -> Rendered | None:
        """The answer of a helper process: a template helper's for a body bringing its own chat
        template, a render helper's for a big body; None: render it in this process."""
        if self.sandbox is not None and (done := await self.sandbox.render(path, body)):
            return done
        return None if self.helper is None else await self.helper.render(path, body)

    async def run(self, renderer: Renderer, size: int, fn: Callable[..., T], *args: Any) -> T:
        return await render_in(self.models, self.limits, self.pool, renderer, size, fn, *args)


def render_state(state: MutableMapping[str, Any]) -> RenderState:
    """The RenderState in a request's ``scope["state"]`` (put there by the lifespan)."""
    st = state[STATE_KEY]
    assert isinstance(st, RenderState), "the lifespan stores the RenderState under STATE_KEY"
    return st

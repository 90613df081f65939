"""LoRA adapters the router serves: vLLM's registry of names and ids, loaded onto every engine.

An adapter is a model name clients send (``--lora-modules``, or ``POST /v1/load_lora_adapter``)
standing for a ``wire.engine.LoRARequest``: its name, a ``lora_int_id`` (1, 2, ... in load
order; a name reloaded in place keeps its id, an unloaded name's id is never reused, as vLLM's
``OpenAIServingModels`` counts) and its directory as the engines see it. The request carries it
to the engine (``lora_request`` on the EngineCoreRequest); its model name renders with the base
model (an alias in render's registry).

When adapters reach engines: eagerly, on every engine, as vLLM's data-parallel frontend loads
one (``add_lora`` on each engine). A dynamic load calls ``add_lora`` on every ready engine and
answers once they all have; every engine that turns ready (joins, restarts, is re-adopted) gets
every registered adapter. The eager call is also the only check an engine can load the adapter
from its path: an engine that refused one (or runs without ``--enable-lora``) never gets its
requests, since an adapter a vLLM engine fails to load while running a request fails the whole
engine. The router sends ``load_inplace`` on these calls: an engine re-adopted after a router
restart may hold another adapter under the same id.

An engine keeps only ``max_cpu_loras`` adapters loaded (least recently used out) and loads an
evicted one again from ``lora_path`` on its next request. ``holders`` are the engines that hold
an adapter now, as their last ``list_loras`` answer says (asked after each load, and after a
request went to an engine that did not hold its adapter): the policy prefers them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from render.registry import ModelRegistry
from render.service.lora_modules import LoRAModule
from router.link.engine_client import EngineLinkError, UtilityCallError
from router.link.transport import EngineLinks
from serving.errors import (
    APIError,
    InternalServerError,
    InvalidUserInputError,
    NotFoundError,
    ServiceUnavailableError,
)
from wire.engine import EngineReadyResponse, LoRARequest

log = logging.getLogger("kvroute.adapters")

# What a vLLM engine started without --enable-lora answers to the LoRA utilities.
NOT_ENABLED = "LoRA is not enabled"
UTILITY_TIMEOUT = 120.0  # seconds an engine may take to load an adapter from its path


def not_found_message(lora: LoRARequest) -> str:
    """vLLM's LoRAAdapterNotFoundError text, which the engine's failure message contains."""
    return f"Loading lora {lora.lora_name} failed: No adapter found for {lora.lora_path}"


@dataclass(eq=False)
class EngineAdapters:
    """One engine's side: the adapters it loaded for this router, those it holds now."""

    usable: set[int] = field(default_factory=set)  # add_lora succeeded since it turned ready
    held: set[int] = field(default_factory=set)  # its last list_loras answer (and our loads)
    unsupported: bool = False  # started without --enable-lora
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one LoRA call sequence at once
    task: asyncio.Task[None] | None = None  # loading the registry onto it
    refresh: asyncio.Task[None] | None = None  # a list_loras in flight


class Adapters:
    """The served adapters by name, and what each engine loaded (router/routing/adapters.py)."""

    def __init__(self, client: EngineLinks, registry: ModelRegistry,
                 utility_timeout: float = UTILITY_TIMEOUT) -> None:
        self.client = client
        self.registry = registry  # render's: each adapter's name is an alias of its base
        self.utility_timeout = utility_timeout
        self.by_name: dict[str, LoRARequest] = {}
        self._loading: dict[str, LoRARequest] = {}  # dynamic loads under way
        self._ids = itertools.count(1)
        # Loads and unloads one at a time (vLLM locks per name; one lock keeps no state per
        # name a client makes up, and loads are rare).
        self._lock = asyncio.Lock()
        self.engines: dict[str, EngineAdapters] = {}

    # ---- the registry ----

    def get(self, name: str | None) -> LoRARequest | None:
        """The adapter a request's ``model`` names; None for a base model (or no model)."""
        return self.by_name.get(name) if name is not None else None

    def add_static(self, modules: Iterable[LoRAModule]) -> None:
        """``--lora-modules``, in order (ids 1, 2, ...), checked as vLLM checks a load; engines
        get them as they turn ready. Raises ValueError for a module vLLM would refuse."""
        for module in modules:
            problem = self._refusal(module.name, module.path, load_inplace=False)
            if problem is not None:
                raise ValueError(problem.message)
            self._register(self._request(module.name, next(self._ids), module.path,
                                         module.base_model_name, module.is_3d_lora_weight))

    def _request(self, name: str, lora_id: int, path: str, base_model_name: str | None,
                 is_3d: bool) -> LoRARequest:
        # vLLM keeps a base_model_name only when it names a served base model.
        base = base_model_name if base_model_name in self.registry.names() else None
        return LoRARequest(name, lora_id, path, base, False, is_3d)

    def _register(self, lora: LoRARequest) -> None:
        self.by_name[lora.lora_name] = lora
        self.registry.add_alias(lora.lora_name, lora.base_model_name)

    def _refusal(self, name: str, path: str, *, load_inplace: bool) -> APIError | None:
        """vLLM's checks of a load request (``_check_load_lora_adapter_request``)."""
        if not name or not path:
            return InvalidUserInputError("Both 'lora_name' and 'lora_path' must be provided.")
        if name in self.registry.names():
            return InvalidUserInputError(
                f"The lora adapter '{name}' conflicts with a served base model.")
        if not load_inplace and name in self.by_name:
            return InvalidUserInputError(
                f"The lora adapter '{name}' has already been loaded. If you want to load the "
                "adapter in place, set 'load_inplace' to True.")
        return None

    # ---- POST /v1/load_lora_adapter, /v1/unload_lora_adapter ----

    async def load(self, name: str, path: str, *, load_inplace: bool = False,
                   is_3d_lora_weight: bool = False, base_model_name: str | None = None) -> str:
        """Load an adapter onto every ready engine, then serve it; vLLM's answer, or raises
        vLLM's error (400 refused, 404 no adapter at the path, 500 an engine's failure, 503 no
        engine to load it on)."""
        async with self._lock:
            problem = self._refusal(name, path, load_inplace=load_inplace)
            if problem is not None:
                raise problem
            previous = self.by_name.get(name)
            lora_id = previous.lora_int_id if previous is not None else next(self._ids)
            lora = self._request(name, lora_id, path, base_model_name, is_3d_lora_weight)
            self._loading[name] = lora
            try:
                await self._load_everywhere(lora, previous)
            finally:
                self._loading.pop(name, None)
            if previous is not None and previous.lora_path == path:
                log.warning("reloaded LoRA adapter %r in place from the same path: prefix-cache "
                            "blocks computed with its previous weights are not invalidated",
                            name)
            self._register(lora)
            log.info("loaded LoRA adapter", extra={"adapter": name, "path": path,
                                                   "lora_int_id": lora_id})
            return f"Success: LoRA adapter '{name}' added successfully."

    async def _load_everywhere(self, lora: LoRARequest, previous: LoRARequest | None) -> None:
        names = [n for n, e in self.engines.items() if not e.unsupported]
        results = await asyncio.gather(*(self._add(n, lora) for n in names),
                                       return_exceptions=True)
        loaded = [n for n, r in zip(names, results, strict=True) if r is True]
        failed = [r for r in results if isinstance(r, UtilityCallError)]
        bugs = [r for r in results if isinstance(r, BaseException) and r not in failed]
        if bugs:
            raise bugs[0]
        if failed:
            # vLLM answers the first failure; the engines that did load it drop it again (an
            # in-place reload then loads the registered weights from their path on next use).
            await asyncio.gather(*(self._remove(n, lora.lora_int_id) for n in loaded),
                                 return_exceptions=True)
            if previous is not None:
                for n in loaded:
                    if (state := self.engines.get(n)) is not None:
                        state.usable.add(previous.lora_int_id)
            message = str(failed[0])
            if not_found_message(lora) in message:
                raise NotFoundError(not_found_message(lora))
            raise InternalServerError(message)
        if not loaded:
            if any(e.unsupported for e in self.engines.values()):
                raise InternalServerError(
                    "Call to add_lora method failed: LoRA is not enabled on any ready engine: "
                    "start them with --enable-lora.")
            raise ServiceUnavailableError(
                f"No engine is ready to load the LoRA adapter '{lora.lora_name}'; retry later.")
        if previous is not None:
            # Reloaded in place: an engine that did not take the new weights (its link failed)
            # still holds the old ones under the same id; it gets the new ones when it is
            # ready again (engine_ready), not this adapter's requests before.
            for n, e in self.engines.items():
                if n not in loaded:
                    e.usable.discard(lora.lora_int_id)

    async def unload(self, name: str) -> str:
        """Stop serving an adapter and drop it from the engines (requests already on them
        finish: an engine reloads it from its path for them)."""
        async with self._lock:
            if not name:
                raise InvalidUserInputError(
                    "'lora_name' needs to be provided to unload a LoRA adapter.")
            lora = self.by_name.pop(name, None)
            if lora is None:
                raise NotFoundError(f"The lora adapter '{name}' cannot be found.")
            self.registry.remove_alias(name)
            holding = [n for n, e in self.engines.items() if lora.lora_int_id in e.usable]
            await asyncio.gather(*(self._remove(n, lora.lora_int_id) for n in holding),
                                 return_exceptions=True)
            log.info("removed LoRA adapter", extra={"adapter": name})
            return f"Success: LoRA adapter '{name}' removed successfully."

    # ---- engine calls ----

    async def _add(self, engine: str, lora: LoRARequest) -> bool:
        """``add_lora`` on one engine (load_inplace: see the module docstring); True if it
        loaded it, False if the engine is gone or runs without LoRA; raises UtilityCallError
        for an adapter it refused."""
        state = self.engines.get(engine)
        if state is None or state.unsupported:
            return False
        on_engine = LoRARequest(lora.lora_name, lora.lora_int_id, lora.lora_path,
                                lora.base_model_name, True, lora.is_3d_lora_weight)
        async with state.lock:
            try:
                await self.client.call_utility(engine, "add_lora", on_engine,
                                               timeout=self.utility_timeout)
            except UtilityCallError as exc:
                if NOT_ENABLED in str(exc):
                    state.unsupported = True
                    log.info("engine runs without LoRA", extra={"engine": engine})
                    return False
                raise  # it still holds what it held (vLLM loads the new weights first)
            except (EngineLinkError, TimeoutError) as exc:
                log.warning("could not load a LoRA adapter onto an engine", extra={
                    "engine": engine, "adapter": lora.lora_name, "error": str(exc)})
                return False
            state.usable.add(lora.lora_int_id)
            state.held.add(lora.lora_int_id)
            await self._list(engine, state)
        return True

    async def _remove(self, engine: str, lora_id: int) -> None:
        state = self.engines.get(engine)
        if state is None:
            return
        state.usable.discard(lora_id)
        async with state.lock:
            with contextlib.suppress(EngineLinkError, TimeoutError):
                await self.client.call_utility(engine, "remove_lora", lora_id,
                                               timeout=self.utility_timeout)
            state.held.discard(lora_id)

    async def _list(self, engine: str, state: EngineAdapters) -> None:
        """Refresh what the engine holds (its LRU may have let others go)."""
        with contextlib.suppress(EngineLinkError, TimeoutError):
            ids = await self.client.call_utility(engine, "list_loras",
                                                 timeout=self.utility_timeout)
            if isinstance(ids, list) and self.engines.get(engine) is state:
                state.held = {i for i in ids if isinstance(i, int)}

    # ---- engines come and go (Fleet) ----

    def engine_ready(self, engine: str, ready: EngineReadyResponse | None) -> None:
        """An engine turned ready (first time, restarted, or re-adopted: ``ready`` None): load
        every adapter onto it, in the background."""
        self.engine_gone(engine)
        state = self.engines[engine] = EngineAdapters()
        if ready is not None and not ready.supports_lora:
            state.unsupported = True
            return
        if self.by_name or self._loading:
            state.task = asyncio.get_running_loop().create_task(
                self._load_all(engine, state), name=f"lora-load-{engine}")

    async def _load_all(self, engine: str, state: EngineAdapters) -> None:
        for lora in [*self.by_name.values(), *self._loading.values()]:
            if self.engines.get(engine) is not state or state.unsupported:
                return
            try:
                await self._add(engine, lora)
            except UtilityCallError as exc:
                log.error("an engine cannot load a LoRA adapter: its requests go elsewhere",
                          extra={"engine": engine, "adapter": lora.lora_name,
                                 "error": str(exc)})

    def engine_gone(self, engine: str) -> None:
        state = self.engines.pop(engine, None)
        if state is not None:
            for task in (state.task, state.refresh):
                if task is not None:
                    task.cancel()

    # ---- routing ----

    def usable(self, lora: LoRARequest) -> frozenset[str]:
        """Engines that loaded ``lora`` for this router: the only ones its requests may go to."""
        lid = lora.lora_int_id
        return frozenset(n for n, e in self.engines.items() if lid in e.usable)

    def holders(self, lora: LoRARequest) -> frozenset[str]:
        """Engines holding ``lora`` loaded now (no load before its request starts)."""
        lid = lora.lora_int_id
        return frozenset(n for n, e in self.engines.items() if lid in e.usable and lid in e.held)

    def routed(self, engine: str, lora: LoRARequest) -> None:
        """A request with ``lora`` went to ``engine``: it holds the adapter now (it loaded it
        for the request if it had let it go, perhaps letting another go: asked once more)."""
        state = self.engines.get(engine)
        if state is None or lora.lora_int_id in state.held:
            return
        state.held.add(lora.lora_int_id)
        if state.refresh is None or state.refresh.done():
            state.refresh = asyncio.get_running_loop().create_task(
                self._list(engine, state), name=f"lora-list-{engine}")

    async def close(self) -> None:
        tasks = [t for e in self.engines.values() for t in (e.task, e.refresh) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.engines.clear()

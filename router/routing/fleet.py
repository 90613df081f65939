"""The engine fleet: engines join (config or run time), turn ready, die; index and KV feeds."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from radix import PrefixIndex
from router.config import EngineSpec
from router.kvfeed.kv_subscriber import KVEndpoints, KVSubscriber
from router.link.engine_state import EngineStatus
from router.link.transport import EngineLinks
from router.routing.adapters import Adapters
from router.routing.admission import Admission
from router.routing.engine_memory import EngineMemory

log = logging.getLogger("kvroute.fleet")


class Fleet:
    """Keeps the prefix index and the KV subscriptions in step with the engines' health."""

    def __init__(self, client: EngineLinks, kv: KVSubscriber, index: PrefixIndex,
                 admission: Admission, specs: Iterable[EngineSpec], poll: float = 0.25,
                 max_model_len: int | None = None,
                 on_context: Callable[[int], None] | None = None,
                 adapters: Adapters | None = None,
                 memory: EngineMemory | None = None) -> None:
        self.client = client
        # The LoRA adapters, loaded onto each engine as it turns ready.
        self.adapters = adapters
        # The engines' ready maps kept across router restarts (None: not kept).
        self.memory = memory or EngineMemory(None)
        # The context length the router may admit prompts to at most (the model's, or the
        # configured one); the engines' own lengths lower it (``context``).
        self.max_model_len = max_model_len
        # Told the context every engine can take whenever the ready engines change (None: the
        # router's is configured, and kept).
        self.on_context = on_context
        self.context: int | None = max_model_len
        self.kv = kv
        self.index = index
        self.admission = admission
        self.specs = {spec.name: spec for spec in specs}
        self.poll = poll
        self.attached: set[str] = set()
        self.subscribed: set[str] = set()
        # The client's connect count per attached engine: a rise while it stayed READY between two
        # polls is a process restart (an idle engine killed and restarted fast).
        self.connects: dict[str, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # replays under way

    def join(self, spec: EngineSpec) -> str:
        """Add an engine at run time; returns the handshake address to start it against (an
        HTTP engine's URL)."""
        self.specs[spec.name] = spec
        self.client.add_engine(spec)
        address = self.client.endpoint(spec.name)
        log.info("engine joined", extra={"engine": spec.name, "address": address})
        return address

    async def remove(self, name: str) -> None:
        """Unlink an engine for good: its sockets close, its blocks and KV feed go (requests
        still on it fail: drain it first)."""
        self.specs.pop(name, None)
        if self.adapters is not None:
            self.adapters.engine_gone(name)
        await self.client.remove_engine(name)
        self.connects.pop(name, None)
        if name in self.attached:
            self.attached.discard(name)
            self._update_context()
            self.index.remove_engine(name)
        if name in self.subscribed:
            self.subscribed.discard(name)
            await self.kv.remove_engine(name)
        self.admission.wake()
        log.info("engine removed", extra={"engine": name})

    async def watch(self) -> None:
        """Follow engine status changes for the life of the app."""
        while True:
            self.sync()
            await asyncio.sleep(self.poll)

    def sync(self) -> None:
        for name, eng in self.client.engines.items():
            ready = eng.status is EngineStatus.READY
            if ready and name in self.attached and eng.counters.connects != self.connects[name]:
                self._restarted(name)
            if ready and name not in self.attached:
                self._attach(name)
            elif not ready and name in self.attached:
                self._detach(name, eng.death_reason or eng.status.value)

    def _attach(self, name: str) -> None:
        eng = self.client.engines[name]
        spec = self.specs.get(name)
        info = eng.ready
        if spec is not None:
            if info is not None:
                self.memory.remember(spec, info)
            elif eng.adopted:
                # Re-adopted after a router restart: no handshake, so what it said last time.
                info = self.memory.recall(spec)
        block_size = info.block_size if info is not None and info.block_size else None
        if block_size is None and spec is not None:
            block_size = spec.block_size  # re-adopted: no ready map this time
        self.attached.add(name)
        self.connects[name] = eng.counters.connects
        # A pod's block size comes with its first KV event (the index learns it then).
        if block_size is not None or (spec is not None and spec.is_http):
            self.index.add_engine(name, block_size)
            endpoints = self._kv_endpoints(name, spec, info.kv_events_config if info else None)
            if endpoints is not None and name not in self.subscribed:
                self.kv.add_engine(endpoints)
                self.subscribed.add(name)
                # What the engine cached before we subscribed (a pod re-added, a router
                # restarted) comes from its replay buffer now, not at its next event.
                self._background(self._replay(name))
        if self.adapters is not None:
            self.adapters.engine_ready(name, info)
        engine_len = info.max_model_len if info is not None else None
        log.info("engine ready", extra={"engine": name, "block_size": block_size,
                                        "max_model_len": engine_len, "adopted": eng.adopted,
                                        "kv_events": name in self.subscribed})
        if (self.on_context is None and engine_len and self.max_model_len
                and engine_len < self.max_model_len):
            # A configured context the engine cannot hold: prompts the router admits between
            # the two fail on the engine.
            log.warning("engine max_model_len is below the router's --max-model-len",
                        extra={"engine": name, "max_model_len": engine_len,
                               "router_max_model_len": self.max_model_len})
        self._update_context()
        self.admission.wake()

    def _update_context(self) -> None:
        """The context every ready engine can take (an engine's ready response says its own;
        an engine re-adopted without one counts as the router's), capped by the router's:
        what render admits, so no prompt reaches an engine that cannot hold it."""
        lens = [self.max_model_len] if self.max_model_len else []
        for name in self.attached:
            info = self.client.engines[name].ready if name in self.client.engines else None
            spec = self.specs.get(name)
            if info is not None and info.max_model_len > 0:
                lens.append(info.max_model_len)
            elif spec is not None and spec.max_model_len:  # re-adopted: as configured
                lens.append(spec.max_model_len)
        context = min(lens) if lens else None
        if self.on_context is not None and context is not None and context != self.context:
            log.info("context length", extra={"max_model_len": context})
            self.context = context
            if self.on_context is not None:
                self.on_context(context)

    def _restarted(self, name: str) -> None:
        eng = self.client.engines[name]
        self.connects[name] = eng.counters.connects
        log.warning("engine reconnected: rebuilding its index", extra={"engine": name})
        if self.adapters is not None:
            # A new process holds no adapter: load them again.
            self.adapters.engine_ready(name, eng.ready)
        if name in self.subscribed:
            # Clears the old process's blocks and replays the new one's buffer.
            asyncio.get_running_loop().create_task(self.kv.engine_restarted(name))

    def _detach(self, name: str, why: str) -> None:
        self.attached.discard(name)
        self._update_context()
        if self.adapters is not None:
            self.adapters.engine_gone(name)
        # Whatever it cached is gone with it; a restarted engine re-announces its blocks.
        self.index.remove_engine(name)
        log.warning("engine unavailable", extra={"engine": name, "reason": why})
        if name in self.subscribed:
            self.subscribed.discard(name)
            asyncio.get_running_loop().create_task(self.kv.remove_engine(name))

    def _kv_endpoints(self, name: str, spec: EngineSpec | None,
                      config: dict[str, object] | None) -> KVEndpoints | None:
        host = spec.kv_host if spec else "127.0.0.1"
        if spec is not None and spec.kv_events:
            return KVEndpoints(engine=name, endpoint=spec.kv_events, replay_endpoint=spec.replay,
                               topic=spec.topic, host=host)
        if config and config.get("enable_kv_cache_events") and config.get("publisher",
                                                                           "zmq") == "zmq":
            return KVEndpoints.from_config(name, dict(config), host=host)
        return None

    async def _replay(self, name: str) -> None:
        try:
            await self.kv.resync(name)
        except KeyError:
            pass  # removed meanwhile
        except Exception:
            log.warning("engine KV replay failed; its index fills from live events",
                        extra={"engine": name}, exc_info=True)

    def _background(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def kv_snapshot(self) -> dict[str, dict[str, float]]:
        out = {}
        for name in self.subscribed:
            c = self.kv.counters(name)
            out[name] = {"kv_event_lag_seconds": c.lag, "kv_event_batches": float(c.batches),
                         "kv_event_gaps": float(c.gaps), "kv_event_replays": float(c.replays),
                         "kv_event_decode_errors": float(c.decode_errors),
                         "kv_event_lost_batches": float(c.lost_batches),
                         "kv_event_superseded_batches": float(c.superseded_batches)}
        return out

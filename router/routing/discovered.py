"""Engines found by discovery join the fleet; those that leave are drained, then removed.

The reconciler keeps what discovery says now (``wanted``: name -> endpoint, from its stream of
changes) and makes the fleet match it, level-triggered: after every change it compares the
whole wanted set with the engines it runs, so the order and grouping of changes never matter.

- A ready endpoint with no engine joins the fleet (``Fleet.join``), named after it (a name
  taken, e.g. by an engine still draining under it, gets ``~2``, ``~3``, ...). Its index is
  built from its own KV events, replay first, as for any engine that turns ready.
- An engine whose endpoint left, turned not ready, or moved to another URL is drained: no new
  request goes to it, its running ones finish (``drain_timeout``), then it is removed
  (router/routing/drain.py, the same drain-then-remove as ``DELETE /admin/engines/NAME``).
- A moved endpoint (a pod recreated with another IP) is a new engine at the new URL, joined at
  once, while the old one drains: the two are different processes with different KV caches,
  and the streams running on the old address finish there. Re-pointing one engine instead
  would credit the old process's cache to the new one and cut the old streams.
- An endpoint that turns ready again while its engine still drains at the same URL takes the
  engine back (drain cancelled, index kept): a readiness flap costs nothing. Once removed, it
  joins anew and its index is rebuilt from the engine's replay.
- ``control.max_engines`` caps the fleet: endpoints beyond it wait (logged) and join when an
  engine is removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Container
from dataclasses import dataclass, field

from discovery.endpoints import Change, ChangeKind, Endpoint, Source, apply, batches
from router.config import EngineSpec
from router.routing.drain import Drains, Removal
from router.routing.fleet import Fleet

log = logging.getLogger("kvroute.discovery")

SpecFor = Callable[[str, Endpoint], EngineSpec]  # (engine name, endpoint) -> its spec
RESTART_DELAY = 1.0


def http_spec(engine: str, endpoint: Endpoint) -> EngineSpec:
    """A discovered engine is a `vllm serve` pod: reached at its URL over HTTP, its KV events
    found through its ``/kv_event_sources``."""
    return EngineSpec(engine, url=endpoint.url)


@dataclass(frozen=True, slots=True)
class Incarnation:
    """An endpoint's engine in the fleet: the fleet's name for it and the URL it joined at."""

    engine: str
    url: str


@dataclass
class DiscoveryCounters:
    changes: int = 0
    joins: int = 0
    drains: int = 0
    taken_back: int = 0  # drains cancelled: ready again at the same URL
    removed: int = 0
    held_back: set[str] = field(default_factory=set)  # waiting for room under max_engines


class Reconciler:
    """Applies one discovery source to the fleet for the life of the app."""

    def __init__(self, fleet: Fleet, drains: Drains, spec_for: SpecFor, *,
                 drain_timeout: float, max_engines: int) -> None:
        self.fleet = fleet
        self.drains = drains
        self.spec_for = spec_for
        self.drain_timeout = drain_timeout
        self.max_engines = max_engines
        self.wanted: dict[str, Endpoint] = {}  # what discovery says now, by endpoint name
        self.live: dict[str, Incarnation] = {}  # the serving engine of each endpoint
        self.leaving: dict[tuple[str, str], Incarnation] = {}  # (name, url) -> draining
        self.counters = DiscoveryCounters()

    async def run(self, source: Source) -> None:
        """Follow the source for the life of the app. A failure here is a bug: it is logged
        and the source followed afresh (its first snapshot is the whole set again)."""
        while True:
            self.wanted = {}
            try:
                async with contextlib.aclosing(batches(source)) as stream:
                    async for batch in stream:
                        for change in batch:
                            self.counters.changes += 1
                            _log_change(change)
                            apply(self.wanted, change)
                        self.reconcile()
            except Exception:
                log.exception("discovery failed; following the source afresh")
            await asyncio.sleep(RESTART_DELAY)

    def snapshot(self) -> dict[str, float]:
        """For /metrics (router/obs/metrics.py, ``watch_discovery``)."""
        c = self.counters
        return {"discovery_endpoints": float(len(self.wanted)),
                "discovery_ready_endpoints": float(sum(e.ready for e in self.wanted.values())),
                "discovery_engines": float(len(self.live)),
                "discovery_draining": float(len(self.leaving)),
                "discovery_held_back": float(len(c.held_back)),
                "discovery_changes": float(c.changes), "discovery_joins": float(c.joins),
                "discovery_drains": float(c.drains), "discovery_taken_back": float(c.taken_back),
                "discovery_removals": float(c.removed)}

    def engines(self) -> dict[str, Incarnation]:
        """The serving engine of each endpoint (draining ones excluded)."""
        return dict(self.live)

    def reconcile(self) -> None:
        linked = self.fleet.client.engines
        for name, inc in list(self.live.items()):
            endpoint = self.wanted.get(name)
            if inc.engine not in linked:
                del self.live[name]  # removed by hand (DELETE /admin/engines/NAME)
            elif endpoint is None or not endpoint.ready or endpoint.url != inc.url:
                del self.live[name]
                self._leave(name, inc, "gone" if endpoint is None else
                            "not ready" if endpoint.ready is False else "moved")
        for name in sorted(self.wanted):
            endpoint = self.wanted[name]
            if endpoint.ready and name not in self.live:
                self._arrive(name, endpoint)

    def _arrive(self, name: str, endpoint: Endpoint) -> None:
        back = self.leaving.get((name, endpoint.url))
        if back is not None and self.drains.cancel(back.engine):
            del self.leaving[(name, endpoint.url)]
            self.live[name] = back
            self.counters.taken_back += 1
            return
        linked = self.fleet.client.engines
        if len(linked) >= self.max_engines:
            if name not in self.counters.held_back:
                self.counters.held_back.add(name)
                log.warning("discovered engine waits: the fleet has control.max_engines "
                            "engines", extra={"endpoint": name, "url": endpoint.url,
                                              "max_engines": self.max_engines})
            return
        self.counters.held_back.discard(name)
        # A name is taken until its engine's removal has finished: the fleet unlinks it first,
        # then drops its KV feed.
        engine = _free_name(name, linked.keys() | self.drains.tasks.keys())
        # Tracked before it joins: an engine linked by a join that then failed is still ours
        # (drained when it leaves), and one not linked is tried again at the next reconcile.
        self.live[name] = Incarnation(engine, endpoint.url)
        try:
            self.fleet.join(self.spec_for(engine, endpoint))
        except Exception:
            log.exception("discovered engine could not join", extra={
                "endpoint": name, "engine": engine, "url": endpoint.url})
            if engine not in linked:
                del self.live[name]
            return
        self.counters.joins += 1
        log.info("discovered engine joins", extra={"endpoint": name, "engine": engine,
                                                   "url": endpoint.url})

    def _leave(self, name: str, inc: Incarnation, why: str) -> None:
        self.counters.drains += 1
        log.info("discovered engine leaves: draining", extra={
            "endpoint": name, "engine": inc.engine, "url": inc.url, "reason": why})
        self.leaving[(name, inc.url)] = inc
        task = self.drains.start(inc.engine, self.drain_timeout)
        task.add_done_callback(lambda done: self._removed(name, inc, done))

    def _removed(self, name: str, inc: Incarnation, task: asyncio.Task[Removal]) -> None:
        if self.leaving.get((name, inc.url)) is inc:
            del self.leaving[(name, inc.url)]
        if task.cancelled() or task.exception() is not None:
            return  # taken back, or the app is stopping (the failure is logged by Drains)
        removal = task.result()
        self.counters.removed += 1
        log.info("discovered engine removed", extra={
            "endpoint": name, "engine": inc.engine, "drained": removal.drained,
            "cut": removal.cut})
        self.reconcile()  # room for an endpoint held back by max_engines, or a name freed


def _free_name(name: str, taken: Container[str]) -> str:
    """``name``, or ``name~2``, ``name~3``, ... whichever is not an engine's name yet."""
    if name not in taken:
        return name
    n = 2
    while f"{name}~{n}" in taken:
        n += 1
    return f"{name}~{n}"


def _log_change(change: Change) -> None:
    ep = change.endpoint
    if change.kind is ChangeKind.UPDATED and change.previous is not None:
        log.info("discovery: endpoint changed", extra={
            "endpoint": ep.name, "url": ep.url, "ready": ep.ready,
            "was_url": change.previous.url, "was_ready": change.previous.ready})
    else:
        log.info(f"discovery: endpoint {change.kind.value}",
                 extra={"endpoint": ep.name, "url": ep.url, "ready": ep.ready})

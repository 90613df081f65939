"""What discovery finds: endpoints (name, base URL, ready), and the changes between two engine sets.

A source (static list, DNS, Kubernetes pods) yields the whole engine set it sees each time that
set may have changed: a snapshot. ``changes`` diffs consecutive snapshots into typed changes, so a
source that sees the same set twice (a relist after a dropped watch, a DNS answer that did not
move) yields nothing, and one that misses an event in between still converges on the next
snapshot: no engine is lost or announced twice.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One engine a source found: a name stable across its changes, where it answers, and
    whether it takes requests now (a Kubernetes pod's Ready condition; DNS and static: always)."""

    name: str
    url: str  # base URL, http://HOST:PORT (IPv6 hosts in brackets), no trailing slash
    ready: bool = True


EngineSet = Mapping[str, Endpoint]  # by name


class ChangeKind(enum.Enum):
    JOINED = "joined"  # a name not seen before (or seen, then gone)
    UPDATED = "updated"  # same name, another URL or readiness
    LEFT = "left"  # the name is gone (pod deleted, record withdrawn)


@dataclass(frozen=True, slots=True)
class Change:
    kind: ChangeKind
    endpoint: Endpoint  # the state now; for LEFT, the last state seen
    previous: Endpoint | None = None  # UPDATED: the state before


class Source(Protocol):
    """Yields the complete engine set each time it may have changed, for as long as it runs.
    A source that cannot reach its backend keeps quiet (and retries): silence never empties
    the set, only a successful answer does."""

    def snapshots(self) -> AsyncGenerator[EngineSet, None]: ...


def diff(before: EngineSet, after: EngineSet) -> list[Change]:
    """The changes from ``before`` to ``after``: departures first (they free room), then
    updates, then arrivals, each by name."""
    left = [Change(ChangeKind.LEFT, before[n]) for n in sorted(before.keys() - after.keys())]
    updated = [Change(ChangeKind.UPDATED, after[n], before[n])
               for n in sorted(before.keys() & after.keys()) if before[n] != after[n]]
    joined = [Change(ChangeKind.JOINED, after[n]) for n in sorted(after.keys() - before.keys())]
    return left + updated + joined


def apply(engines: dict[str, Endpoint], change: Change) -> None:
    """Apply one change to an engine set (what a consumer of ``changes`` keeps)."""
    if change.kind is ChangeKind.LEFT:
        del engines[change.endpoint.name]
    else:
        engines[change.endpoint.name] = change.endpoint


async def batches(source: Source) -> AsyncGenerator[list[Change], None]:
    """The source's snapshots as changes, starting from the empty set: one non-empty batch per
    snapshot that differs from the one before (a relist's changes come together)."""
    seen: dict[str, Endpoint] = {}
    async with contextlib.aclosing(source.snapshots()) as snapshots:
        async for snapshot in snapshots:
            current = dict(snapshot)
            batch = diff(seen, current)
            seen = current
            if batch:
                yield batch


async def changes(source: Source) -> AsyncGenerator[Change, None]:
    """The source's snapshots as changes, one by one."""
    async with contextlib.aclosing(batches(source)) as stream:
        async for batch in stream:
            for change in batch:
                yield change


def base_url(scheme: str, host: str, port: int) -> str:
    """``scheme://host:port``, an IPv6 host in brackets."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}"

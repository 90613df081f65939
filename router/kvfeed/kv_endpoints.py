"""Where an engine publishes KV events, and vLLM's rule for who binds and who connects.

vLLM's PUB binds wildcard (``*`` / ``::``), ipc and inproc endpoints and connects to anything
else; the subscriber does the opposite. Replay endpoints are always bound by the engine. For DP
rank r, TCP ports are offset by +r (inproc gets a ``_dp{r}`` suffix).
"""

from __future__ import annotations

from typing import Any

import msgspec


class KVEndpoints(msgspec.Struct, frozen=True):
    """Where one engine publishes, as configured on the engine (``--kv-events-config``)."""

    engine: str
    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""
    # Host to dial when the engine binds a wildcard address.
    host: str = "127.0.0.1"
    dp_rank: int = 0

    @classmethod
    def from_config(
        cls, engine: str, config: dict[str, Any], *, host: str = "127.0.0.1", dp_rank: int = 0
    ) -> KVEndpoints:
        """From the ``kv_events_config`` map of the engine's ready response."""
        return cls(
            engine=engine,
            endpoint=str(config.get("endpoint") or "tcp://*:5557"),
            replay_endpoint=config.get("replay_endpoint"),
            topic=str(config.get("topic") or ""),
            host=host,
            dp_rank=dp_rank,
        )


def engine_binds(endpoint: str) -> bool:
    """vLLM's ``ZmqEventPublisher._is_bind_endpoint``."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def offset_endpoint(endpoint: str, dp_rank: int) -> str:
    """vLLM's per-DP-rank endpoint offset (TCP port + rank, inproc suffix)."""
    if dp_rank == 0:
        return endpoint
    if "inproc" in endpoint:
        return f"{endpoint}_dp{dp_rank}"
    if "tcp" in endpoint and ":" in endpoint:
        base, port = endpoint.rsplit(":", 1)
        return endpoint if int(port) == 0 else f"{base}:{int(port) + dp_rank}"
    return endpoint


def dial_address(endpoint: str, host: str) -> str:
    """The address to connect to for an endpoint the engine binds."""
    if endpoint.startswith("tcp://"):
        bound_host, port = endpoint[len("tcp://") :].rsplit(":", 1)
        if bound_host in ("*", "0.0.0.0", "::", "[::]"):
            return f"tcp://{host}:{port}"
    return endpoint

"""Router configuration: flags and an optional TOML/JSON file, parsed once into frozen objects."""

from __future__ import annotations

import argparse
import json
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from render.asgi_server import DEFAULT_SERVER, SERVERS
from render.models import EMBEDDED_MODEL
from router.policy import POLICIES, PolicyConfig


class ConfigError(ValueError):
    """A configuration the operator must fix; the message names the offending key."""


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """One headless engine: the handshake address the router binds and its KV-event endpoints."""

    name: str
    handshake: str  # tcp://HOST:PORT = the engine's --data-parallel-address : rpc-port
    kv_events: str | None = None  # the engine's kv-events-config endpoint
    replay: str | None = None  # the engine's kv-events-config replay_endpoint
    topic: str = ""
    # Where the router binds the engine's input/output sockets (default: next to the handshake,
    # kernel-chosen ports). Fix them to re-adopt running engines after a router restart.
    input: str | None = None
    output: str | None = None
    # The host the engine is told to dial when those sockets bind a wildcard (a Service name in
    # Kubernetes); default loopback.
    advertise_host: str | None = None
    # The engine's KV block size, for engines re-adopted without a handshake (no ready map).
    block_size: int | None = None

    @property
    def input_address(self) -> str:
        """The input socket's bind address: ``input``, else beside the handshake."""
        return self.input or self._beside(".in")

    @property
    def output_address(self) -> str:
        """The output socket's bind address: ``output``, else beside the handshake."""
        return self.output or self._beside(".out")

    def _beside(self, suffix: str) -> str:
        # Same host as the handshake, a kernel-chosen port (a TCP port 0 is resolved at bind time).
        if self.handshake.startswith("ipc://"):
            return self.handshake + suffix
        return self.handshake.rsplit(":", 1)[0] + ":0"


@dataclass(frozen=True, slots=True)
class Limits:
    max_in_flight_per_engine: int = 256
    max_queue: int = 1024  # requests waiting for an engine slot before 503
    queue_timeout: float = 30.0  # seconds a request may wait for a slot before 503
    retry_after: int = 1  # seconds, for 429/503 answers
    max_body_bytes: int = 16 * 1024 * 1024
    drain_timeout: float = 30.0  # graceful shutdown: streams get this long to finish
    max_index_blocks: int = 4_000_000  # radix cap across engines (LRU beyond it)
    # An engine silent this long while it has requests is dead (its streams end with an error).
    engine_dead_after: float = 30.0


@dataclass(frozen=True, slots=True)
class RouterConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    model: str = str(EMBEDDED_MODEL)
    served_model_name: str | None = None
    tokenizer: str | None = None
    chat_template: str | None = None
    max_model_len: int | None = None
    render_url: str | None = None  # remote render service instead of the in-process Renderer
    engines: tuple[EngineSpec, ...] = ()
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    limits: Limits = field(default_factory=Limits)
    api_key: str | None = None
    log_json: bool = True
    log_level: str = "INFO"
    # The HTTP server: "hypercorn" (h11) or "uvicorn" (httptools, less CPU per request); see
    # render/asgi_server.py.
    http_server: str = DEFAULT_SERVER

    def __post_init__(self) -> None:
        if self.http_server not in SERVERS:
            raise ValueError(f"http_server must be one of {SERVERS}, got {self.http_server!r}")


def _build(cls: type[Any], data: dict[str, Any], where: str) -> Any:
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {sorted(known)}")
    try:
        return cls(**data)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def load_file(path: str) -> dict[str, Any]:
    """Read a .toml or .json config file into a plain dict (router keys at the top level)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    try:
        data = json.loads(text) if p.suffix == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"config file {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: the top level must be a table/object")
    return data


def from_mapping(data: dict[str, Any]) -> RouterConfig:
    """Build the frozen config from a dict shaped like the config file."""
    data = dict(data)
    engines = data.pop("engines", [])
    if not isinstance(engines, list):
        raise ConfigError("engines: expected a list of tables")
    specs = []
    for i, engine in enumerate(engines):
        if not isinstance(engine, dict):
            raise ConfigError(f"engines[{i}]: expected a table")
        specs.append(_build(EngineSpec, {"name": f"engine-{i}", **engine}, f"engines[{i}]"))
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise ConfigError(f"engines: duplicate names in {names}")
    policy = _build(PolicyConfig, data.pop("policy", {}), "policy")
    limits = _build(Limits, data.pop("limits", {}), "limits")
    return _build(  # type: ignore[no-any-return]
        RouterConfig,
        {**data, "engines": tuple(specs), "policy": policy, "limits": limits},
        "router",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="TOML or JSON file; flags given here override it")
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--model", help="model dir for the in-process render (default: embedded)")
    parser.add_argument("--served-model-name")
    parser.add_argument("--tokenizer")
    parser.add_argument("--chat-template")
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--render-url", help="use a remote `kvroute render` service")
    parser.add_argument(
        "--engine",
        action="append",
        default=[],
        metavar="NAME=tcp://HOST:PORT[,kv=ENDPOINT][,replay=ENDPOINT]",
        help="a headless engine's handshake address (repeatable)",
    )
    parser.add_argument("--policy", choices=POLICIES)
    parser.add_argument("--load-weight", type=float)
    parser.add_argument("--request-tokens", type=float)
    parser.add_argument("--cache-threshold", type=float)
    parser.add_argument("--balance-abs-threshold", type=int)
    parser.add_argument("--balance-rel-threshold", type=float)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--max-in-flight-per-engine", type=int)
    parser.add_argument("--max-queue", type=int)
    parser.add_argument("--max-body-bytes", type=int)
    parser.add_argument("--api-key", help="require `Authorization: Bearer KEY` on public endpoints")
    parser.add_argument("--log-level")
    parser.add_argument("--plain-logs", action="store_true", help="text logs instead of JSON")
    parser.add_argument("--http-server", choices=SERVERS,
                        help=f"HTTP server (default {DEFAULT_SERVER}; uvicorn: httptools, "
                             "less CPU per request)")


def parse_engine_flag(value: str, index: int) -> dict[str, Any]:
    """``name=tcp://h:p,kv=tcp://h:p2,replay=tcp://h:p3`` (name optional)."""
    head, *opts = value.split(",")
    name, sep, address = head.partition("=")
    spec: dict[str, Any] = {"name": name, "handshake": address} if sep and "://" not in name else {
        "name": f"engine-{index}", "handshake": head}
    for opt in opts:
        key, sep, val = opt.partition("=")
        if not sep or key not in ("kv", "replay", "topic", "input", "output", "block_size"):
            raise ConfigError(f"--engine {value!r}: options are kv=, replay=, topic=, input=, "
                              "output=, block_size=")
        if key == "block_size":
            if not val.isdigit():
                raise ConfigError(f"--engine {value!r}: block_size must be an integer")
            spec[key] = int(val)
        else:
            spec[{"kv": "kv_events"}.get(key, key)] = val
    return spec


def from_args(args: argparse.Namespace) -> RouterConfig:
    data: dict[str, Any] = load_file(args.config) if args.config else {}
    for key in ("host", "port", "model", "served_model_name", "tokenizer", "chat_template",
                "max_model_len", "render_url", "api_key", "log_level",
                "http_server"):
        if getattr(args, key) is not None:
            data[key] = getattr(args, key)
    if args.plain_logs:
        data["log_json"] = False
    if args.engine:
        data["engines"] = [parse_engine_flag(v, i) for i, v in enumerate(args.engine)]
    policy = dict(data.get("policy", {}))
    for flag, key in (("policy", "name"), ("load_weight", "load_weight"),
                      ("request_tokens", "request_tokens"), ("cache_threshold", "cache_threshold"),
                      ("balance_abs_threshold", "balance_abs_threshold"),
                      ("balance_rel_threshold", "balance_rel_threshold"), ("seed", "seed")):
        if getattr(args, flag) is not None:
            policy[key] = getattr(args, flag)
    data["policy"] = policy
    limits = dict(data.get("limits", {}))
    for key in ("max_in_flight_per_engine", "max_queue", "max_body_bytes"):
        if getattr(args, key) is not None:
            limits[key] = getattr(args, key)
    data["limits"] = limits
    return from_mapping(data)

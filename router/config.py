"""Router configuration: flags and an optional TOML/JSON file, parsed once into frozen objects."""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from discovery.options import KINDS, SourceOptions
from output.parsers.registry import check_names
from render.models import EMBEDDED_MODEL
from render.sampling_checks import MAX_N, RequestLimits
from render.service.lora_modules import LoRAModule, lora_modules
from render.structured_config import (
    StructuredOutputsConfig,
    add_structured_outputs_arguments,
    structured_outputs_config,
)
from router.routing.policy import POLICIES, PolicyConfig
from serving.server import ROUTER_SERVER, SERVERS

# vLLM's switch for POST /v1/load_lora_adapter and /v1/unload_lora_adapter.
RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


def _tcp_host(address: str) -> str:
    """``tcp://HOST:PORT`` -> HOST (brackets of an IPv6 literal removed)."""
    return address[len("tcp://"):].rsplit(":", 1)[0].strip("[]")


def _tcp_port(address: str) -> int:
    port = address.rsplit(":", 1)[1]
    return int(port) if port.isdigit() else 0


def _wildcard(host: str) -> bool:
    return host in ("*", "0.0.0.0", "::")


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


class ConfigError(ValueError):
    """A configuration the operator must fix; the message names the offending key."""


HTTP_SCHEMES = ("http://", "https://")
# A ZMQ engine's default input and output ports: its handshake port plus these (the chart lays
# out its engine slots the same way).
INPUT_PORT_OFFSET = 1000
OUTPUT_PORT_OFFSET = 2000


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """One engine, of either transport: a headless engine's handshake address the router binds
    (ZMQ), or the base URL of a `vllm serve` pod (HTTP, ``url``); and its KV-event endpoints
    (for a pod, found through its ``/kv_event_sources`` unless given here)."""

    name: str
    handshake: str = ""  # tcp://HOST:PORT = the engine's --data-parallel-address : rpc-port
    kv_events: str | None = None  # the engine's kv-events-config endpoint
    replay: str | None = None  # the engine's kv-events-config replay_endpoint
    topic: str = ""
    # Where the router binds the engine's input/output sockets (default: next to the handshake,
    # kernel-chosen ports). Fix them to re-adopt running engines after a router restart; a
    # wildcard host here (tcp://0.0.0.0:P) binds every interface, as asked.
    input: str | None = None
    output: str | None = None
    # The host the engine is told to dial when those sockets bind a wildcard (a Service name in
    # Kubernetes); default loopback.
    advertise_host: str | None = None
    # The engine's KV block size, for engines re-adopted without a handshake (no ready map);
    # a pod's is learned from its first KV event unless given.
    block_size: int | None = None
    # Its context length, for an engine re-adopted without a handshake (no ready map says it).
    max_model_len: int | None = None
    # http(s)://HOST:PORT of a `vllm serve --enable-scale-out` pod: an engine over HTTP.
    url: str | None = None
    # Other routers' input and output addresses for this ZMQ engine, handed to it in the
    # handshake after this router's own (vLLM's multi-frontend lists, as --api-server-count
    # fills them): the i-th pair is the router started with link.client_index = i + 1.
    peer_inputs: tuple[str, ...] = ()
    peer_outputs: tuple[str, ...] = ()
    # The interface (an IP address) the default input/output sockets bind when the handshake
    # binds a wildcard; default: advertise_host when it is an IP address, else loopback.
    bind_host: str | None = None

    def __post_init__(self) -> None:
        # A ZMQ engine linked by a peer router (one the owner of its handshake lists) has no
        # handshake of its own here: its fixed input and output addresses are enough.
        peer_linked = not self.handshake and self.input is not None and self.output is not None
        if bool(self.handshake or peer_linked) == bool(self.url):
            raise ValueError(f"engine {self.name!r}: give either a handshake address (or, "
                             "linked as a peer router, input and output) or a url")
        if len(self.peer_inputs) != len(self.peer_outputs):
            raise ValueError(f"engine {self.name!r}: peer_inputs and peer_outputs must pair up")
        if self.url is not None:
            if not self.url.startswith(HTTP_SCHEMES) or not self.url.split("://", 1)[1].strip("/"):
                raise ValueError(f"engine {self.name!r}: url must be http://HOST:PORT or "
                                 f"https://HOST:PORT, got {self.url!r}")
            if self.peer_inputs:
                raise ValueError(f"engine {self.name!r}: peer addresses are a ZMQ engine's; "
                                 "an HTTP engine (url) has none")
            for key in ("input", "output", "advertise_host", "bind_host"):
                if getattr(self, key) is not None:
                    raise ValueError(f"engine {self.name!r}: {key} is a ZMQ engine's setting; "
                                     "an HTTP engine (url) has none")
        if self.handshake.startswith("tcp://") and (self.input is None or self.output is None):
            if _tcp_port(self.handshake) + OUTPUT_PORT_OFFSET > 65535:
                raise ValueError(
                    f"engine {self.name!r}: handshake port {_tcp_port(self.handshake)} leaves no "
                    f"room for the default input/output ports (+{INPUT_PORT_OFFSET}, "
                    f"+{OUTPUT_PORT_OFFSET}): use a lower port or give input and output")
        if self.bind_host is not None and not _is_ip(self.bind_host):
            raise ValueError(f"engine {self.name!r}: bind_host {self.bind_host!r} is not an IP "
                             "address")
        if (self.handshake.startswith("tcp://") and (self.input is None or self.output is None)
                and _wildcard(_tcp_host(self.handshake)) and self.bind_host is None
                and self.advertise_host is not None and not _is_ip(self.advertise_host)):
            raise ValueError(
                f"engine {self.name!r}: its handshake binds every interface and advertise_host "
                f"{self.advertise_host!r} is a name: set bind_host (the IP address engines reach "
                "this host at) or the input and output addresses (tcp://0.0.0.0:P binds every "
                "interface, if that is what you want)")

    @property
    def is_http(self) -> bool:
        return self.url is not None

    @property
    def address(self) -> str:
        """Where the engine is reached: its URL, or the handshake address."""
        return self.url or self.handshake

    @property
    def kv_host(self) -> str:
        """The host to dial when the engine's KV publisher binds a wildcard: the pod's host or
        the handshake's, else loopback."""
        if self.url is not None:
            host = urlsplit(self.url).hostname or ""
        elif self.handshake.startswith("tcp://"):
            host = _tcp_host(self.handshake)
        else:
            host = ""
        return host if host and not _wildcard(host) else "127.0.0.1"

    @property
    def input_address(self) -> str:
        """The input socket's bind address: ``input``, else beside the handshake."""
        return self.input or self._beside(".in", INPUT_PORT_OFFSET)

    @property
    def output_address(self) -> str:
        """The output socket's bind address: ``output``, else beside the handshake."""
        return self.output or self._beside(".out", OUTPUT_PORT_OFFSET)

    def _beside(self, suffix: str, offset: int) -> str:
        # Same interface as the handshake, on a port derived from its port (handshake port P:
        # P + 1000 and P + 2000), so a restarted router binds the addresses its running engines
        # still dial; a handshake on port 0 gets kernel-chosen ones. A wildcard handshake was
        # asked for; its neighbours bind the one interface engines are told to dial, never
        # every interface.
        if not self.handshake.startswith("tcp://"):
            return self.handshake + suffix
        host = _tcp_host(self.handshake)
        if _wildcard(host):
            host = self.bind_host or self.advertise_host or (
                "::1" if host in ("::", "[::]") else "127.0.0.1")
        port = _tcp_port(self.handshake)
        port = port + offset if port else 0
        return f"tcp://[{host}]:{port}" if ":" in host.strip("[]") else f"tcp://{host}:{port}"


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
    # A linked engine without work, not heard from this long, is probed with a cheap utility
    # call; unanswered, it is dead (router/link/engine_health.py).
    engine_idle_probe: float = 5.0
    # Work one request may ask for (render.sampling_checks.RequestLimits; docs/operations.md).
    max_n: int = MAX_N
    max_logprobs: int = 20  # vLLM's --max-logprobs: keep it equal to the engines'
    max_stop_strings: int = 64
    max_stop_bytes: int = 16 * 1024
    max_output_entries: int = 1 << 24  # n x max_tokens x (logprobs + 1); 0: no bound

    def __post_init__(self) -> None:
        for name in ("max_n", "max_stop_strings", "max_stop_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_output_entries < 0:
            raise ValueError(f"max_output_entries must be 0 (no limit) or more, got "
                             f"{self.max_output_entries}")
        if self.max_logprobs < -1:
            raise ValueError(f"max_logprobs must be -1 (no limit) or more, got "
                             f"{self.max_logprobs}")
        if not self.engine_idle_probe > 0:
            raise ValueError(f"engine_idle_probe must be positive, got {self.engine_idle_probe}")

    @property
    def request(self) -> RequestLimits:
        """The per-request bounds render and the token-in path check."""
        return RequestLimits(self.max_n, self.max_logprobs, self.max_stop_strings,
                             self.max_stop_bytes, self.max_output_entries)


@dataclass(frozen=True, slots=True)
class Control:
    """The ``/admin/*`` endpoints (engines join, are listed and removed at run time).

    Off unless ``admin_key`` is set (then every ``/admin/*`` path answers 404); the admin key is
    separate from the client API key, and a client key never opens them. A joining engine's
    addresses are tcp to an allowed host or ipc under ``ipc_dir``, nothing else: the router
    binds its handshake, and a bind on an arbitrary path would replace whatever file is there.
    """

    # From --admin-key-file or KVROUTE_ADMIN_KEY, never a flag; kept out of the repr (logs).
    admin_key: str | None = field(default=None, repr=False)
    # tcp hosts a joining engine may use besides loopback and the configured engines' hosts.
    allowed_hosts: tuple[str, ...] = ()
    ipc_dir: str | None = None  # ipc addresses must lie under it (None: ipc joins refused)
    max_engines: int = 64  # engines linked at once, configured ones included
    # DELETE /admin/engines/NAME waits this long for the engine's requests to finish, then
    # removes it anyway (the rest end with an error).
    remove_drain_timeout: float = 30.0

    def __post_init__(self) -> None:
        if self.max_engines < 1:
            raise ValueError(f"max_engines must be at least 1, got {self.max_engines}")
        if self.admin_key is not None and not self.admin_key:
            raise ValueError("admin_key must not be empty")
        if not all(isinstance(h, str) and h for h in self.allowed_hosts):
            raise ValueError(f"allowed_hosts must be host names, got {self.allowed_hosts!r}")


@dataclass(frozen=True, slots=True)
class StreamLimits:
    """What one stream may hold in the router for a client that does not read.

    While the server's ``send`` waits on a full connection (the transport's back-pressure), the
    engine keeps producing: its outputs queue in the router. Past ``max_unsent_bytes`` (the
    router's estimate of the events those outputs make: ``EVENT_BYTES`` per output plus
    ``LOGPROB_BYTES`` per logprob entry) the stream is cut and its request aborted on the
    engine. Checked every ``check_interval`` seconds while a stream waits on its client.

    ``resume``: a stream whose engine dies after its first token goes on on another engine, up
    to ``max_resumes`` times (router/routing/resume.py); a request turns it off with
    ``"vllm_xargs": {"kvroute_resume": false}``.
    """

    max_unsent_bytes: int = 8 * 1024 * 1024
    check_interval: float = 0.25
    resume: bool = True
    max_resumes: int = 2

    def __post_init__(self) -> None:
        if self.max_unsent_bytes < 1:
            raise ValueError(f"max_unsent_bytes must be positive, got {self.max_unsent_bytes}")
        if not self.check_interval > 0:
            raise ValueError(f"check_interval must be positive, got {self.check_interval}")
        if self.max_resumes < 0:
            raise ValueError(f"max_resumes must be 0 or more, got {self.max_resumes}")


@dataclass(frozen=True, slots=True)
class LinkConfig:
    """The engine-facing sockets' guards (docs/operations.md, "Security")."""

    # Peer IPs admitted on the engine sockets (ZAP); None admits whoever reaches the bound
    # interface (bind loopback, or fence the ports with a NetworkPolicy).
    allowed_peers: tuple[str, ...] | None = None
    max_output_msg_bytes: int = 256 * 1024 * 1024  # ZMQ_MAXMSGSIZE of the output sockets
    max_kv_msg_bytes: int = 64 * 1024 * 1024  # ZMQ_MAXMSGSIZE of the KV-event sockets
    # HTTP engines (`url`): seconds to open a connection; to the response head of a request
    # (a pod sends it before the first token); a pooled keep-alive connection is dropped after
    # this long idle (below vLLM's 5 s --timeout-keep-alive, so the pod never closes one we are
    # about to reuse).
    http_connect_timeout: float = 5.0
    http_first_byte_timeout: float = 30.0
    http_pool_idle: float = 4.0
    # A pod's /health is probed this often (counted from its last full answer, if later); its
    # /metrics (running and waiting requests) scraped this often while it counts requests not
    # ours, every http_load_interval_quiet while it counts only ours; a count older than
    # http_load_max_age is not used for routing.
    http_health_interval: float = 1.0
    http_load_interval: float = 0.5
    http_load_max_age: float = 2.0
    http_load_interval_quiet: float = 1.5
    # The key pods started with `vllm serve --api-key` require (from --engine-api-key-file or
    # KVROUTE_ENGINE_API_KEY); kept out of the repr (logs).
    engine_api_key: str | None = field(default=None, repr=False)
    # This router's place in its ZMQ engines' frontend lists: 0 for the router that owns their
    # handshakes; i for the router the owner lists as its engines' i-th peer (EngineSpec
    # peer_inputs / peer_outputs), which never handshakes and adopts the engines by probe.
    client_index: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.client_index < 1 << 16:
            raise ValueError(f"client_index must be in [0, 65536), got {self.client_index}")
        for name in ("http_connect_timeout", "http_first_byte_timeout", "http_pool_idle",
                     "http_health_interval", "http_load_interval", "http_load_max_age",
                     "http_load_interval_quiet"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for peer in self.allowed_peers or ():
            try:
                ipaddress.ip_address(peer)
            except ValueError:
                raise ValueError(f"allowed_peers: {peer!r} is not an IP address") from None
        if self.max_output_msg_bytes <= 0 or self.max_kv_msg_bytes <= 0:
            raise ValueError("message size limits must be positive")


@dataclass(frozen=True, slots=True)
class Frontend:
    """vLLM's OpenAI-server switches for what an answer carries, with vLLM's defaults (off)."""

    # usage.prompt_tokens_details (the engine's cached prompt tokens) in every usage.
    enable_prompt_tokens_details: bool = False
    # A stream's usage chunk even when the client did not ask for it (stream_options).
    enable_force_include_usage: bool = False
    # Logprob tokens as "token_id:N" unless the request says otherwise.
    return_tokens_as_token_ids: bool = False


@dataclass(frozen=True, slots=True)
class DiscoveryConfig:
    """``[discovery]``: engines found by a source (discovery/) join the fleet at run time; those
    that leave (deleted, not ready, moved) are drained, then removed (docs/operations.md)."""

    source: SourceOptions
    # A leaving engine's running requests get this long to finish; what is left is cut.
    drain_timeout: float = 30.0

    def __post_init__(self) -> None:
        if self.drain_timeout < 0:
            raise ValueError(f"drain_timeout must be 0 or more, got {self.drain_timeout}")

    @property
    def kind(self) -> str:
        return next(k for k, cls in KINDS.items() if isinstance(self.source, cls))


@dataclass(frozen=True, slots=True)
class RouterConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    model: str = str(EMBEDDED_MODEL)
    served_model_name: str | None = None
    revision: str | None = None  # of a Hugging Face id in ``model`` (render/hub.py)
    tokenizer: str | None = None
    chat_template: str | None = None
    max_model_len: int | None = None
    render_url: str | None = None  # remote render service instead of the in-process Renderer
    # vLLM's parser flags (output/parsers/registry.py); a remote render service needs the same.
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    enable_auto_tool_choice: bool = False
    engines: tuple[EngineSpec, ...] = ()
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    limits: Limits = field(default_factory=Limits)
    link: LinkConfig = field(default_factory=LinkConfig)
    api_key: str | None = field(default=None, repr=False)  # kept out of the repr (logs)
    control: Control = field(default_factory=Control)
    streams: StreamLimits = field(default_factory=StreamLimits)
    frontend: Frontend = field(default_factory=Frontend)
    discovery: DiscoveryConfig | None = None
    log_json: bool = True
    log_level: str = "INFO"
    # The HTTP server, one of serving.server.SERVERS, run stock.
    http_server: str = ROUTER_SERVER
    # LoRA adapters served from the start (vLLM's --lora-modules), loaded onto every engine.
    lora_modules: tuple[LoRAModule, ...] = ()
    # POST /v1/load_lora_adapter and /v1/unload_lora_adapter exist (vLLM's env switch
    # VLLM_ALLOW_RUNTIME_LORA_UPDATING, read by from_args; or this key in the config file).
    allow_runtime_lora_updating: bool = False
    # The engines' --structured-outputs-config (render/structured.py; TOML [structured_outputs]).
    structured_outputs: StructuredOutputsConfig = field(default_factory=StructuredOutputsConfig)
    # Where the router keeps what engines said in their handshake, for a restart to re-adopt
    # them with their KV feeds (router/routing/engine_memory.py); None: kept nowhere.
    # `kvroute router` defaults it to $XDG_STATE_HOME/kvroute (~/.local/state/kvroute).
    state_dir: str | None = None

    def __post_init__(self) -> None:
        if self.http_server not in SERVERS:
            raise ValueError(f"http_server must be one of {SERVERS}, got {self.http_server!r}")
        if self.enable_auto_tool_choice and not self.tool_call_parser:
            raise ValueError("enable_auto_tool_choice requires tool_call_parser "
                             "(--enable-auto-tool-choice requires --tool-call-parser)")
        check_names(self.tool_call_parser, self.reasoning_parser)
        if not all(isinstance(m, LoRAModule) for m in self.lora_modules):
            raise ValueError("lora_modules must hold LoRAModule entries")


_SCALARS: dict[str, tuple[type, ...]] = {
    "int": (int,), "float": (int, float), "str": (str,), "bool": (bool,)}


def _check_types(cls: type[Any], data: dict[str, Any], where: str) -> None:
    """Scalar fields get a value of their type (a dataclass checks none): a TOML ``port = "80"``
    fails here, naming the key, not later in a socket call."""
    for f in fields(cls):
        if f.name not in data:
            continue
        text = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        parts = [t.strip() for t in text.split("|")]
        value = data[f.name]
        if value is None and "None" in parts:
            continue
        kinds = [k for t in parts if t != "None" for k in _SCALARS.get(t, ())]
        if len(kinds) != sum(len(_SCALARS.get(t, ())) for t in parts if t != "None") or not kinds:
            continue  # not a plain scalar field
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, tuple(kinds)):
            raise ConfigError(f"{where}: {f.name} must be {' or '.join(parts)}, got "
                              f"{value!r}")


def _build(cls: type[Any], data: dict[str, Any], where: str) -> Any:
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {sorted(known)}")
    _check_types(cls, data, where)
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
        engine = dict(engine)
        for key in ("peer_inputs", "peer_outputs"):
            if key in engine:
                value = engine[key]
                if not isinstance(value, list | tuple) or not all(isinstance(v, str)
                                                                  for v in value):
                    raise ConfigError(f"engines[{i}]: {key} must be a list of addresses")
                engine[key] = tuple(value)
        specs.append(_build(EngineSpec, {"name": f"engine-{i}", **engine}, f"engines[{i}]"))
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise ConfigError(f"engines: duplicate names in {names}")
    policy = _build(PolicyConfig, data.pop("policy", {}), "policy")
    limits = _build(Limits, data.pop("limits", {}), "limits")
    control_data = dict(data.pop("control", {}))
    if "allowed_hosts" in control_data:
        hosts = control_data["allowed_hosts"]
        if not isinstance(hosts, list | tuple):
            raise ConfigError("control: allowed_hosts must be a list of host names")
        control_data["allowed_hosts"] = tuple(hosts)
    control = _build(Control, control_data, "control")
    streams = _build(StreamLimits, data.pop("streams", {}), "streams")
    link_data = dict(data.pop("link", {}))
    peers = link_data.get("allowed_peers")
    if peers is not None:
        if not isinstance(peers, list | tuple) or not all(isinstance(p, str) for p in peers):
            raise ConfigError("link: allowed_peers must be a list of IP addresses")
        link_data["allowed_peers"] = tuple(peers)
    link = _build(LinkConfig, link_data, "link")
    modules = data.pop("lora_modules", [])
    if not isinstance(modules, list | tuple):
        raise ConfigError("lora_modules: expected a list of name=path strings or tables")
    try:
        adapters = lora_modules(modules)
    except ValueError as exc:
        raise ConfigError(f"lora_modules: {exc}") from None
    structured = _build(StructuredOutputsConfig, data.pop("structured_outputs", {}),
                        "structured_outputs")
    frontend = _build(Frontend, data.pop("frontend", {}), "frontend")
    discovery = _discovery(data.pop("discovery", None))
    return _build(  # type: ignore[no-any-return]
        RouterConfig,
        {**data, "engines": tuple(specs), "policy": policy, "limits": limits,
         "control": control, "streams": streams, "link": link, "lora_modules": adapters,
         "structured_outputs": structured, "discovery": discovery, "frontend": frontend},
        "top level",
    )


def _discovery(table: Any) -> DiscoveryConfig | None:
    """``[discovery]``: ``kind`` picks the source, ``drain_timeout`` is the router's, every
    other key is the source's (discovery/options.py)."""
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ConfigError("discovery: expected a table")
    data = dict(table)
    kind = data.pop("kind", None)
    if kind not in KINDS:
        raise ConfigError(f"discovery: kind must be one of {sorted(KINDS)}, got {kind!r}")
    where = f"discovery ({kind})"
    router_keys = {k: data.pop(k) for k in ("drain_timeout",) if k in data}
    for key in ("urls", "nameservers"):
        if key in data:
            if not isinstance(data[key], list | tuple) or not all(
                    isinstance(v, str) for v in data[key]):
                raise ConfigError(f"{where}: {key} must be a list of strings")
            data[key] = tuple(data[key])
    if isinstance(data.get("port"), str) and data["port"].isdigit():
        data["port"] = int(data["port"])
    source = _build(KINDS[kind], data, where)
    return _build(DiscoveryConfig, {"source": source, **router_keys}, "discovery")  # type: ignore[no-any-return]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    serving = parser.add_argument_group("serving")
    serving.add_argument("--config", help="TOML or JSON file; flags given here override it")
    serving.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serving.add_argument("--port", type=int, help="port to listen on (default 8000; 0: any free)")
    serving.add_argument("--api-key",
                         help="DEPRECATED (the key shows in the process list): use "
                              "--api-key-file or KVROUTE_API_KEY")
    serving.add_argument("--api-key-file",
                         help="file holding the key clients send as `Authorization: Bearer "
                              "KEY` on public endpoints (or env KVROUTE_API_KEY)")
    serving.add_argument("--http-server", choices=SERVERS,
                         help=f"HTTP server, run stock (default {ROUTER_SERVER})")
    control = parser.add_argument_group("control (/admin/*)")
    control.add_argument("--admin-key-file",
                         help="file holding the admin key /admin/* requires (or env "
                              "KVROUTE_ADMIN_KEY); without one /admin/* is off (404)")
    control.add_argument("--admin-allow-host", action="append", default=[], metavar="HOST",
                         help="a tcp host engines may join on besides loopback and the "
                              "configured engines' hosts (repeatable)")
    control.add_argument("--admin-ipc-dir",
                         help="the directory ipc:// addresses of joining engines must lie in")
    control.add_argument("--max-engines", type=int, help="engines linked at once (default 64)")
    model = parser.add_argument_group("model and render")
    model.add_argument("--model",
                       help="model directory, or a Hugging Face id ORG/NAME whose tokenizer and "
                            "config files (never weights) are fetched into the Hugging Face "
                            "cache (HF_HOME, HF_TOKEN, HF_HUB_OFFLINE apply; default: the "
                            "embedded Qwen3 tokenizer)")
    model.add_argument("--revision", help="Hub branch, tag or commit of an ORG/NAME --model")
    model.add_argument("--served-model-name", help="the model name clients send")
    model.add_argument("--tokenizer", help="tokenizer directory, if not the model's")
    model.add_argument("--chat-template", help="Jinja chat template file overriding the model's")
    model.add_argument("--max-model-len", type=int,
                       help="context length (default: the model's config.json; keep it at most "
                            "the engines' --max-model-len)")
    model.add_argument("--render-url", help="use a remote `kvroute render` service")
    model.add_argument("--tool-call-parser", metavar="NAME",
                       help="vLLM's tool-call parser (hermes, qwen3_coder, llama3_json, mistral, "
                            "openai, ...; auto: from the model); reads calls only with "
                            "--enable-auto-tool-choice")
    model.add_argument("--reasoning-parser", metavar="NAME",
                       help="vLLM's reasoning parser (qwen3, deepseek_r1, ...; auto)")
    model.add_argument("--enable-auto-tool-choice", action="store_true", default=None,
                       help="read the model's tool calls (tool_choice auto, required, named); "
                            "without it tool_choice auto is a 400, as in vLLM")
    model.add_argument("--lora-modules", nargs="+", action="extend", default=[],
                       metavar="MODULE",
                       help="LoRA adapters served under their own model names, as in vllm "
                            "serve: name=path, or JSON {\"name\": .., \"path\": .., "
                            "\"base_model_name\": ..}; the path is the adapter's directory on "
                            "the engines' hosts. Runtime loading (/v1/load_lora_adapter) needs "
                            f"{RUNTIME_LORA_ENV}=1")
    engines = parser.add_argument_group("engines")
    engines.add_argument(
        "--engine",
        action="append",
        default=[],
        metavar="NAME=tcp://HOST:PORT[,kv=ENDPOINT][,replay=ENDPOINT] | NAME=http://HOST:PORT",
        help="a headless engine's handshake address, bound by the router, or the URL of a "
             "`vllm serve --enable-scale-out` pod, reached over HTTP (repeatable; both kinds "
             "mix)",
    )
    engines.add_argument(
        "--state-dir",
        help="where the engines' handshake answers are kept, so a restarted router re-adopts "
             "running engines with their KV feeds (default $XDG_STATE_HOME/kvroute, else "
             "~/.local/state/kvroute; '' keeps them nowhere)")
    engines.add_argument("--client-index", type=int,
                         help="this router's place in its ZMQ engines' frontend lists: 0 (the "
                              "default) owns their handshakes; i >= 1 is the i-th peer router "
                              "the owner lists (--engine NAME=peer,input=ADDR,output=ADDR,"
                              "block_size=N here; peer_input=/peer_output= on the owner)")
    engines.add_argument("--engine-api-key-file",
                         help="file holding the key HTTP engines (`vllm serve --api-key`) "
                              "require (or env KVROUTE_ENGINE_API_KEY)")
    found = parser.add_argument_group("discovery (engines found at run time)")
    found.add_argument("--discovery", choices=sorted(KINDS),
                       help="find engines (`vllm serve` pods) with this source; the rest of "
                            "[discovery] in the config file, or the flags below")
    found.add_argument("--discovery-selector", metavar="SELECTOR",
                       help="kubernetes: the pods' label selector, e.g. app=vllm")
    found.add_argument("--discovery-namespace", metavar="NS",
                       help="kubernetes: the pods' namespace (default: the router's own)")
    found.add_argument("--discovery-port", metavar="PORT",
                       help="kubernetes: a container port name or number; dns: a number (A/AAAA "
                            "records) or the Service's port name (SRV records)")
    found.add_argument("--discovery-name", metavar="NAME",
                       help="dns: the (headless) Service's DNS name")
    found.add_argument("--discovery-url", action="append", default=[], metavar="[NAME=]URL",
                       help="static: an engine's base URL (repeatable)")
    found.add_argument("--kubeconfig", metavar="FILE",
                       help="kubernetes: a kubeconfig file (default: the in-cluster account)")
    routing = parser.add_argument_group("routing")
    routing.add_argument("--policy", choices=POLICIES, help="default cache_aware")
    routing.add_argument("--load-weight", type=float)
    routing.add_argument("--request-tokens", type=float)
    routing.add_argument("--cache-threshold", type=float)
    routing.add_argument("--balance-abs-threshold", type=int)
    routing.add_argument("--balance-rel-threshold", type=float)
    routing.add_argument("--seed", type=int)
    limits = parser.add_argument_group("limits")
    limits.add_argument("--max-in-flight-per-engine", type=int)
    limits.add_argument("--max-queue", type=int)
    limits.add_argument("--max-body-bytes", type=int)
    limits.add_argument("--max-n", type=int, help=f"most choices per request (default {MAX_N})")
    limits.add_argument("--max-logprobs", type=int,
                        help="most logprobs/top_logprobs/prompt_logprobs, as vLLM's "
                             "--max-logprobs (default 20; -1: no limit)")
    limits.add_argument("--max-stop-strings", type=int,
                        help="most stop strings per request (default 64)")
    limits.add_argument("--max-stop-bytes", type=int,
                        help="most UTF-8 bytes of all stop strings together (default 16384)")
    limits.add_argument("--max-output-entries", type=int,
                        help="most n x max_tokens x (logprobs + 1) per request (default 2**24; "
                             "0: no limit)")
    frontend = parser.add_argument_group("answers",
                                         "vLLM's OpenAI-server switches, vLLM's defaults")
    frontend.add_argument("--enable-prompt-tokens-details", action="store_true", default=None,
                          help="usage.prompt_tokens_details.cached_tokens in every usage")
    frontend.add_argument("--enable-force-include-usage", action="store_true", default=None,
                          help="a usage chunk ends every stream, asked for or not")
    frontend.add_argument("--return-tokens-as-token-ids", action="store_true", default=None,
                          help="logprob tokens as 'token_id:N' unless a request says otherwise")
    add_structured_outputs_arguments(parser)
    obs = parser.add_argument_group("observability")
    obs.add_argument("--log-level", help="default INFO")
    obs.add_argument("--plain-logs", action="store_true", help="text logs instead of JSON")


def parse_engine_flag(value: str, index: int) -> dict[str, Any]:
    """``name=tcp://h:p,kv=tcp://h:p2,replay=tcp://h:p3`` or ``name=http://h:p`` (name
    optional)."""
    head, *opts = value.split(",")
    name, sep, address = head.partition("=")
    if not sep or "://" in name:
        name, address = f"engine-{index}", head
    if address == "peer":  # NAME=peer,input=...,output=...: linked by another router's handshake
        address = ""
    key = "url" if address.startswith(HTTP_SCHEMES) else "handshake"
    spec: dict[str, Any] = {"name": name, key: address} if address else {"name": name}
    for opt in opts:
        key, sep, val = opt.partition("=")
        if not sep or key not in ("kv", "replay", "topic", "input", "output", "block_size",
                                  "advertise_host", "bind_host", "max_model_len",
                                  "peer_input", "peer_output"):
            raise ConfigError(f"--engine {value!r}: options are kv=, replay=, topic=, input=, "
                              "output=, block_size=, advertise_host=, bind_host=, "
                              "max_model_len=, peer_input=, peer_output=")
        if key in ("peer_input", "peer_output"):
            spec[key + "s"] = (*spec.get(key + "s", ()), val)
        elif key in ("block_size", "max_model_len"):
            if not val.isdigit():
                raise ConfigError(f"--engine {value!r}: {key} must be an integer")
            spec[key] = int(val)
        else:
            spec[{"kv": "kv_events"}.get(key, key)] = val
    return spec


API_KEY_ENV = "KVROUTE_API_KEY"
ADMIN_KEY_ENV = "KVROUTE_ADMIN_KEY"
ENGINE_KEY_ENV = "KVROUTE_ENGINE_API_KEY"


def env_flag(env: Mapping[str, str], var: str) -> bool | None:
    """vLLM's reading of a boolean switch: "1" or "true" (any case, spaces aside) is on;
    None when the variable is not set."""
    if var not in env:
        return None
    return env[var].strip().lower() in ("1", "true")


def read_key(path: str, what: str) -> str:
    """A key file's content, without the trailing newline an editor or a Secret adds."""
    try:
        key = Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the {what} file {path}: {exc}") from exc
    if not key:
        raise ConfigError(f"the {what} file {path} is empty")
    return key


def _key(file: str | None, env: Mapping[str, str], var: str, what: str) -> str | None:
    """A key from its file flag, else the environment (never from a flag's value)."""
    if file is not None:
        return read_key(file, what)
    value = env.get(var, "").strip()
    return value or None


def default_state_dir(env: Mapping[str, str]) -> str:
    """The XDG state directory's kvroute folder (``$XDG_STATE_HOME``, else ~/.local/state)."""
    base = env.get("XDG_STATE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".local"
                                             / "state")
    return str(Path(base) / "kvroute")


def from_args(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> RouterConfig:
    """The config from parsed flags, the config file and the keys' environment variables
    (``env``, default the process's: read here once, nowhere else)."""
    env = os.environ if env is None else env
    data: dict[str, Any] = load_file(args.config) if args.config else {}
    api_key = _key(args.api_key_file, env, API_KEY_ENV, "API key")
    if args.api_key is not None and api_key is None:
        api_key = args.api_key  # deprecated: router.main warns
    if api_key is not None:
        data["api_key"] = api_key
    control = dict(data.get("control", {}))
    admin_key = _key(args.admin_key_file, env, ADMIN_KEY_ENV, "admin key")
    if admin_key is not None:
        control["admin_key"] = admin_key
    if args.admin_allow_host:
        control["allowed_hosts"] = [*control.get("allowed_hosts", []), *args.admin_allow_host]
    if args.admin_ipc_dir is not None:
        control["ipc_dir"] = args.admin_ipc_dir
    if args.max_engines is not None:
        control["max_engines"] = args.max_engines
    data["control"] = control
    engine_key = _key(args.engine_api_key_file, env, ENGINE_KEY_ENV, "engine API key")
    if engine_key is not None:
        data["link"] = {**data.get("link", {}), "engine_api_key": engine_key}
    if args.client_index is not None:
        data["link"] = {**data.get("link", {}), "client_index": args.client_index}
    for key in ("host", "port", "model", "revision", "served_model_name", "tokenizer",
                "chat_template",
                "max_model_len", "render_url", "log_level",
                "http_server", "tool_call_parser", "reasoning_parser",
                "enable_auto_tool_choice"):
        if getattr(args, key) is not None:
            data[key] = getattr(args, key)
    if args.plain_logs:
        data["log_json"] = False
    if args.lora_modules:
        data["lora_modules"] = [*data.get("lora_modules", []), *args.lora_modules]
    runtime_lora = env_flag(env, RUNTIME_LORA_ENV)
    if runtime_lora is not None:
        data["allow_runtime_lora_updating"] = runtime_lora
    if args.state_dir is not None:
        data["state_dir"] = args.state_dir or None  # "": kept nowhere
    elif "state_dir" not in data:
        data["state_dir"] = default_state_dir(env)
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
    discovery = _discovery_flags(args, data.get("discovery"))
    if discovery is not None:
        data["discovery"] = discovery
    limits = dict(data.get("limits", {}))
    for key in ("max_in_flight_per_engine", "max_queue", "max_body_bytes", "max_n",
                "max_logprobs", "max_stop_strings", "max_stop_bytes", "max_output_entries"):
        if getattr(args, key) is not None:
            limits[key] = getattr(args, key)
    data["limits"] = limits
    frontend = dict(data.get("frontend", {}))
    for key in ("enable_prompt_tokens_details", "enable_force_include_usage",
                "return_tokens_as_token_ids"):
        if getattr(args, key) is not None:
            frontend[key] = getattr(args, key)
    data["frontend"] = frontend
    if args.structured_outputs_json is not None or args.structured_outputs_backend is not None:
        try:
            flagged = structured_outputs_config(args.structured_outputs_json,
                                                args.structured_outputs_backend)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        data["structured_outputs"] = {f.name: getattr(flagged, f.name) for f in fields(flagged)}
    try:
        return from_mapping(data)
    except ConfigError as exc:
        if args.config:
            raise ConfigError(f"config file {args.config}: {exc}") from None
        raise


def _discovery_flags(args: argparse.Namespace, table: Any) -> dict[str, Any] | None:
    """``[discovery]`` with the discovery flags applied over it (a ``--discovery`` of another
    kind starts from an empty table)."""
    flags = {"selector": args.discovery_selector, "namespace": args.discovery_namespace,
             "port": args.discovery_port, "name": args.discovery_name,
             "kubeconfig": args.kubeconfig, "urls": args.discovery_url or None}
    given = {k: v for k, v in flags.items() if v is not None}
    if table is None and args.discovery is None:
        if given:
            raise ConfigError(f"--discovery-* and --kubeconfig need --discovery or a "
                              f"[discovery] table (given: {', '.join(sorted(given))})")
        return None
    data = dict(table) if isinstance(table, dict) else {}
    if args.discovery is not None and data.get("kind") != args.discovery:
        data = {"kind": args.discovery}
    return {**data, **given}

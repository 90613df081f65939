"""The ``/admin/*`` endpoints: engines join, are listed and removed at run time (admin key only).

    POST   /admin/engines        {"name", "handshake" | "url", "kv_events"?, "replay"?, "topic"?}:
                                 join (a headless engine's handshake, or a `vllm serve` pod's URL)
    GET    /admin/engines        the linked engines: name, address, status, requests, draining
    DELETE /admin/engines/NAME   drain (no new requests; wait for the running ones), then remove

The Guard (router/front/app.py) admits a path here only with the admin key, and answers 404 for
every ``/admin/*`` path when none is configured. An address a joining engine names is checked
before anything is bound or dialled (``check_address``): tcp to an allowed host, or ipc under the
configured directory and never onto an existing file that is not a socket.
"""

from __future__ import annotations

import ipaddress
import re
import stat
from pathlib import Path
from urllib.parse import urlsplit

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from router.config import Control, EngineSpec
from router.front.state import router_state
from serving.body import json_response, read_body
from serving.errors import APIError, BadRequestError, NotFoundError

MAX_JOIN_BODY = 64 * 1024
LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class JoinEngine(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    handshake: str | None = None
    url: str | None = None  # http(s)://HOST:PORT of a `vllm serve --enable-scale-out` pod
    kv_events: str | None = None
    replay: str | None = None
    topic: str = ""


class EngineLimitError(APIError):
    """The router links ``max_engines`` engines already."""

    def __init__(self, limit: int) -> None:
        super().__init__(409, f"the router links {limit} engines already (control.max_engines);"
                              " remove one first", "ConflictError", "name")


def tcp_host(address: str) -> str | None:
    """The host of ``tcp://HOST:PORT`` (brackets stripped), None if it is not one."""
    if not address.startswith("tcp://"):
        return None
    host, sep, port = address[len("tcp://"):].rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        return None
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def check_url(url: str, hosts: frozenset[str]) -> None:
    """Raise a 400 unless ``url`` is http(s)://HOST[:PORT] with an allowed host."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme not in ("http", "https") or not parts.hostname or port == -1 or (
            parts.path not in ("", "/")) or parts.query or parts.fragment:
        raise BadRequestError("url: expected http://HOST:PORT or https://HOST:PORT", "url")
    if parts.hostname not in hosts:
        raise BadRequestError(f"url: host {parts.hostname!r} is not allowed (loopback, the "
                              "configured engines' hosts and control.allowed_hosts are)", "url")


def allowed_hosts(control: Control, engines: tuple[EngineSpec, ...]) -> frozenset[str]:
    """Loopback, the configured engines' handshake, URL and KV hosts, and the configured
    extras."""
    hosts = set(LOOPBACK) | set(control.allowed_hosts)
    for spec in engines:
        pod_host = urlsplit(spec.url).hostname if spec.url else None
        if pod_host:
            hosts.add(pod_host)
        for address in (spec.handshake, spec.kv_events, spec.replay):
            host = tcp_host(address) if address else None
            if host and not _wildcard(host):
                hosts.add(host)
    return frozenset(hosts)


def _wildcard(host: str) -> bool:
    if host == "*":
        return True
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def check_address(address: str, field: str, control: Control, hosts: frozenset[str], *,
                  binds: bool) -> None:
    """Raise a 400 naming ``field`` unless ``address`` is tcp to an allowed host or ipc under
    ``control.ipc_dir``. ``binds``: the router binds it (and the sockets beside it), so an ipc
    path must not name an existing file that is not a socket."""
    if address.startswith("ipc://"):
        if control.ipc_dir is None:
            raise BadRequestError(f"{field}: ipc addresses are refused (no control.ipc_dir "
                                  "configured)", field)
        root = Path(control.ipc_dir).resolve()
        path = Path(address[len("ipc://"):])
        if not path.is_absolute():
            raise BadRequestError(f"{field}: an ipc path must be absolute", field)
        resolved = path.resolve()
        if resolved == root or not resolved.is_relative_to(root):
            raise BadRequestError(f"{field}: ipc paths must lie under {root}", field)
        if binds:
            for target in (resolved, *(resolved.with_name(resolved.name + s)
                                       for s in (".in", ".out"))):
                _not_a_file(target, field)
        return
    host = tcp_host(address)
    if host is None:
        raise BadRequestError(f"{field}: expected tcp://HOST:PORT or ipc:///PATH", field)
    if _wildcard(host):
        raise BadRequestError(f"{field}: a wildcard host binds every interface; name one", field)
    if host not in hosts:
        raise BadRequestError(f"{field}: host {host!r} is not allowed (loopback, the configured "
                              "engines' hosts and control.allowed_hosts are)", field)


def _not_a_file(path: Path, field: str) -> None:
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise BadRequestError(f"{field}: {path} exists and is not a socket", field)


async def add_engine(request: Request) -> Response:
    """An engine joins at run time: bind its handshake address; start the engine against it."""
    st = router_state(request.scope["state"])
    body = await read_body(request, MAX_JOIN_BODY)
    req = msgspec.json.decode(body, type=JoinEngine)
    control = st.config.control
    if not NAME.fullmatch(req.name):
        raise BadRequestError("name: 1-64 letters, digits, '.', '_' or '-', starting with a "
                              "letter or digit", "name")
    if req.name in st.client.engines:
        raise BadRequestError(f"engine {req.name!r} already exists", "name")
    if len(st.client.engines) >= control.max_engines:
        raise EngineLimitError(control.max_engines)
    hosts = allowed_hosts(control, st.config.engines)
    if (req.handshake is None) == (req.url is None):
        raise BadRequestError("give either handshake (a headless engine) or url (a pod)",
                              "handshake")
    if req.handshake is not None:
        check_address(req.handshake, "handshake", control, hosts, binds=True)
    else:
        check_url(req.url or "", hosts)
    for field, address in (("kv_events", req.kv_events), ("replay", req.replay)):
        if address is not None:
            check_address(address, field, control, hosts, binds=False)
    spec = EngineSpec(req.name, req.handshake or "", req.kv_events, req.replay, req.topic,
                      url=req.url)
    address = st.fleet.join(spec)
    answer = {"name": req.name, "url" if req.url else "handshake": address}
    return json_response(st.render.codecs.encoder, answer)


async def list_engines(request: Request) -> Response:
    st = router_state(request.scope["state"])
    draining = st.dispatcher.draining
    engines = [{"name": name,
                "url" if eng.spec.is_http else "handshake": st.client.endpoint(name),
                "status": eng.status.value, "requests": eng.num_in_flight,
                "draining": name in draining}
               for name, eng in st.client.engines.items()]
    return json_response(st.render.codecs.encoder, {"engines": engines})


async def remove_engine(request: Request) -> Response:
    """Drain the engine (no new request goes to it; its running ones get
    ``control.remove_drain_timeout`` to finish), then unlink it; what is left ends with an
    error (router/routing/drain.py)."""
    st = router_state(request.scope["state"])
    name = request.path_params["name"]
    if name not in st.client.engines or name in st.dispatcher.draining:
        raise NotFoundError(f"no engine {name!r} (or it is being removed)", "name")
    removal = await st.drains.start(name, st.config.control.remove_drain_timeout)
    return json_response(st.render.codecs.encoder, {
        "name": name, "removed": True, "drained": removal.drained, "cut": removal.cut})

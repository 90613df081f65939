"""`kvroute router`: parse the config once, serve it (serving.server), drain on SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from starlette.applications import Starlette

from router.config import ConfigError, RouterConfig, add_arguments, from_args
from router.front.app import create_app
from router.front.state import CUT_GRACE, RouterState
from router.obs import logs
from serving.server import ServeOptions, bind_socket, serve_asgi


async def serve(cfg: RouterConfig, sock: socket.socket, stop: asyncio.Event,
                on_started: Callable[[], None] | None = None,
                on_app: Callable[[Starlette], None] | None = None,
                on_ready: Callable[[RouterState], None] | None = None) -> None:
    """Serve until ``stop`` is set; then readiness flips, streams drain, the server closes.
    ``on_ready(live)``: the app's lifespan has loaded the model and bound the engine sockets."""
    app = create_app(cfg, on_ready=on_ready)
    if on_app is not None:
        on_app(app)
    lifecycle = app.state.lifecycle

    async def shutdown_trigger() -> None:
        await stop.wait()
        await lifecycle.drain(cfg.limits.drain_timeout)

    if on_started is not None:
        loop = asyncio.get_running_loop()
        loop.call_soon(on_started)
    # SIGTERM is ours (readiness flips, streams drain, what is left at the deadline is cut, then
    # the server closes), not the server's: the server's own grace is only for the cut streams'
    # last writes and requests not yet streaming.
    opts = ServeOptions(server=cfg.http_server, graceful_timeout=CUT_GRACE,
                        error_log=False)  # router.obs.logs configures logging
    await serve_asgi(app, sock, opts, shutdown_trigger)


def banner(cfg: RouterConfig, url: str, live: RouterState) -> str:
    """What a started router serves and where: address, model, engines, policy."""
    models = ", ".join(live.models.registry.names())
    render = f"render at {cfg.render_url}" if cfg.render_url else "render in process"
    context = min(r.max_model_len for r in live.models.registry)
    lines = [f"kvroute router: serving {models} on {url} (policy {cfg.policy.name}, "
             f"max_model_len {context}, {render}, {cfg.http_server})"]
    for name, eng in live.client.engines.items():
        address = live.client.endpoint(name)
        if eng.spec.is_http:
            lines.append(f"  engine {name}: {address} (HTTP, vLLM's token-in API)")
        else:
            lines.append(f"  engine {name}: handshake {address} ({_transport(address)}; "
                         "the engine dials it)")
    if not live.client.engines:
        lines.append("  no engines yet: add --engine NAME=tcp://HOST:PORT or NAME=http://HOST:PORT,"
                     " or POST /admin/engines")
    lines.append(f"  OpenAI API {url}/v1, probes {url}/health {url}/ready, metrics {url}/metrics")
    return "\n".join(lines)


def _transport(address: str) -> str:
    scheme = address.split("://", 1)[0]
    return {"tcp": "ZMQ over TCP", "ipc": "ZMQ over a Unix socket"}.get(scheme, f"ZMQ {scheme}")


async def _main(cfg: RouterConfig) -> None:
    sock = bind_socket(cfg.host, cfg.port)
    host, port = sock.getsockname()[:2]
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await serve(cfg, sock, stop,
                    on_ready=lambda live: print(banner(cfg, url, live), flush=True))
    finally:
        sock.close()


def run(coro_factory: Callable[[], object]) -> None:
    """Run on uvloop when it is installed (it is on Linux), else the default loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - non-Linux
        asyncio.run(coro_factory())  # type: ignore[arg-type]
        return
    uvloop.run(coro_factory())  # type: ignore[arg-type]


def parse(argv: list[str]) -> RouterConfig:
    parser = argparse.ArgumentParser(prog="kvroute router",
                                     description="Cache-aware router in front of vLLM engines.")
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.api_key is not None:
        # Kept for existing scripts; a flag's value is readable by every local user.
        print("kvroute router: --api-key is deprecated: the key is visible in the process list; "
              "use --api-key-file or KVROUTE_API_KEY", file=sys.stderr)
    return from_args(args)


def resolve(cfg: RouterConfig) -> RouterConfig:
    """The model as a local directory (a Hub id fetched: render/hub.py), named as typed."""
    from render.hub import resolve_model  # raises ModelUnavailable

    local = resolve_model(cfg.model, cfg.revision)
    tokenizer = resolve_model(cfg.tokenizer, cfg.revision) if cfg.tokenizer else None
    if local == Path(cfg.model) and tokenizer == (Path(cfg.tokenizer) if cfg.tokenizer else None):
        return cfg
    return replace(cfg, model=str(local), tokenizer=str(tokenizer) if tokenizer else None,
                   served_model_name=cfg.served_model_name or cfg.model)


def cli(argv: list[str]) -> int:
    from render.hub import ModelUnavailable

    try:
        cfg = resolve(parse(argv))
    except (ConfigError, ModelUnavailable) as exc:
        print(f"kvroute router: {exc}", file=sys.stderr)
        return 2
    if not cfg.engines:
        print("kvroute router: no engines configured (--engine NAME=tcp://HOST:PORT or a "
              "config file with [[engines]]); engines can also join via POST /admin/engines",
              file=sys.stderr)
    logs.configure(cfg.log_level, cfg.log_json)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            run(lambda: _main(cfg))
    except OSError as exc:
        print(f"kvroute router: cannot listen on {cfg.host}:{cfg.port}: {exc}", file=sys.stderr)
        return 1
    except ConfigError as exc:
        print(f"kvroute router: {exc}", file=sys.stderr)
        return 2
    return 0

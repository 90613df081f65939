"""`kvroute router`: parse the config once, serve it (serving.server), drain on SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import sys
from collections.abc import Callable

from starlette.applications import Starlette

from router.config import ConfigError, RouterConfig, add_arguments, from_args
from router.front.app import create_app
from router.obs import logs
from serving.server import ServeOptions, bind_socket, serve_asgi


async def serve(cfg: RouterConfig, sock: socket.socket, stop: asyncio.Event,
                on_started: Callable[[], None] | None = None,
                on_app: Callable[[Starlette], None] | None = None) -> None:
    """Serve until ``stop`` is set; then readiness flips, streams drain, the server closes."""
    app = create_app(cfg)
    if on_app is not None:
        on_app(app)
    lifecycle = app.state.lifecycle

    async def shutdown_trigger() -> None:
        await stop.wait()
        await lifecycle.drain(cfg.limits.drain_timeout)

    if on_started is not None:
        loop = asyncio.get_running_loop()
        loop.call_soon(on_started)
    # SIGTERM is ours (readiness flips, streams drain, then the server closes), not the server's.
    opts = ServeOptions(server=cfg.http_server, graceful_timeout=cfg.limits.drain_timeout,
                        error_log=False)  # router.obs.logs configures logging
    await serve_asgi(app, sock, opts, shutdown_trigger)


async def _main(cfg: RouterConfig) -> None:
    sock = bind_socket(cfg.host, cfg.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await serve(cfg, sock, stop)
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
    return from_args(parser.parse_args(argv))


def cli(argv: list[str]) -> int:
    try:
        cfg = parse(argv)
    except ConfigError as exc:
        print(f"kvroute router: {exc}", file=sys.stderr)
        return 2
    if not cfg.engines:
        print("kvroute router: no engines configured (--engine NAME=tcp://HOST:PORT or a "
              "config file with [[engines]]); engines can also join via POST /admin/engines",
              file=sys.stderr)
    logs.configure(cfg.log_level, cfg.log_json)
    with contextlib.suppress(KeyboardInterrupt):
        run(lambda: _main(cfg))
    return 0

"""The HTTP face on its own thread and event loop, served by the project's HTTP server layer.

The engine's busy loop keeps its thread (the process's main one under `kvroute sim-engine`);
the face runs uvicorn on uvloop beside it, bound before it starts (port 0 resolves at once).
"""

from __future__ import annotations

import asyncio
import threading

from render.renderer import Renderer
from serving.server import ServeOptions, bind_socket, serve_asgi
from sim.engine import SimEngine
from sim.http.app import create_app

READY_TIMEOUT = 120.0


class HttpFace:
    """``start()`` serves the engine's face until ``stop()``; ``url`` is where."""

    def __init__(self, engine: SimEngine, renderer: Renderer | None = None) -> None:
        face = engine.config.http
        if face is None:
            raise ValueError("the engine's config has no HTTP face (SimConfig.http)")
        self.engine = engine
        self.renderer = renderer  # shared by faces in one process (else each loads its own)
        self.options = ServeOptions(server="uvicorn", keep_alive_timeout=face.keep_alive_timeout,
                                    graceful_timeout=1.0, error_log=False)
        self.sock = bind_socket(face.host, face.port)
        host, self.port = self.sock.getsockname()[:2]
        self.url = f"http://{f'[{host}]' if ':' in host else host}:{self.port}"
        self.ready = threading.Event()  # the app's lifespan ran: requests are answered
        self.error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="sim-http-face", daemon=True)
        # The face's sockets live in the engine's context: it stops before the engine closes.
        engine.on_close.append(self.stop)

    def start(self) -> HttpFace:
        self._thread.start()
        return self

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> bool:
        return self.ready.wait(timeout)

    def _run(self) -> None:
        import uvloop

        try:
            uvloop.run(self._serve())
        except BaseException as exc:  # surfaced by stop() and the CLI
            self.error = exc
            self.ready.set()
        finally:
            self.sock.close()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        stop = self._stop = asyncio.Event()
        app = create_app(self.engine, on_ready=self.ready.set, renderer=self.renderer)
        await serve_asgi(app, self.sock, self.options, stop.wait)

    def stop(self, timeout: float = 10.0) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:  # the loop closed meanwhile
                pass
        if self._thread.ident is not None:
            self._thread.join(timeout)

"""A local fleet for the demo, tests and benchmarks: the router on its own loop + sim engines.

Engines are linked over ZMQ (the router binds each handshake, the sims dial it) or, with
``transport="http"``, over HTTP: each sim serves `vllm serve`'s endpoints (its HTTP face) on a
port of its own, started first, and the router is given their URLs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgspec

from render.hub import resolve_model
from render.models import EMBEDDED_MODEL, EMBEDDED_SERVED_NAME
from render.renderer import Renderer
from render.service.lora_modules import LoRAModule
from router.config import (
    Control,
    DiscoveryConfig,
    EngineSpec,
    Frontend,
    Limits,
    LinkConfig,
    RouterConfig,
    StreamLimits,
)
from router.front.state import RouterState
from router.main import serve
from router.routing.policy import PolicyConfig
from serving.server import ROUTER_SERVER, bind_socket
from sim.config import DEFAULT_MAX_MODEL_LEN, HttpFaceConfig, KVEventsConfig
from sim.http.face import HttpFace
from sim.launch import SimEngineThread, spawn_sim_engine, start_sim_engine
from sim.tokens import TokenTable


@dataclass
class ClusterOptions:
    engines: int = 3
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    limits: Limits = field(default_factory=Limits)
    processes: bool = False  # engines as child processes (killable) instead of threads
    sim: dict[str, Any] = field(default_factory=dict)  # SimConfig overrides (step_time, ...)
    api_key: str | None = None
    # /admin/*: set an admin_key to turn it on; ipc joins default to the cluster's directory.
    control: Control = field(default_factory=Control)
    streams: StreamLimits = field(default_factory=StreamLimits)
    link: LinkConfig = field(default_factory=LinkConfig)  # e.g. client_index for a peer router
    ready_timeout: float = 60.0
    # Engines already running elsewhere (e.g. real vLLM): used instead of starting sims.
    external: tuple[EngineSpec, ...] = ()
    # Model dir (or Hub id) for the render and the sims' vocabulary (default: the embedded Qwen3).
    model: str | None = None
    # The in-process sims' vocabulary, built once and shared by clusters of one model (a
    # model's TokenTable takes seconds to read); None: read from the model.
    sim_tokens: TokenTable | None = None
    served_model_name: str | None = None  # the router's name for it (default: render's)
    render_url: str | None = None  # a remote `kvroute render` instead of the in-process one
    http_server: str = ROUTER_SERVER
    port: int = 0  # the router's port on 127.0.0.1 (0: any free one)
    # The router's context length when it must differ from the sims' (tests of an engine that
    # refuses what the router admits); None: the sims' own.
    router_max_model_len: int | None = None
    # vLLM's parser flags for the router (and so for its in-process render).
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    enable_auto_tool_choice: bool = False
    # The router takes its context from the engines' ready responses (no --max-model-len).
    context_from_engines: bool = False
    frontend: Frontend = field(default_factory=Frontend)  # vLLM's answer switches
    # LoRA adapters served from the start (the sims need sim={"enable_lora": True}), and the
    # runtime load/unload endpoints.
    lora_modules: tuple[LoRAModule, ...] = ()
    allow_runtime_lora_updating: bool = False
    # "zmq": headless engines dialling the router; "http": sims serving their HTTP face,
    # reached by URL (as `vllm serve` pods); "mixed": engine-0 over ZMQ, engine-1 over HTTP,
    # and so on alternately.
    transport: str = "zmq"
    # Engines found at run time ([discovery]); with engines=0 the router starts with none.
    discovery: DiscoveryConfig | None = None


class LocalCluster:
    """Router (background thread, own event loop) + N sim engines over ipc under a temp dir."""

    def __init__(self, options: ClusterOptions | None = None, workdir: Path | None = None):
        self.options = options or ClusterOptions()
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="kvroute-")
        self.dir = workdir or Path(self._tmp.name)  # type: ignore[union-attr]
        self.names = ([e.name for e in self.options.external] if self.options.external
                      else [f"engine-{i}" for i in range(self.options.engines)])
        self.threads: dict[str, SimEngineThread] = {}
        self.faces: dict[str, HttpFace] = {}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.urls: dict[str, str] = {}  # HTTP engines: name -> base URL
        self._renderer: Renderer | None = None  # the in-process faces' one render
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.port = 0

    def _address(self, name: str, kind: str) -> str:
        return f"ipc://{self.dir}/{name}.{kind}"

    def config(self) -> RouterConfig:
        if self.options.external:
            specs = self.options.external
        else:
            specs = tuple(EngineSpec(n, url=self.urls[n]) if self.is_http(n)
                          else EngineSpec(n, self._address(n, "hs")) for n in self.names)
        model = self.options.model or RouterConfig().model
        # Router and sims agree on the context length, so no prompt the router admits fails on
        # an engine (external engines: the model's, as vLLM derives it).
        max_len = None if self.options.external else self.sim_options()["max_model_len"]
        if self.options.router_max_model_len is not None:
            max_len = self.options.router_max_model_len
        if self.options.context_from_engines:
            max_len = None
        control = self.options.control
        if control.ipc_dir is None:
            control = dataclasses.replace(control, ipc_dir=str(self.dir))
        return RouterConfig(host="127.0.0.1", port=0, engines=specs, policy=self.options.policy,
                            model=model, render_url=self.options.render_url,
                            served_model_name=self.options.served_model_name,
                            max_model_len=max_len,
                            limits=self.options.limits, api_key=self.options.api_key,
                            control=control, streams=self.options.streams,
                            link=self.options.link, discovery=self.options.discovery,
                            frontend=self.options.frontend,
                            log_json=False, log_level="WARNING",
                            http_server=self.options.http_server,
                            lora_modules=self.options.lora_modules,
                            allow_runtime_lora_updating=self.options.allow_runtime_lora_updating,
                            state_dir=str(self.dir),
                            tool_call_parser=self.options.tool_call_parser,
                            reasoning_parser=self.options.reasoning_parser,
                            enable_auto_tool_choice=self.options.enable_auto_tool_choice)

    def is_http(self, name: str) -> bool:
        """Whether the router reaches this engine over HTTP (its sim serves an HTTP face)."""
        transport = self.options.transport
        return transport == "http" or (transport == "mixed" and self.names.index(name) % 2 == 1)

    def sim_options(self) -> dict[str, Any]:
        """The sims' SimConfig overrides, with the context length the router is given too."""
        return {"max_model_len": DEFAULT_MAX_MODEL_LEN, **self.options.sim}

    def kv_config(self, name: str) -> KVEventsConfig:
        return KVEventsConfig(enable_kv_cache_events=True, publisher="zmq",
                              endpoint=self._address(name, "kv"),
                              replay_endpoint=self._address(name, "replay"))

    @property
    def sim_model(self) -> Path:
        """The model the sims serve: the router's, so its prompt ids lie in their vocabulary."""
        return resolve_model(self.options.model) if self.options.model else EMBEDDED_MODEL

    @property
    def sim_served_name(self) -> str:
        """The HTTP sims' model name: the router's (vLLM's default: the --model argument)."""
        if self.options.served_model_name:
            return self.options.served_model_name
        return self.options.model or EMBEDDED_SERVED_NAME

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        pods = [] if self.options.external else [n for n in self.names if self.is_http(n)]
        tokens = None
        if not self.options.processes and not self.options.external:
            tokens = self.options.sim_tokens or TokenTable.from_model_dir(self.sim_model)
        for name in pods:  # pods first: the router is given their URLs
            self.start_engine(name, tokens)
        cfg = self.config()
        sock = bind_socket(cfg.host, self.options.port)
        self.port = sock.getsockname()[1]
        started = threading.Event()
        self._thread = threading.Thread(target=self._run_router, args=(cfg, sock, started),
                                        name="kvroute-router", daemon=True)
        self._thread.start()
        if not started.wait(30):
            raise RuntimeError(f"router did not start: {self._error!r}")
        if not self.options.external:
            for name in self.names:
                if name not in pods:
                    self.start_engine(name, tokens)
        self.wait_ready(self.options.ready_timeout, len(self.names))

    def start_engine(self, name: str, tokens: TokenTable | None = None) -> None:
        if self.is_http(name):
            self._start_http_engine(name, tokens)
            return
        hs = self._address(name, "hs")
        if self.options.processes:
            args = ["--kv-events-config", msgspec.json.encode(self.kv_config(name)).decode(),
                    *self._model_args()]
            for key, value in self.sim_options().items():
                flag = f"--{key.replace('_', '-')}"
                if isinstance(value, bool):  # a switch: present when on
                    args += [flag] if value else []
                else:
                    args += [flag, str(value)]
            self.procs[name] = spawn_sim_engine(hs, args, stdout=subprocess.DEVNULL,
                                                stderr=subprocess.DEVNULL)
        else:
            tokens = tokens or TokenTable.from_model_dir(self.sim_model)
            self.threads[name] = start_sim_engine(hs, tokens, kv_events=self.kv_config(name),
                                                  **self.sim_options())

    def _model_args(self) -> list[str]:
        return ["--model", str(self.sim_model)] if self.options.model else []

    def _start_http_engine(self, name: str, tokens: TokenTable | None) -> None:
        """A sim behind its HTTP face on a free port (a process prints the URL when ready)."""
        if self.options.processes:
            args = ["--port", "0", "--served-model-name", self.sim_served_name,
                    "--enable-prompt-tokens-details", *self._model_args(),
                    "--kv-events-config", msgspec.json.encode(self.kv_config(name)).decode()]
            for key, value in self.sim_options().items():
                args += [f"--{key.replace('_', '-')}", str(value)]
            proc = spawn_sim_engine(None, args, stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL)
            self.procs[name] = proc
            assert proc.stdout is not None
            for raw in proc.stdout:  # its ready line (the process exits on failure: EOF)
                line = raw.decode(errors="replace")
                if "HTTP face on " in line:
                    self.urls[name] = line.rsplit(" ", 1)[1].strip()
                    break
            else:
                raise RuntimeError(f"sim engine {name} exited ({proc.wait()}) before serving")
            return
        face = HttpFaceConfig(self.sim_model, self.sim_served_name, port=0,
                              enable_prompt_tokens_details=True)
        if self._renderer is None:
            self._renderer = Renderer.load(self.sim_model, served_model_name=self.sim_served_name,
                                           max_model_len=self.sim_options()["max_model_len"])
        tokens = tokens or TokenTable.from_model_dir(self.sim_model)
        thread = start_sim_engine(None, tokens, kv_events=self.kv_config(name), http=face,
                                  **self.sim_options())
        self.threads[name] = thread
        self.faces[name] = http_face = HttpFace(thread.engine, self._renderer).start()
        if not http_face.wait_ready() or http_face.error is not None:
            raise RuntimeError(f"sim engine {name}'s HTTP face did not start: "
                               f"{http_face.error!r}")
        self.urls[name] = http_face.url

    def wait_ready(self, timeout: float, engines: int | None = None) -> None:
        """Until /ready answers and the router sees ``engines`` (default: all) ready."""
        want = self.options.engines if engines is None else engines
        deadline = time.monotonic() + timeout
        with httpx.Client(base_url=self.base_url, timeout=5) as http:
            while time.monotonic() < deadline:
                if self.ready_engines() >= want and (
                        want == 0 or http.get("/ready").status_code == 200):
                    return
                time.sleep(0.05)  # polling a remote state with a deadline, not synchronising
        raise TimeoutError(f"{want} engines not ready after {timeout}s")

    def ready_engines(self) -> int:
        app_state = self._live()
        return len(app_state.fleet.attached) if app_state is not None else 0

    @property
    def state(self) -> RouterState:
        """The running app's live objects (fleet, client, index, ...), once its lifespan ran."""
        live = self._live()
        if live is None:
            raise RuntimeError("the router has not started yet")
        return live

    def _live(self) -> RouterState | None:
        app = getattr(self, "_app", None)
        live = getattr(app.state, "live", None) if app is not None else None
        return live if isinstance(live, RouterState) else None

    def _run_router(self, cfg: RouterConfig, sock: Any, started: threading.Event) -> None:
        import uvloop

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            await serve(cfg, sock, self._stop, on_started=started.set, on_app=self._set_app)

        try:
            uvloop.run(main())
        except BaseException as exc:  # surfaced by start()/stop()
            self._error = exc
            started.set()
        finally:
            with contextlib.suppress(OSError):  # already closed if the loop failed early
                sock.close()

    def _set_app(self, app: Any) -> None:
        self._app = app

    def begin_shutdown(self) -> None:
        """What SIGTERM does: readiness flips now, streams drain, then the server closes."""
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)

    def kill_engine(self, name: str) -> None:
        """A crash: SIGKILL, no ENGINE_CORE_DEAD (process engines only)."""
        self.procs[name].kill()
        self.procs[name].wait(10)

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            # A loop already closed: the router shut down on its own (begin_shutdown, drained).
            with contextlib.suppress(RuntimeError):  # closed between the check and the call
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(30)
        for face in self.faces.values():
            face.stop()
        for t in self.threads.values():
            t.stop()
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(10)
            if p.stdout is not None:  # an HTTP sim's, read for its ready line
                p.stdout.close()
        if self._tmp is not None:
            self._tmp.cleanup()

    def call(self, fn: Any, timeout: float = 30.0) -> Any:
        """Run a coroutine function on the router's loop (e.g. to read or poke its state)."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(fn(), self._loop).result(timeout)


def options(**kw: Any) -> ClusterOptions:
    return dataclasses.replace(ClusterOptions(), **kw)

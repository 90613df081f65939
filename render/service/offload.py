"""Big renders in a helper process: the encode and JSON encoding that hold the GIL leave the loop's.

A body over ``--inline-max-bytes`` (64 KiB) renders in one of ``--render-processes`` helper
processes of its serving process. The job sent is (path, body bytes); the answer is (JSON bytes,
prompt tokens, served model name): the helper decodes, renders and encodes with the same decoders,
Renderer code and encoder as the serving process, so its JSON is the in-process one byte for byte.
An error it raises comes back as the same exception (render/errors.py pickles whole) and is
answered by the same error path (serving/http_errors.py).

The render thread (``--render-processes 0``: always) stays the fallback, so no request waits for a
model load or is lost: until the helpers have loaded their models, while they are respawned after
one died (the requests it held render again in process), and for an error it could not send back.

The same machinery runs the template helpers of render/service/sandbox.py: a pool of one process
whose renders run under TemplateLimits (render/service/template_limits.py), with no fallback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing as mp
import os
import pickle
import signal
import threading
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, NamedTuple

from render.errors import BadRequestError, RenderError
from render.protocol import decode_request
from render.renderer import Renderer
from render.service import template_limits
from render.service.config import ServerConfig, TemplateLimits
from render.service.loading import Codecs, find_model, load_models
from serving.errors import ServiceUnavailableError
from serving.metrics import HelperMetrics

log = logging.getLogger("kvroute.render")

CHAT = "/v1/chat/completions/render"
COMPLETIONS = "/v1/completions/render"
TOKENIZE = "/tokenize"
DETOKENIZE = "/detokenize"
# A helper's start is a model load: as long as a serving process may take (asgi_server's
# startup_timeout), before the warm-up gives up waiting for its siblings.
WARM_UP_TIMEOUT = 900.0
MAX_RETRY_DELAY = 60.0


class Rendered(NamedTuple):
    payload: bytes  # the response JSON
    tokens: int  # prompt tokens rendered (0 for tokenize / detokenize: not counted)
    model: str  # the served model name


class Unsendable(Exception):
    """The helper raised an exception that does not survive pickling: the request renders again
    in process, where the same exception is raised and answered as it always was."""


# --- the helper process -----------------------------------------------------------------------


def _chat(renderer: Renderer, req: Any) -> tuple[object, int]:
    out = renderer.render_chat(req, array=True)
    return out, len(out.token_ids)


def _completion(renderer: Renderer, req: Any) -> tuple[object, int]:
    outs = renderer.render_completion(req)
    return outs, sum(len(o.token_ids) for o in outs)


def _tokenize(renderer: Renderer, req: Any) -> tuple[object, int]:
    return renderer.tokenize(req), 0


def _detokenize(renderer: Renderer, req: Any) -> tuple[object, int]:
    return renderer.detokenize(req), 0


class _Helper:
    """A helper process's models and codecs: the serving process's, loaded from the same config."""

    def __init__(self, cfg: ServerConfig, barrier: Any, limits: TemplateLimits | None) -> None:
        self.limits = limits
        self.registry = load_models(
            cfg.models, allow_request_chat_template=cfg.allow_request_chat_template,
            limits=cfg.request_limits, lora_modules=cfg.lora_modules,
            structured_outputs=cfg.structured_outputs)
        self.codecs = c = Codecs()
        self.barrier = barrier
        self.jobs: dict[str, tuple[Any, Callable[[Renderer, Any], tuple[object, int]]]] = {
            CHAT: (c.chat, _chat),
            COMPLETIONS: (c.completion, _completion),
            TOKENIZE: (c.tokenize, _tokenize),
            DETOKENIZE: (c.detokenize, _detokenize),
        }
        # A process's first render pays the template's and tokenizer's warm-up: paid here,
        # before the helper reports ready, not by the first big request.
        for name in self.registry.names():
            with contextlib.suppress(RenderError):  # a template that refuses this chat
                self.render(CHAT, c.encoder.encode(
                    {"model": name, "messages": [{"role": "user", "content": "Hello"}]}))
        if limits is not None:
            template_limits.install(limits)  # what it holds now is the base of the memory cap

    def render(self, path: str, body: bytes) -> Rendered:
        decoder, job = self.jobs[path]
        req = decode_request(decoder, body)
        renderer = find_model(self.registry, req.model)
        out, tokens = job(renderer, req)
        return Rendered(self.codecs.encoder.encode(out), tokens, renderer.served_model_name)


# A helper process's state: a pool initializer can leave it nowhere else. Never set in the
# serving process.
_helper: _Helper | None = None


def _init_helper(cfg: ServerConfig, barrier: Any, limits: TemplateLimits | None) -> None:
    global _helper
    # Ctrl-C reaches the whole process group; the serving process owns shutdown and stops its
    # helpers itself (a helper dying first would only be respawned mid-shutdown).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # One thread per helper (more helpers, more cores): fastokens' BPE thread pool would take
    # the serving process's core on a small machine, and one helper is meant to be one core's work.
    os.environ.setdefault("FASTOKENS_BPE_THREADS", "1")
    threading.Thread(target=_exit_with_parent, name="parent-watch", daemon=True).start()
    _helper = _Helper(cfg, barrier, limits)


def _exit_with_parent() -> None:
    """A killed serving process cannot shut its pool down: its helpers must not outlive it."""
    parent = mp.parent_process()
    if parent is not None:
        parent.join()
        os._exit(0)


def _warm_up() -> int:
    assert _helper is not None
    # Every helper holds one warm-up until all have loaded: none takes two, so when all warm-ups
    # are done every process is ready.
    _helper.barrier.wait(WARM_UP_TIMEOUT)
    return os.getpid()


def _render_job(path: str, body: bytes) -> Rendered:
    assert _helper is not None
    try:
        if _helper.limits is not None:
            return template_limits.run_limited(_helper.limits, _helper.render, path, body)
        return _helper.render(path, body)
    except Exception as exc:
        # An exception that fails to unpickle in the serving process breaks the whole pool.
        try:
            pickle.loads(pickle.dumps(exc))
        except Exception:
            raise Unsendable(f"{type(exc).__name__}: {exc}") from None
        raise


# --- the serving process ----------------------------------------------------------------------


async def result_unless_lost(job: asyncio.Future[Rendered], gone: asyncio.Event) -> Rendered:
    """``job``'s result, or BrokenProcessPool once ``gone`` is set before it ends: its pool lost
    a helper. The pool itself is meant to fail what it holds then, but CPython's
    ProcessPoolExecutor does not always, once shut down with ``wait=False`` as a lost pool is
    (gh-132969, fixed in 3.14: its manager thread can fail on the state shutdown resets): a
    render left pending for ever (the suite saw one, 2026-12-03). A job still pending is
    cancelled, also when the caller is."""
    if not job.done():
        waiter: asyncio.Future[Any] = asyncio.ensure_future(gone.wait())
        pending: set[asyncio.Future[Any]] = {job, waiter}
        try:
            await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            if not job.done():
                job.cancel()
    if job.cancelled() and gone.is_set():
        raise BrokenProcessPool("a render helper died with this render in its pool")
    return job.result()


class RenderHelper:
    """The helper processes of one serving process: started in the background, used once all have
    loaded their models, respawned when one dies. ``render_processes == 0``: never started.

    ``limits``: a template helper (render/service/sandbox.py), one process whose renders run
    under them; it answers through ``render_limited`` only."""

    def __init__(self, cfg: ServerConfig, metrics: HelperMetrics,
                 limits: TemplateLimits | None = None) -> None:
        self.cfg = cfg
        self.limits = limits
        self.processes = cfg.render_processes if limits is None else 1
        self.kind = "render helpers" if limits is None else "template helper"
        self.pool: ProcessPoolExecutor | None = None
        self.pids: tuple[int, ...] = ()  # the helpers of a ready pool
        self._ready, self._renders, self._in_flight, self._restarts = metrics
        self._task: asyncio.Task[None] | None = None
        self._spawning: asyncio.Future[tuple[ProcessPoolExecutor, list[Future[int]]]] | None = None
        self._pidfds: list[int] = []
        self._up = asyncio.Event()
        self._gone = asyncio.Event()  # set when the current pool loses a helper
        self._closed = False

    def start(self) -> None:
        if self.processes > 0:
            self._task = asyncio.create_task(self._start(), name="render-helper-start")

    async def wait_ready(self) -> None:
        """Returns once every helper has loaded its models (again, after a respawn)."""
        await self._up.wait()

    async def render(self, path: str, body: bytes) -> Rendered | None:
        """``body`` rendered in a helper if it is big and the helpers are ready; None: render it in
        process (small body, no helper ready, the helper died, or its error could not be sent)."""
        pool, gone = self.pool, self._gone
        if len(body) <= self.cfg.inline_max_bytes or not self.pids or pool is None:
            return None
        self._in_flight.inc()
        try:
            out = await result_unless_lost(
                asyncio.wrap_future(pool.submit(_render_job, path, body)), gone)
        except BrokenProcessPool:
            log.warning("render helper died with a request in flight: it renders in process; "
                        "respawning the helper")
            self._lost(pool)
            return None
        except Unsendable as exc:
            log.error("render helper could not send back its error (%s): rendering in process",
                      exc)
            return None
        except Exception:
            self._renders.inc()  # an error answer is a helper render too
            raise
        finally:
            self._in_flight.dec()
        self._renders.inc()
        return out

    async def render_limited(self, path: str, body: bytes) -> Rendered:
        """``body`` rendered by a template helper (ready: ``wait_ready``) under its limits; one
        call at a time, so a process that ends ended this render. Past the time limit plus
        KILL_GRACE the helper is killed (and respawned)."""
        limits, pool = self.limits, self.pool
        assert limits is not None, "a template helper's renders run under limits"
        if pool is None or not self.pids:
            raise ServiceUnavailableError("The chat-template helper process is restarting.")
        self._in_flight.inc()
        job = asyncio.wrap_future(pool.submit(_render_job, path, body))
        try:
            done, _ = await asyncio.wait({job}, timeout=limits.seconds + template_limits.KILL_GRACE)
            if not done:
                log.warning("template helper %s ran past its time limit: killing it", self.pids)
                for pid in self.pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                self._lost(pool)
                job.cancel()
                raise template_limits.over_time(limits)
            return job.result()
        except BrokenProcessPool:
            self._lost(pool)
            raise template_limits.process_ended(limits) from None
        except template_limits.OverTime:
            raise template_limits.over_time(limits) from None
        except Unsendable as exc:
            raise BadRequestError(f"The chat template failed on this request: {exc}",
                                  "chat_template") from None
        finally:
            self._renders.inc()
            self._in_flight.dec()

    async def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._spawning is not None:
            # Processes spawned while closing: shut down with the rest.
            with contextlib.suppress(Exception):
                self.pool, _ = await self._spawning
        self._forget()
        if self.pool is not None:
            # Waits for each helper's job in hand (or model load) to end: no orphan processes.
            await asyncio.to_thread(self.pool.shutdown, True, cancel_futures=True)
            self.pool = None

    async def _start(self) -> None:
        delay = 1.0
        loop = asyncio.get_running_loop()
        while True:
            # Spawning (pickling, fork/exec) blocks the calling thread: it runs off the loop.
            self._spawning = loop.run_in_executor(None, self._spawn)
            try:
                pool, warm_ups = await asyncio.shield(self._spawning)
            except Exception:
                self._spawning = None
                log.exception("cannot spawn a render helper; retrying in %.0f s", delay)
            else:
                self._spawning = None
                self.pool, self._gone = pool, asyncio.Event()
                try:
                    pids = await asyncio.gather(*map(asyncio.wrap_future, warm_ups))
                except Exception as exc:
                    log.error("render helper failed to start (%s: %s); retrying in %.0f s",
                              type(exc).__name__, exc, delay)
                    self.pool = None
                    pool.shutdown(wait=False)
                else:
                    self._watch(pool, pids)
                    return
            await asyncio.sleep(delay)
            delay = min(2 * delay, MAX_RETRY_DELAY)

    def _spawn(self) -> tuple[ProcessPoolExecutor, list[Future[int]]]:
        n = self.processes
        # spawn, not fork: the serving process runs threads and an event loop.
        ctx = mp.get_context("spawn")
        barrier = ctx.Barrier(n)
        pool = ProcessPoolExecutor(n, mp_context=ctx, initializer=_init_helper,
                                   initargs=(self.cfg, barrier, self.limits))
        # The pool spawns a process per call queued while none is idle: n warm-ups, n processes.
        return pool, [pool.submit(_warm_up) for _ in range(n)]

    def _watch(self, pool: ProcessPoolExecutor, pids: list[int]) -> None:
        """Ready; a helper's death is noticed when it happens (pidfd), not at the next render."""
        loop = asyncio.get_running_loop()
        dead = False
        for pid in pids:
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                dead = True
                continue
            except (AttributeError, OSError):
                continue  # no pidfd (not Linux >= 5.3): noticed at the next big render
            self._pidfds.append(fd)
            loop.add_reader(fd, self._lost, pool)
        self.pids = tuple(pids)
        self._ready.inc(len(pids))  # inc, not set: several template helpers share the gauge
        self._up.set()
        log.info("%s ready: pids %s", self.kind, ", ".join(map(str, pids)))
        # A line on stdout, as the worker's "ready on": what tests and tools wait on.
        print(f"kvroute render: {self.kind} ready (worker {os.getpid()}: pids "
              f"{', '.join(map(str, pids))})", flush=True)
        if dead:
            self._lost(pool)

    def _lost(self, pool: ProcessPoolExecutor) -> None:
        if pool is not self.pool or self._closed:
            return  # already replaced (the pidfd and the request in flight both tell)
        log.warning("render helper pool lost a process (pids %s); respawning",
                    ", ".join(map(str, self.pids)))
        self._restarts.inc()
        self._forget()
        self.pool = None
        # Every render in the pool falls back to the serving process (result_unless_lost). Not
        # cancel_futures: the renders see the pool gone, not a CancelledError.
        self._gone.set()
        pool.shutdown(wait=False)
        self._task = asyncio.create_task(self._start(), name="render-helper-start")

    def _forget(self) -> None:
        loop = asyncio.get_running_loop()
        for fd in self._pidfds:
            loop.remove_reader(fd)
            os.close(fd)
        self._pidfds.clear()
        self._ready.dec(len(self.pids))
        self.pids = ()
        self._up.clear()

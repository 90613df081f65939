"""bench/compare.py's oracle router: kvroute's routing cost over every engine's TRUE prefix cache.

    python bench/compare_oracle.py --port P --model NAME http://127.0.0.1:E0 http://...

For each chat request it renders the prompt once (kvroute's renderer: the engines' tokens), asks
every engine how many of those tokens it holds right now (``POST /sim/prefix_cache/match``, read
from the sim's block pool), and lets kvroute's own Policy choose with those answers in place of
its index's prediction, with its own in-flight counts as the load. The request is then forwarded
unchanged to the chosen engine's /v1/chat/completions and its answer streamed back.

Why this oracle: it differs from kvroute cache_aware only in what it knows (the caches as they
are at decision time, not as KV events and optimistic notes predict them), so the hit-rate ratio
to it measures how much kvroute's prediction loses; a "route to the longest true hit" rule would
instead measure a different load policy. It is a bench tool: its own CPU and latency are not
targets (it asks every engine per request), but it speaks raw HTTP (bench/compare_http.py) so
that its own CPU does not queue requests and change what it routes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import msgspec  # noqa: E402
from compare_http import RawPool  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import Response, StreamingResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402

from render.models import EMBEDDED_MODEL  # noqa: E402
from render.protocol import ChatCompletionRequest  # noqa: E402
from render.renderer import Renderer  # noqa: E402
from router.routing.policy import EngineLoad, Policy, PolicyConfig  # noqa: E402
from serving.server import ServeOptions, bind_socket, serve_asgi  # noqa: E402

_CHAT = msgspec.json.Decoder(ChatCompletionRequest)


@dataclass(frozen=True)
class _Hit:
    optimistic_tokens: int


class TrueCaches:
    """The Policy's PrefixMatcher, answered by the engines for the request at hand."""

    def __init__(self, cached: Mapping[str, int]) -> None:
        self.cached = cached

    def prepare(self, tokens: Sequence[int], namespace: Hashable) -> None:
        return None

    def match_keys(self, prompt: object, now: float) -> Mapping[str, _Hit]:
        return {engine: _Hit(n) for engine, n in self.cached.items()}

    def note_routed_keys(self, engine: str, prompt: object, now: float, ttl: float) -> None:
        return None

    def cut_short(self, engine: str, prompt: object, tokens: int, since: float) -> bool:
        """No KV events here: the oracle reads each cache whole at decision time and never
        discounts a prefix as being evicted (kvroute's PolicyConfig.eviction_window)."""
        return False


class Oracle:
    def __init__(self, urls: list[str], model: str) -> None:
        self.urls = urls
        self.renderer = Renderer.load(EMBEDDED_MODEL, served_model_name=model)
        self.policy = Policy(PolicyConfig(name="cache_aware"), TrueCaches({}))
        self.pools = {u: RawPool(*_host_port(u)) for u in urls}
        self.in_flight = dict.fromkeys(urls, 0)
        self.pending = dict.fromkeys(urls, 0)  # uncached prompt tokens not past their prefill

    async def cached(self, url: str, body: bytes) -> int:
        status, answer = await self.pools[url].post("/sim/prefix_cache/match", body)
        if status != 200:
            raise RuntimeError(f"{url}/sim/prefix_cache/match answered {status}: {answer[:200]!r}")
        return int(_MATCH.decode(answer).cached_tokens)

    async def choose(self, body: bytes) -> tuple[str, int]:
        tokens = list(self.renderer.render_chat(_CHAT.decode(body)).token_ids)
        query = _ENCODER.encode({"prompt_token_ids": tokens})
        hits = await asyncio.gather(*(self.cached(u, query) for u in self.urls))
        self.policy.index = TrueCaches(dict(zip(self.urls, hits, strict=True)))
        loads = [EngineLoad(u, self.in_flight[u], self.pending[u]) for u in self.urls]
        decision = self.policy.choose(tokens, None, loads, time.monotonic())
        return decision.engine, len(tokens) - decision.cached_tokens

    async def chat(self, request: Request) -> Response:
        body = await request.body()
        url, uncached = await self.choose(body)
        self.in_flight[url] += 1
        self.pending[url] += uncached
        try:
            status, ctype, answer = await self.pools[url].stream("/v1/chat/completions", body)
        except BaseException:
            self.in_flight[url] -= 1
            self.pending[url] -= uncached
            raise

        async def relay() -> AsyncIterator[bytes]:
            first = True
            try:
                async for chunk in answer:
                    if first:
                        self.pending[url] -= uncached
                        first = False
                    yield chunk
            finally:
                if first:
                    self.pending[url] -= uncached
                self.in_flight[url] -= 1

        return StreamingResponse(relay(), status_code=status, media_type=ctype.decode())

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()


class _Match(msgspec.Struct):
    cached_tokens: int


_MATCH = msgspec.json.Decoder(_Match)
_ENCODER = msgspec.json.Encoder()


def _host_port(url: str) -> tuple[str, int]:
    host, _, port = url.removeprefix("http://").rstrip("/").rpartition(":")
    return host, int(port)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("urls", nargs="+")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", required=True)
    a = p.parse_args(argv)
    oracle = Oracle(a.urls, a.model)

    async def health(request: Request) -> Response:
        return Response(b"ok")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        oracle.close()

    app = Starlette(routes=[Route("/v1/chat/completions", oracle.chat, methods=["POST"]),
                            Route("/health", health, methods=["GET"])], lifespan=lifespan)
    sock = bind_socket("127.0.0.1", a.port)
    stop = asyncio.Event()

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        import signal

        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)
        await serve_asgi(app, sock, ServeOptions(server="uvicorn", graceful_timeout=1.0),
                         stop.wait)

    import uvloop

    uvloop.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())

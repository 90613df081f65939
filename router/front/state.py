"""The router's typed state: built in the lifespan, read by every handler on the request path.

Starlette's ``request.state`` is untyped; the lifespan stores one ``RouterState`` under
``STATE_KEY`` (and render's ``RenderState`` under its own key, for render's endpoints), and the
handlers fetch it once through ``router_state``: from there on every field is typed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import msgspec

    from output.detokenize import TokenDecoder
    from radix import PrefixIndex
    from render.protocol import GenerateRequest
    from render.service.state import Models, RenderState
    from router.config import RouterConfig
    from router.front.beam_search import BeamAnswer
    from router.front.multi_prompt import RoutedGroup
    from router.front.render_client import RenderClient
    from router.kvfeed.kv_subscriber import KVSubscriber
    from router.link.transport import EngineLinks
    from router.obs.metrics import RouterMetrics
    from router.routing.adapters import Adapters
    from router.routing.discovered import Reconciler
    from router.routing.dispatch import Dispatcher, Routed
    from router.routing.drain import Drains
    from router.routing.fleet import Fleet

STATE_KEY = "kvroute.router"
# After the drain deadline has cut the open streams: how long they get to write their error event
# and [DONE], and so how long the HTTP server then waits for what is left.
CUT_GRACE = 2.0


@dataclass
class Lifecycle:
    """Readiness and the streams in progress, for probes and graceful drain (one per app)."""

    draining: bool = False
    active: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    # Ends every request still open (router/front/shutdown.py; set by the lifespan).
    cut: Callable[[], Awaitable[int]] | None = None

    def enter(self) -> None:
        self.active += 1
        self.idle.clear()

    def leave(self) -> None:
        self.active -= 1
        if self.active == 0:
            self.idle.set()

    async def drain(self, timeout: float) -> bool:
        """Flip readiness, then wait for streams to finish; True if all did in time. At the
        deadline what is still open is cut (an error event and [DONE]) and gets CUT_GRACE to
        write it."""
        self.draining = True
        if self.active == 0:
            return True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self.idle.wait()
        if self.active == 0:
            return True
        if self.cut is not None:
            await self.cut()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CUT_GRACE):
                    await self.idle.wait()
        return False


@dataclass(frozen=True, slots=True, eq=False)
class RouterState:
    """Everything the router's handlers read, built once per app by its lifespan."""

    config: RouterConfig
    render: RenderState  # the in-process render: models, limits, pool, codecs, metrics
    models: Models  # ``render.models``, read on every request
    remote: RenderClient | None  # set: render in the `kvroute render` service at --render-url
    client: EngineLinks  # every engine, over ZMQ or HTTP
    kv: KVSubscriber
    index: PrefixIndex
    dispatcher: Dispatcher
    fleet: Fleet
    drains: Drains  # drain-then-remove of engines (admin DELETE, discovery)
    discovery: Reconciler | None  # engines found by [discovery], None without
    lifecycle: Lifecycle
    router_metrics: RouterMetrics
    decoders: dict[str, TokenDecoder]  # by served model name
    generate_decoder: msgspec.json.Decoder[GenerateRequest]
    adapters: Adapters  # the LoRA adapters served (model names), loaded onto the engines
    # The requests on engines now, by request id (abort_requests, duplicate-id refusal).
    active: dict[str, Routed | RoutedGroup | BeamAnswer] = field(default_factory=dict)


def router_state(state: MutableMapping[str, Any]) -> RouterState:
    """The RouterState in a request's ``scope["state"]`` (put there by the lifespan)."""
    st = state[STATE_KEY]
    assert isinstance(st, RouterState), "the lifespan stores the RouterState under STATE_KEY"
    return st

"""Requests that bring their own chat template render in template helpers, under limits.

With ``--allow-request-chat-template`` a chat or tokenize request whose body carries a
``chat_template`` never renders in the serving process: it goes to one of
``--request-template-processes`` template helpers (render/service/offload.py's RenderHelper, one
process each), which renders it under ``--request-template-seconds`` and
``--request-template-memory-mib`` (render/service/template_limits.py). Past either limit the
answer is a 400 naming it and the service stays up; a helper that had to be killed is respawned.
Each helper renders one request at a time, so a helper that ends took only the render that ended
it; requests wait for a free helper, and for one that is (re)loading its models for at most
``READY_TIMEOUT`` seconds (then 503).
"""

from __future__ import annotations

import asyncio
import contextlib

import msgspec

from render.service.config import ServerConfig
from render.service.offload import CHAT, TOKENIZE, Rendered, RenderHelper
from serving.errors import ServiceUnavailableError, TemplateLimitError
from serving.metrics import RenderMetrics

READY_TIMEOUT = 60.0


class _Probe(msgspec.Struct):
    """The one field that decides where a body renders; the others are skipped unparsed."""

    chat_template: str | None = None


_PROBE = msgspec.json.Decoder(_Probe)


def brings_template(path: str, body: bytes) -> bool:
    """A chat or tokenize body with its own ``chat_template``. A body that does not decode is
    not one: the usual path answers its error."""
    if path not in (CHAT, TOKENIZE):
        return False
    try:
        return _PROBE.decode(body).chat_template is not None
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False


class TemplateSandbox:
    """The template helpers of one serving process."""

    def __init__(self, cfg: ServerConfig, metrics: RenderMetrics) -> None:
        self.limits = cfg.template_limits
        self.helpers = [RenderHelper(cfg, metrics.template_helpers, self.limits)
                        for _ in range(cfg.request_template_processes)]
        self._free: asyncio.Queue[RenderHelper] = asyncio.Queue()
        self._hits = {kind: metrics.template_limits.labels(kind, metrics.worker)
                      for kind in ("time", "memory", "ended")}

    def start(self) -> None:
        for helper in self.helpers:
            helper.start()
            self._free.put_nowait(helper)

    async def wait_ready(self) -> None:
        await asyncio.gather(*(h.wait_ready() for h in self.helpers))

    async def render(self, path: str, body: bytes) -> Rendered | None:
        """The answer for a body that brings its own chat template; None: it brings none."""
        if not brings_template(path, body):
            return None
        helper = await self._free.get()
        try:
            try:
                async with asyncio.timeout(READY_TIMEOUT):
                    await helper.wait_ready()
            except TimeoutError:
                raise ServiceUnavailableError(
                    "No chat-template helper process is ready: retry later.") from None
            try:
                return await helper.render_limited(path, body)
            except TemplateLimitError as exc:
                self._hits[exc.limit].inc()
                raise
        finally:
            self._free.put_nowait(helper)

    async def close(self) -> None:
        for helper in self.helpers:
            with contextlib.suppress(Exception):
                await helper.close()

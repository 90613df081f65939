"""``--render-work vllm-time``: a text request waits as long as vLLM's render takes on it, in
the pod's one render lane, without spending the CPU.

``--render-work vllm`` bills a pod's CPU what vLLM's frontend spends rendering; on a 2-core
machine a fleet of such pods cannot keep up at a full request rate when a router makes EVERY pod
render every request (vllm-router's cache_aware), though real pods, each with CPUs of its own,
can. For latency this mode keeps the time and drops the spending: a text request waits
``base + per_token * prompt tokens`` (``--render-time BASE_MS,US_PER_TOKEN``, measured on vLLM's
own render server: bench/compare_render_time.py). The waits take turns in one lane per pod:
vLLM 0.32's renderer runs the chat template and the tokenizer in a thread pool of
``--renderer-num-workers`` threads, 1 by default, so a pod renders one request at a time.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass
class RenderClock:
    """The time vLLM's render takes on a prompt: ``base + per_token * tokens`` seconds."""

    base: float
    per_token: float
    seconds: float = 0.0  # the waits so far, summed (GET /sim/render_work)
    _lane: asyncio.Lock = field(default_factory=asyncio.Lock)

    def cost(self, tokens: int) -> float:
        return self.base + self.per_token * tokens

    async def wait(self, tokens: int) -> None:
        """Wait in the pod's render lane for the time rendering ``tokens`` prompt tokens takes."""
        cost = self.cost(tokens)
        self.seconds += cost
        async with self._lane:
            await asyncio.sleep(cost)

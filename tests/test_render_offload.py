"""Where a render runs: small or predicted-cheap bodies on the event loop, big ones on a thread."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import pytest

from render.http_config import parse_args
from render.server import Models, RenderCost, load_models, render_in


def test_cost_rises_at_once_and_falls_slowly() -> None:
    cost = RenderCost()
    assert cost.predict(1000) is None
    cost.observe(1000, 0.001)  # 1 us per byte
    for _ in range(5):
        cost.observe(1000, 0.000001)  # segment-cache hits: 1 ns per byte
    # Five cheap samples must not make a fresh render look 1000x cheaper than it is.
    predicted = cost.predict(400_000)
    assert predicted is not None and predicted > 0.2
    cost.observe(1000, 0.01)  # a dear sample takes over at once
    assert cost.predict(1000) == pytest.approx(0.01)


@pytest.fixture(scope="module")
def models() -> Models:
    return Models(load_models(parse_args([])), 0)


def _where(models: Models, size: int, **overrides: Any) -> str:
    cfg = replace(parse_args([]), **overrides)
    renderer = models.get(None)
    pool = ThreadPoolExecutor(1, thread_name_prefix="render")

    async def go() -> str:
        loop_thread = threading.current_thread()
        ran_on = await asyncio.wait_for(
            render_in(models, cfg, pool, renderer, size, threading.current_thread), 10)
        return "loop" if ran_on is loop_thread else "thread"

    try:
        return asyncio.run(go())
    finally:
        pool.shutdown()


def test_small_bodies_render_on_the_loop_big_unknown_ones_on_a_thread(models: Models) -> None:
    cost = models.costs[models.get(None).served_model_name]
    cost.per_byte = None
    assert _where(models, 8192) == "loop"
    cost.per_byte = None
    assert _where(models, 20_000) == "thread"  # nothing measured yet: the safe side


def test_predicted_cheap_renders_inline_only_below_the_size_cap(models: Models) -> None:
    cost = models.costs[models.get(None).served_model_name]
    cost.per_byte = 1e-12  # everything predicts cheap
    assert _where(models, 60_000) == "loop"
    cost.per_byte = 1e-12
    # A 400 KB chat renders on a thread however cheap the last renders were (CI once saw a
    # 100k-token render block /health for 510 ms when the estimate said otherwise).
    assert _where(models, 400_000) == "thread"
    cost.per_byte = 1e-12
    assert _where(models, 60_000, inline_max_bytes=50_000) == "thread"
    cost.per_byte = 1e-12
    assert _where(models, 60_000, inline_budget_ms=0.0) == "thread"

"""The render pool starts every thread, with each model's tokenizer used in it and its chat
templates compiled, before any request.

A thread started on demand by the first big body, and its tokenizer's first encode there, cost
that one request ~45 ms of TTFT in bench/compare.py (render/service/state.py ``render_pool``).
"""

from __future__ import annotations

import threading

from render.renderer import Renderer
from render.service.state import render_pool


def _render_threads() -> set[int]:
    return {t.ident for t in threading.enumerate()
            if t.name.startswith("render_") and t.ident is not None}


def _encode_on(renderer: Renderer, text: str) -> tuple[int, list[int]]:
    return threading.get_ident(), renderer.encode(text, add_special_tokens=False)


def test_every_render_thread_is_started_before_the_first_render() -> None:
    renderer = Renderer.load()
    before = _render_threads()
    pool = render_pool(3, [renderer])
    try:
        started = _render_threads() - before
        assert len(started) == 3, "render_pool returned before starting its threads"
        text = "a big body's system prompt " * 200
        answers = [pool.submit(_encode_on, renderer, text).result() for _ in range(12)]
        # The work ran on the started threads, with the same ids as on the loop: none started
        # on demand.
        assert {ident for ident, _ in answers} <= started
        assert all(ids == renderer.encode(text, add_special_tokens=False) for _, ids in answers)
        assert _render_threads() - before == started
        # The model's chat templates were compiled too: the first chat does not pay it.
        assert renderer.files.chat_templates
        assert all(src in renderer.templates for src in renderer.files.chat_templates.values())
    finally:
        pool.shutdown(wait=True)

"""Requests' own chat templates render in a template helper under a time and a memory limit:
past either, a 400 naming it, and the service (and, where it can, the helper) stays up."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Iterator

import httpx
import psutil
import pytest

from render.errors import TemplateLimitError
from render.service.config import parse_args
from render.service.offload import CHAT, RenderHelper
from render.service.sandbox import brings_template
from serving.metrics import RenderMetrics
from tests.render_proc import TEMPLATE_READY, RenderService, render_service

HI = [{"role": "user", "content": "hi"}]
# A chat template that asks for ten gigabytes.
HUGE = "{{ 'x' * 10**10 }}"
# Ten billion loop steps, each in Jinja's compiled Python: the timer interrupts it.
LOOPS = ("{% for a in range(100000) %}{% for b in range(100000) %}{{ '' }}"
         "{% endfor %}{% endfor %}")
PLAIN = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
MIB = 256
# The serving process never renders a request template: its RSS stays near a loaded model's.
SERVING_RSS_LIMIT = 1500 << 20


@pytest.fixture(scope="module")
def service() -> Iterator[RenderService]:
    with render_service("--allow-request-chat-template", "--render-processes", "0",
                        "--request-template-seconds", "1",
                        "--request-template-memory-mib", str(MIB)) as s:
        s.wait_output(TEMPLATE_READY)
        yield s


def _chat(url: str, template: str, path: str = CHAT) -> httpx.Response:
    return httpx.post(url + path, json={"messages": HI, "chat_template": template}, timeout=120)


def _metric(url: str, name: str, label: str = "") -> float:
    total = 0.0
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name) and label in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def _template_pids(service: RenderService) -> list[list[int]]:
    return [[int(p) for p in m.group(2).split(",")] for m in service.wait_output(TEMPLATE_READY)]


def _limit_error(r: httpx.Response, limit_words: str) -> None:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "BadRequestError" and err["param"] == "chat_template", err
    assert limit_words in err["message"], err


def test_a_template_asking_for_ten_gigabytes_is_a_400_and_the_helper_lives(
        service: RenderService) -> None:
    url = service.url
    [helper] = _template_pids(service)[-1]
    for path in (CHAT, "/tokenize"):
        _limit_error(_chat(url, HUGE, path), f"{MIB} MiB")
    assert _metric(url, "kvroute_render_template_limits_total", 'limit="memory"') == 2
    assert httpx.get(url + "/health").status_code == 200
    # The same helper answers a good template next: the limit cost no process.
    r = _chat(url, PLAIN)
    assert r.status_code == 200, r.text
    assert psutil.pid_exists(helper) and len(_template_pids(service)) == 1
    assert psutil.Process(service.proc.pid).memory_info().rss < SERVING_RSS_LIMIT


def test_nested_loops_are_stopped_by_the_time_limit(service: RenderService) -> None:
    url = service.url
    before = _metric(url, "kvroute_render_template_limits_total", 'limit="time"')
    announced = len(_template_pids(service))
    _limit_error(_chat(url, LOOPS), "longer than the 1 s")
    assert _metric(url, "kvroute_render_template_limits_total", 'limit="time"') == before + 1
    assert _chat(url, PLAIN).status_code == 200
    assert len(_template_pids(service)) == announced  # interrupted, not killed
    assert _metric(url, "kvroute_render_template_helper_restarts_total") == 0


def test_a_helper_that_does_not_answer_in_time_is_killed_and_respawned(
        service: RenderService) -> None:
    """A helper whose own timer cannot act (a native call that never returns to Python; here the
    process is stopped) is killed from outside past the time limit."""
    url = service.url
    announced = len(_template_pids(service))
    [stuck] = _template_pids(service)[-1]
    os.kill(stuck, signal.SIGSTOP)
    _limit_error(_chat(url, PLAIN), "longer than the 1 s")
    assert _metric(url, "kvroute_render_template_helper_restarts_total") == 1
    assert httpx.get(url + "/health").status_code == 200
    # The next request waits for the respawned helper, then renders.
    r = _chat(url, PLAIN)
    assert r.status_code == 200, r.text
    assert r.json()["token_ids"] == httpx.post(
        url + "/tokenize", json={"prompt": "[user]hi", "add_special_tokens": False}
    ).json()["tokens"]
    pids = _template_pids(service)
    assert len(pids) == announced + 1 and stuck not in pids[-1]
    assert not psutil.pid_exists(stuck) or psutil.Process(stuck).status() == psutil.STATUS_ZOMBIE


def test_only_bodies_with_their_own_template_go_to_the_sandbox() -> None:
    body = json.dumps({"messages": HI, "chat_template": PLAIN}).encode()
    assert brings_template(CHAT, body) and brings_template("/tokenize", body)
    assert not brings_template("/v1/completions/render", body)
    assert not brings_template(CHAT, json.dumps({"messages": HI}).encode())
    assert not brings_template(CHAT, json.dumps({"messages": HI, "chat_template": None}).encode())
    # Bodies that do not decode are the usual path's to refuse.
    assert not brings_template(CHAT, body[:-2])
    assert not brings_template(CHAT, b'{"chat_template": 5}')


async def test_a_template_helper_that_dies_mid_render_is_a_400_and_respawns() -> None:
    """In process, deterministically: the render is in the helper when it is killed."""
    cfg = parse_args(["--allow-request-chat-template", "--request-template-seconds", "60"])
    helper = RenderHelper(cfg, RenderMetrics([]).template_helpers, cfg.template_limits)
    helper.start()
    try:
        await asyncio.wait_for(helper.wait_ready(), 120)
        [pid] = helper.pids
        body = json.dumps({"messages": HI, "chat_template": LOOPS}).encode()
        render = asyncio.create_task(helper.render_limited(CHAT, body))
        await asyncio.sleep(0)  # one step: the task has submitted the render (not a timing sleep)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(TemplateLimitError) as caught:
            await asyncio.wait_for(render, 60)
        assert caught.value.limit == "ended" and caught.value.status == 400
        await asyncio.wait_for(helper.wait_ready(), 120)
        assert helper.pids != (pid,)
        done = await asyncio.wait_for(helper.render_limited(CHAT, json.dumps(
            {"messages": HI, "chat_template": PLAIN}).encode()), 60)
        assert json.loads(done.payload)["token_ids"]
    finally:
        await helper.close()
    assert helper.pids == () and helper.pool is None

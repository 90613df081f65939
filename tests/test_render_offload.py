"""Where a render runs: small or predicted-cheap bodies on the event loop, bigger ones on a
thread, bodies over the inline cap in a helper process."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import random
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace
from typing import Any

import httpx
import msgspec
import psutil
import pytest
from starlette.exceptions import HTTPException

import render.errors
from render.errors import (
    BadRequestError,
    ContextLengthError,
    InputProcessorError,
    ModelNotFoundError,
    RenderError,
    TemplateLimitError,
    TemplateUnavailableError,
)
from render.protocol import ChatCompletionRequest
from render.service.config import parse_args
from render.service.loading import Codecs, load_models
from render.service.offload import Rendered, RenderHelper, Unsendable, result_unless_lost
from render.service.state import Models, RenderCost, render_in
from serving.errors import BodyTooLarge
from serving.http_errors import error_response
from serving.metrics import RenderMetrics
from tests.render_proc import (
    HELPERS_READY,
    TEMPLATE_READY,
    RenderService,
    render_server,
    render_service,
)


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
    return Models(load_models(parse_args([]).models), 0)


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


# --- bodies over the inline cap render in a helper process (render/service/offload.py) ---

QWEN = "Qwen/Qwen3-0.6B"
CHAT = "/v1/chat/completions/render"


def _text(words: int, seed: int) -> str:
    rng = random.Random(seed)
    vocab = ["".join(rng.choice("bcdfghklmnprstvz") + rng.choice("aeiou") for _ in range(3))
             for _ in range(3000)]
    return " ".join(rng.choice(vocab) for _ in range(words))


BIG = _text(10_500, 1)  # ~73 KB: over the 64 KiB cap once in a body


def _error_instances() -> list[Exception]:
    bad_json = msgspec.json.Decoder(ChatCompletionRequest)
    found: list[Exception] = []
    for raw in (b'{"messages": [{"role": "user"', b'{"messages": [{"role": 5}]}'):
        try:
            bad_json.decode(raw)
        except msgspec.DecodeError as e:
            found.append(e)
    return [
        *found,
        RenderError(418, "teapot", "Teapot", "x"),
        BadRequestError("bad field", "n"),
        ContextLengthError("too long", "messages"),
        InputProcessorError("out of vocabulary", "logit_bias"),
        TemplateUnavailableError("no template"),
        TemplateLimitError("too slow", "time"),
        ModelNotFoundError("nope"),
        BodyTooLarge(100),
        HTTPException(405, headers={"Allow": "POST"}),
        Unsendable("TypeError: x"),
    ]


async def _answer(exc: Exception) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    response = error_response(exc)
    return response.status_code, bytes(response.body), response.raw_headers


async def test_every_error_a_helper_can_raise_comes_back_whole() -> None:
    """A helper's exception crosses a pickle: the same type, fields and HTTP answer come back (an
    exception that failed to unpickle would break the helper pool)."""
    instances = _error_instances()
    assert {type(e) for e in instances} >= {
        cls for cls in vars(render.errors).values()
        if isinstance(cls, type) and issubclass(cls, Exception)
    }  # a new error class in render/errors.py must be added here
    assert {msgspec.ValidationError, msgspec.DecodeError} <= {type(e) for e in instances}
    for exc in instances:
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is type(exc)
        assert (back.args, vars(back), str(back)) == (exc.args, vars(exc), str(exc))
        assert await _answer(back) == await _answer(exc)


def _metrics(client: httpx.Client) -> dict[str, float]:
    """This worker's samples by metric name (one worker: the labels are all the same)."""
    out: dict[str, float] = {}
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(("kvroute_render_helper", "kvroute_render_template")):
            name = line.split("{", 1)[0]
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def _helper_pids(server_pid: int, service: RenderService | None = None) -> list[int]:
    """The spawned render helper processes of a serving process (not the resource tracker, nor
    the template helpers ``service`` announced)."""
    template = set() if service is None else {
        int(p) for m in service.wait_output(TEMPLATE_READY) for p in m.group(2).split(",")}
    return [c.pid for c in psutil.Process(server_pid).children()
            if "spawn_main" in " ".join(c.cmdline()) and c.pid not in template]


def _ready(client: httpx.Client) -> dict[str, float]:
    """The metrics of a worker whose helper has announced it is ready (and not died since)."""
    m = _metrics(client)
    assert m["kvroute_render_helpers_ready"] == 1, m
    return m


@pytest.fixture(scope="module")
def helper_server() -> Iterator[tuple[httpx.Client, RenderService]]:
    with render_service("--allow-request-chat-template") as service, \
            httpx.Client(base_url=service.url, timeout=60) as client:
        service.wait_helpers_ready()
        yield client, service


@pytest.fixture(scope="module")
def thread_server() -> Iterator[httpx.Client]:
    """The same service rendering big bodies in process (today's thread path)."""
    with render_server("--allow-request-chat-template", "--render-processes", "0") as url, \
            httpx.Client(base_url=url, timeout=60) as client:
        yield client


def _post(client: httpx.Client, path: str, body: object, chunked: bool = False) -> httpx.Response:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    content: bytes | Iterator[bytes] = iter([raw[:100], raw[100:]]) if chunked else raw
    return client.post(path, content=content, headers={"content-type": "application/json"})


_IDS = [(i * 7919) % 150_000 for i in range(12_000)]
BIG_BODIES: list[tuple[str, object]] = [
    (CHAT, {"messages": [{"role": "system", "content": "Summarise."},
                         {"role": "user", "content": BIG}], "request_id": "big", "stop": ["x"]}),
    ("/v1/completions/render", {"prompt": [BIG, BIG[:40_000]], "request_id": "big",
                                "return_token_offsets": True}),
    ("/tokenize", {"prompt": BIG, "return_token_strs": True}),
    ("/tokenize", {"messages": [{"role": "user", "content": BIG}]}),
    ("/detokenize", {"tokens": _IDS}),
]
BAD_BIG_BODIES: list[tuple[str, object]] = [
    (CHAT, json.dumps({"messages": [{"role": "user", "content": BIG}]}).encode()[:-3]),  # JSON
    (CHAT, {"messages": [{"role": "user", "content": BIG}], "temperature": "hot"}),  # type
    (CHAT, {"messages": [{"role": "user", "content": BIG}], "model": "nope"}),  # unknown model
    (CHAT, {"messages": [{"role": "user", "content": BIG}], "max_tokens": 10**6}),  # too long
    (CHAT, {"messages": [{"role": "user", "content": BIG}], "top_p": 7}),  # a render check
    (CHAT, {"messages": [{"role": "user", "content": BIG}],  # the template's raise_exception
            "chat_template": "{{ raise_exception('no ' ~ messages[0].content[:9]) }}"}),
    ("/v1/completions/render", {"prompt": [BIG, [1, 10**9]]}),  # token out of vocabulary
    ("/tokenize", {"messages": [{"role": "user", "content": BIG}],
                   "continue_final_message": True}),  # with add_generation_prompt
    ("/detokenize", {"tokens": [*_IDS, 10**9]}),
]


@pytest.mark.parametrize("chunked", [False, True], ids=["fast-route", "starlette"])
def test_big_bodies_render_in_the_helper_byte_identical(
        helper_server: tuple[httpx.Client, RenderService], thread_server: httpx.Client,
        chunked: bool) -> None:
    """Sized bodies take the raw ASGI route, chunked ones the Starlette handlers: in both the
    helper answers every big body, with the in-process JSON byte for byte."""
    helper, _ = helper_server
    before = _ready(helper)
    for path, body in BIG_BODIES:
        raw = json.dumps(body).encode()
        assert len(raw) > 65536, path
        mine, theirs = _post(helper, path, raw, chunked), _post(thread_server, path, raw, chunked)
        assert mine.status_code == theirs.status_code == 200, (path, mine.text[:300])
        assert mine.headers["content-type"] == theirs.headers["content-type"]
        assert mine.content == theirs.content, path
    after = _metrics(helper)
    renders = "kvroute_render_helper_renders_total"
    assert after[renders] == before[renders] + len(BIG_BODIES)
    assert _metrics(thread_server)[renders] == 0  # --render-processes 0: no helper at all
    assert _metrics(thread_server)["kvroute_render_helpers_ready"] == 0


def test_big_body_errors_from_the_helper_match_in_process_byte_for_byte(
        helper_server: tuple[httpx.Client, RenderService], thread_server: httpx.Client) -> None:
    helper, _ = helper_server
    before = _ready(helper)
    for path, body in BAD_BIG_BODIES:
        mine, theirs = _post(helper, path, body), _post(thread_server, path, body)
        assert 400 <= mine.status_code < 500, (path, mine.text[:300])
        assert (mine.status_code, mine.content) == (theirs.status_code, theirs.content)
        assert mine.headers["content-type"] == theirs.headers["content-type"]
    after = _metrics(helper)
    renders = "kvroute_render_helper_renders_total"
    # The body bringing its own chat template renders in the template helper instead.
    assert after[renders] == before[renders] + len(BAD_BIG_BODIES) - 1
    template = "kvroute_render_template_renders_total"
    assert after[template] == before[template] + 1
    assert after["kvroute_render_helper_restarts_total"] == before[
        "kvroute_render_helper_restarts_total"]  # no error broke the pool


def test_a_killed_helper_costs_no_request_and_is_respawned(
        helper_server: tuple[httpx.Client, RenderService], thread_server: httpx.Client) -> None:
    helper, service = helper_server
    before = _ready(helper)
    pools = len(service.wait_output(HELPERS_READY))  # helper pools announced so far
    [pid] = _helper_pids(service.proc.pid, service)
    path, body = BIG_BODIES[0]
    os.kill(pid, signal.SIGKILL)
    # Answered in process: the pool is broken (or already known dead and being respawned).
    r = _post(helper, path, body)
    assert r.status_code == 200, r.text[:300]
    assert r.content == _post(thread_server, path, body).content
    assert pid not in service.wait_helpers_ready(pools + 1)  # the respawned pool is ready
    after = _ready(helper)
    assert after["kvroute_render_helper_restarts_total"] == before[
        "kvroute_render_helper_restarts_total"] + 1
    assert after["kvroute_render_helper_renders_total"] == before[
        "kvroute_render_helper_renders_total"]  # that request did not render in a helper
    [respawned] = _helper_pids(service.proc.pid, service)
    assert respawned != pid
    assert _post(helper, path, body).content == r.content
    assert _metrics(helper)["kvroute_render_helper_renders_total"] == before[
        "kvroute_render_helper_renders_total"] + 1


async def test_a_helper_dying_mid_render_hands_the_request_back(models: Models) -> None:
    """In process, deterministically: the render is in the pool when its helper dies."""
    cfg = replace(parse_args([]), render_processes=1)
    helper = RenderHelper(cfg, RenderMetrics([]).helpers)
    helper.start()
    try:
        await asyncio.wait_for(helper.wait_ready(), 120)
        [pid] = helper.pids
        body = json.dumps({"messages": [{"role": "user", "content": BIG}],
                           "request_id": "r"}).encode()
        render = asyncio.create_task(helper.render(CHAT, body))
        await asyncio.sleep(0)  # one step: the task has submitted the render (not a timing sleep)
        assert helper.pool is not None
        os.kill(pid, signal.SIGKILL)
        assert await asyncio.wait_for(render, 60) is None  # the caller renders it in process
        await asyncio.wait_for(helper.wait_ready(), 120)
        assert helper.pids != (pid,)
        done = await asyncio.wait_for(helper.render(CHAT, body), 60)
        assert done is not None
        renderer = models.get(None)
        out = renderer.render_chat(msgspec.json.decode(body, type=ChatCompletionRequest))
        assert done == (Codecs().encoder.encode(out), len(out.token_ids), QWEN)
        # Small bodies are never sent.
        assert await helper.render(CHAT, b'{"messages": []}') is None
        respawned = helper.pids
    finally:
        await helper.close()
    assert helper.pids == () and helper.pool is None
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                   for p in respawned)


async def test_a_render_its_pool_never_answers_falls_back_once_the_pool_is_lost() -> None:
    """A pool that lost a helper but leaves its render pending (CPython's ProcessPoolExecutor
    after shutdown(wait=False), gh-132969: the suite once waited 60 s on one): the pool's loss
    ends the wait, as BrokenProcessPool, and the pending job is cancelled."""
    loop = asyncio.get_running_loop()
    job: asyncio.Future[Rendered] = loop.create_future()  # never answered
    gone = asyncio.Event()
    waiting = asyncio.create_task(result_unless_lost(job, gone))
    await asyncio.sleep(0)  # one step: the task waits on both (not a timing sleep)
    assert not waiting.done()
    gone.set()
    with pytest.raises(BrokenProcessPool):
        await asyncio.wait_for(waiting, 10)
    assert job.cancelled()


async def test_a_render_that_answers_is_its_answer_and_a_caller_leaving_cancels_it() -> None:
    loop = asyncio.get_running_loop()
    answered: asyncio.Future[Rendered] = loop.create_future()
    rendered = Rendered(b"{}", 3, QWEN)
    loop.call_soon(answered.set_result, rendered)
    gone = asyncio.Event()
    assert await result_unless_lost(answered, gone) == rendered
    assert not gone.is_set()
    failed: asyncio.Future[Rendered] = loop.create_future()
    failed.set_exception(Unsendable("x"))
    with pytest.raises(Unsendable):
        await result_unless_lost(failed, gone)
    pending: asyncio.Future[Rendered] = loop.create_future()
    caller = asyncio.create_task(result_unless_lost(pending, gone))
    await asyncio.sleep(0)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert pending.cancelled() and not gone.is_set()


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_two_workers_render_in_helpers_and_stop_with_no_orphan(sig: str) -> None:
    """`--workers 2`: each worker (not daemonic) has its helper; SIGTERM to the supervisor, or a
    terminal's Ctrl-C (SIGINT to the whole process group), stops every process."""
    with render_service("--workers", "2", workers=2, new_session=True) as service, \
            httpx.Client(base_url=service.url, timeout=60) as client:
        proc = service.proc
        service.wait_helpers_ready(2)  # each worker's helper
        # One keep-alive connection: one worker answers all of these.
        before = _ready(client)
        path, body = BIG_BODIES[0]
        assert _post(client, path, body).status_code == 200
        assert _metrics(client)["kvroute_render_helper_renders_total"] == before[
            "kvroute_render_helper_renders_total"] + 1
        tree = psutil.Process(proc.pid).children(recursive=True)
        workers = psutil.Process(proc.pid).children()
        assert len([p for p in workers if "spawn_main" in " ".join(p.cmdline())]) == 2
        assert any(_helper_pids(w.pid) for w in workers)
        if sig == "SIGTERM":
            proc.send_signal(signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(60) == 0
        _, alive = psutil.wait_procs(tree, timeout=30)
        assert alive == []


def test_a_killed_worker_leaves_no_helper_behind() -> None:
    """SIGKILL gives the worker no shutdown: its helper notices on its own and exits."""
    with render_service() as service:
        proc = service.proc
        service.wait_helpers_ready()
        helpers = [psutil.Process(pid) for pid in _helper_pids(proc.pid)]
        assert len(helpers) == 1
        proc.kill()
        proc.wait(10)
        _, alive = psutil.wait_procs(helpers, timeout=30)
        assert alive == []

"""router/front/fast_path.py: model POSTs served ahead of Starlette answer as the app does."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from devtools.cluster import ClusterOptions, LocalCluster
from router.config import Limits
from router.front.fast_path import FastPath
from serving.server import ROUTER_SERVER

MODEL = "Qwen/Qwen3-0.6B"
KEY = "sekret"
# The model POSTs take JSON only (vLLM's validate_json_request): every raw body here says so.
AUTH = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
# Headers that differ between any two answers whatever the path.
VOLATILE = {"date", "content-length", "x-kvroute-route"}


class CountingFastPath(FastPath):
    """The app's own fast path, counting the requests it took (so a test knows the path)."""

    taken = 0

    def take(self, scope: Any) -> Any:
        opener = super().take(scope)
        self.taken += opener is not None
        return opener


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    # On the default server; every other one passes tests/test_server_conformance.py.
    opts = ClusterOptions(engines=1, api_key=KEY, limits=Limits(max_body_bytes=4000),
                          http_server=ROUTER_SERVER)
    with LocalCluster(opts) as c:
        fast = c._app.fast
        c._app.fast = CountingFastPath(fast.api_key, fast.lifecycle, fast.errors)
        yield c


def _both(c: LocalCluster, path: str, body: bytes, headers: dict[str, str]
          ) -> tuple[httpx.Response, httpx.Response]:
    """The same request through the fast path, then through Starlette's stack alone."""
    app = c._app
    fast = app.fast
    with httpx.Client(base_url=c.base_url, timeout=30) as http:
        before = fast.taken
        quick = http.post(path, content=body, headers=headers)
        assert fast.taken == before + 1, "the fast path did not take it"
        app.fast = None
        try:
            slow = http.post(path, content=body, headers=headers)
        finally:
            app.fast = fast
    return quick, slow


def _same(quick: httpx.Response, slow: httpx.Response, body: bool = True) -> None:
    assert quick.status_code == slow.status_code, (quick.text, slow.text)
    assert quick.content == slow.content or not body
    drop = VOLATILE | ({"x-request-id"} if "x-request-id" not in quick.request.headers else set())
    assert ({k: v for k, v in quick.headers.items() if k not in drop}
            == {k: v for k, v in slow.headers.items() if k not in drop})


BAD = [
    ("/inference/v1/generate", b"{not json"),
    ("/inference/v1/generate", b'{"token_ids": [-1], "sampling_params": {}}'),
    ("/inference/v1/generate", b'{"token_ids": [1], "sampling_params": {"n": "x"}}'),
    ("/inference/v1/generate", b'{"token_ids": [], "sampling_params": {}}'),
    ("/inference/v1/generate", b'{"token_ids": [5], "sampling_params": {"top_p": 0}}'),
    ("/inference/v1/generate", b'{"model": "nope", "token_ids": [5], "sampling_params": {}}'),
    ("/v1/chat/completions", b'{"model": "Qwen/Qwen3-0.6B", "messages": []}'),
    ("/v1/chat/completions", b'{"model": "nope", "messages": [{"role": "user", "content": "x"}]}'),
    ("/v1/completions", b'{"model": "Qwen/Qwen3-0.6B", "prompt": "x", "max_tokens": -1}'),
    ("/v1/completions", b"[]"),
]


@pytest.mark.parametrize(("path", "body"), BAD)
def test_errors_are_the_apps_own(cluster: LocalCluster, path: str, body: bytes) -> None:
    quick, slow = _both(cluster, path, body, {**AUTH, "x-request-id": "err-1"})
    assert 400 <= quick.status_code < 500
    assert quick.headers["x-request-id"] == "err-1"
    assert set(quick.json()["error"]) == {"message", "type", "param", "code"}
    _same(quick, slow)


def test_a_generated_request_id_on_errors_and_answers(cluster: LocalCluster) -> None:
    quick, slow = _both(cluster, "/inference/v1/generate", b"{not json", AUTH)
    _same(quick, slow)
    assert quick.headers["x-request-id"].startswith("req-")
    assert quick.headers["x-request-id"] != slow.headers["x-request-id"]
    body = (b'{"request_id": "gen-id", "token_ids": [11, 12, 13], '
            b'"sampling_params": {"max_tokens": 2}}')
    quick, slow = _both(cluster, "/inference/v1/generate", body, AUTH)
    assert quick.status_code == slow.status_code == 200, quick.text
    assert quick.headers["x-request-id"].startswith("req-")


def test_answers_match_the_starlette_path(cluster: LocalCluster) -> None:
    gen = (b'{"request_id": "same", "token_ids": [101, 102, 103, 104], '
           b'"sampling_params": {"max_tokens": 4, "temperature": 0}, "return_token_ids": true}')
    quick, slow = _both(cluster, "/inference/v1/generate", gen, {**AUTH, "x-request-id": "g"})
    assert quick.status_code == 200, quick.text
    a, b = quick.json(), slow.json()
    assert a.pop("created") <= b.pop("created")  # seconds: the two may straddle one
    assert a == b and len(a["choices"][0]["token_ids"]) == 4
    assert quick.headers["content-length"] == str(len(quick.content))
    _same(quick, slow, body=False)  # the bodies: compared above, but for the timestamp
    assert quick.headers["x-kvroute-route"].startswith("engine=")
    chat = (b'{"model": "Qwen/Qwen3-0.6B", "max_tokens": 3, "temperature": 0, '
            b'"messages": [{"role": "user", "content": "hello there"}]}')
    quick, slow = _both(cluster, "/v1/chat/completions", chat, AUTH)
    assert quick.status_code == slow.status_code == 200, quick.text
    a, b = quick.json(), slow.json()
    for d in (a, b):  # ids and timestamps are per request
        d.pop("id")
        d.pop("created")
    assert a == b and a["usage"]["completion_tokens"] == 3
    stream = b'{"model": "Qwen/Qwen3-0.6B", "prompt": "a b c", "max_tokens": 3, "stream": true}'
    quick, slow = _both(cluster, "/v1/completions", stream, AUTH)
    assert quick.headers["content-type"].startswith("text/event-stream")
    assert quick.text.count("data: ") == slow.text.count("data: ") >= 4
    assert quick.text.endswith("data: [DONE]\n\n")


def test_auth_chunked_and_big_bodies_are_left_to_the_app(cluster: LocalCluster) -> None:
    fast = cluster._app.fast
    body = b'{"request_id": "auth", "token_ids": [7, 8], "sampling_params": {"max_tokens": 1}}'
    # One connection per refused request: an answer sent before the body was read may end
    # the connection (Hypercorn closes it), and the next request on it would fail.
    before = fast.taken
    for headers in ({}, {"authorization": "Bearer nope"}, {"authorization": KEY}):
        with httpx.Client(base_url=cluster.base_url, timeout=30) as http:
            r = http.post("/inference/v1/generate", content=body,
                          headers={**headers, "x-request-id": "a-1"})
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
            assert r.json()["error"]["type"] == "AuthenticationError"
            assert r.headers["x-request-id"] == "a-1"
    with httpx.Client(base_url=cluster.base_url, timeout=30) as http:
        big = b'{"token_ids": [' + b"5, " * 2000 + b'5], "sampling_params": {}}'
        r = http.post("/inference/v1/generate", content=big, headers=AUTH)
        assert r.status_code == 413 and r.json()["error"]["type"] == "Request Entity Too Large"
    with httpx.Client(base_url=cluster.base_url, timeout=30) as http:
        # No Content-Length (chunked): Starlette's read_body reads it.
        r = http.post("/inference/v1/generate", content=iter([body[:10], body[10:]]),
                      headers=AUTH)
        assert r.status_code == 200, r.text
        assert fast.taken == before  # none of these went through the fast path
        ok = http.post("/inference/v1/generate", content=body, headers=AUTH)
        assert ok.status_code == 200 and fast.taken == before + 1


SERVER_MODULES = ("hypercorn", "uvicorn", "granian", "h11", "starlette", "router", "render")


def test_answered_requests_leave_no_reference_cycles(cluster: LocalCluster) -> None:
    """Every request's server objects (stream, channel, scope, headers) go when it is answered,
    not at the next cyclic collection: nothing of the server's or the app's is left for the
    collector, on the fast path (plain and SSE) or through Starlette's stack."""
    app = cluster._app
    gen = b'{"request_id": "%s", "token_ids": [5, 6, 7], "sampling_params": {"max_tokens": 2}}'
    chat = (b'{"model": "Qwen/Qwen3-0.6B", "max_tokens": 3, "stream": true,'
            b' "messages": [{"role": "user", "content": "hi"}]}')
    with httpx.Client(base_url=cluster.base_url, timeout=30, headers=AUTH) as http:
        http.get("/v1/models").raise_for_status()  # the connection and lazy state, made first
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)  # the collector keeps what it finds, for a look
        try:
            for i in range(5):
                r = http.post("/inference/v1/generate", content=gen % f"cyc-fast-{i}".encode())
                assert r.status_code == 200, r.text
                with http.stream("POST", "/v1/chat/completions", content=chat) as r:
                    assert r.status_code == 200 and b"[DONE]" in r.read()
                # The same POST through Starlette's stack, on this connection (``_both`` opens
                # one per call, and a closed connection's objects are not a request's).
                fast, app.fast = app.fast, None
                try:
                    r = http.post("/inference/v1/generate", content=gen % f"cyc-slow-{i}".encode())
                    assert r.status_code == 200, r.text
                finally:
                    app.fast = fast
                assert http.get("/v1/models").status_code == 200
            gc.collect()
            left = [o for o in gc.garbage
                    if type(o).__module__.partition(".")[0] in SERVER_MODULES
                    or (isinstance(o, dict) and "asgi" in o)]  # an ASGI scope
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
    assert not left, sorted({type(o).__qualname__ for o in left})

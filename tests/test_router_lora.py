"""LoRA adapters through the router on sim engines: names, the engines' side, errors, the index.

The sims run with --enable-lora: what reaches them is checked on the wire (their list_loras
answers, the LoRA identity on their KV events as the router's index files them). The answers
and errors are vLLM's (entrypoints/openai/models/serving.py, vLLM 0.32); the real engine is the
referee in tests/test_lora_vllm.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from devtools.cluster import ClusterOptions, LocalCluster
from radix import namespace_for
from render.service.lora_modules import LoRAModule
from router.config import Control
from router.routing.policy import PolicyConfig
from tests.render_proc import render_server
from tests.waits import eventually


def adapter(root: Path, name: str, rank: int = 8) -> str:
    path = root / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": 16,
        "target_modules": ["q_proj", "v_proj"], "bias": "none"}))
    return str(path)


@pytest.fixture(scope="module")
def adapters_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("adapters")


@pytest.fixture(scope="module")
def cluster(adapters_dir: Path) -> Iterator[LocalCluster]:
    opts = ClusterOptions(
        engines=2, sim={"step_time": 0.002, "block_size": 16, "enable_lora": True,
                        "max_loras": 2, "max_cpu_loras": 4},
        lora_modules=(LoRAModule("sql", adapter(adapters_dir, "sql")),),
        allow_runtime_lora_updating=True)
    with LocalCluster(opts) as c:
        eventually(lambda: len(_on_loop(c, lambda: c.state.adapters.usable(
            c.state.adapters.by_name["sql"]))) == 2)
        yield c


@pytest.fixture
def http(cluster: LocalCluster) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=cluster.base_url, timeout=30) as client:
        yield client


def _on_loop(c: LocalCluster, fn: Any) -> Any:
    """``fn()`` on the router's loop (its state is the loop's, not the test thread's)."""
    async def call() -> Any:
        return fn()
    return c.call(call)


def _list_loras(c: LocalCluster, engine: str) -> list[int]:
    async def call() -> list[int]:
        return list(await c.state.client.call_utility(engine, "list_loras"))
    return list(c.call(call))


def _base(c: LocalCluster) -> str:
    return str(c.state.models.registry.names()[0])


def _chat(model: str, content: str, **kw: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}],
            "max_tokens": 3, **kw}


def test_models_lists_each_adapter_under_its_base(cluster: LocalCluster, http: httpx.Client,
                                                  adapters_dir: Path) -> None:
    data = http.get("/v1/models").json()["data"]
    base = _base(cluster)
    assert [m["id"] for m in data] == [base, "sql"]
    card = data[1]
    assert (card["parent"], card["root"], card["object"]) == (base, str(adapters_dir / "sql"),
                                                              "model")
    assert card["max_model_len"] is None and data[0]["parent"] is None


def test_an_adapter_request_reaches_the_engine_with_its_lora(cluster: LocalCluster,
                                                            http: httpx.Client) -> None:
    content = "Which tables hold the orders of last week? " * 8
    resp = http.post("/v1/chat/completions", json=_chat("sql", content))
    assert resp.status_code == 200, resp.text
    assert resp.json()["model"] == "sql"
    engine = resp.headers["x-kvroute-route"].split(";")[0].removeprefix("engine=")
    assert 1 in _list_loras(cluster, engine)
    # The adapter's name renders with the base model: the same prompt tokens.
    sql = http.post("/v1/chat/completions/render", json=_chat("sql", content)).json()
    base = http.post("/v1/chat/completions/render", json=_chat(_base(cluster), content)).json()
    assert sql["token_ids"] == base["token_ids"] and sql["model"] == "sql"
    tokens = sql["token_ids"]
    index = cluster.state.index

    def cached(lora: str | None) -> int:
        async def call() -> int:
            import time
            m = index.match(tokens, namespace_for(lora, None), time.monotonic())
            return m[engine].confirmed_tokens
        return int(cluster.call(call))

    # The engine's KV events carry the adapter: its blocks land in the adapter's namespace.
    eventually(lambda: cached("sql") >= 16 * (len(tokens) // 16) - 16)
    assert cached(None) == 0


def test_render_tokenize_and_generate_take_the_adapter_name(cluster: LocalCluster,
                                                            http: httpx.Client) -> None:
    tok = http.post("/tokenize", json={"model": "sql", "prompt": "SELECT 1"})
    assert tok.status_code == 200, tok.text
    comp = http.post("/v1/completions/render", json={"model": "sql", "prompt": "SELECT 1"})
    assert comp.status_code == 200 and comp.json()[0]["model"] == "sql"
    gen = http.post("/inference/v1/generate", json=comp.json()[0])
    assert gen.status_code == 200, gen.text
    several = http.post("/v1/completions", json={"model": "sql", "prompt": ["a b", "c d"],
                                                 "max_tokens": 2})
    assert several.status_code == 200 and several.json()["model"] == "sql"


def test_load_request_unload(cluster: LocalCluster, http: httpx.Client,
                             adapters_dir: Path) -> None:
    path = adapter(adapters_dir, "extra")
    resp = http.post("/v1/load_lora_adapter", json={"lora_name": "extra", "lora_path": path})
    assert (resp.status_code, resp.text) == (200, "Success: LoRA adapter 'extra' added "
                                                  "successfully.")
    extra = _on_loop(cluster, lambda: cluster.state.adapters.by_name["extra"])
    assert extra.lora_int_id > 1 and extra.lora_path == path
    # Loaded onto every engine before the answer.
    assert all(extra.lora_int_id in _list_loras(cluster, e) for e in cluster.names)
    assert "extra" in [m["id"] for m in http.get("/v1/models").json()["data"]]
    ok = http.post("/v1/completions", json={"model": "extra", "prompt": "hi", "max_tokens": 2})
    assert ok.status_code == 200 and ok.json()["model"] == "extra"
    resp = http.post("/v1/unload_lora_adapter", json={"lora_name": "extra"})
    assert (resp.status_code, resp.text) == (200, "Success: LoRA adapter 'extra' removed "
                                                  "successfully.")
    assert all(extra.lora_int_id not in _list_loras(cluster, e) for e in cluster.names)
    gone = http.post("/v1/completions", json={"model": "extra", "prompt": "hi",
                                              "max_tokens": 2})
    assert gone.status_code == 404
    assert gone.json()["error"] == {
        "message": f"The model `extra` does not exist. Valid aliases: {_base(cluster)}.",
        "type": "NotFoundError", "param": "model", "code": 404}
    again = http.post("/v1/unload_lora_adapter", json={"lora_name": "extra"})
    assert again.status_code == 404 and again.json()["error"] == {
        "message": "The lora adapter 'extra' cannot be found.", "type": "NotFoundError",
        "param": None, "code": 404}
    # Loaded again, it gets a new id (vLLM never reuses one).
    http.post("/v1/load_lora_adapter", json={"lora_name": "extra", "lora_path": path})
    again_id = _on_loop(cluster, lambda: cluster.state.adapters.by_name["extra"].lora_int_id)
    assert again_id > extra.lora_int_id
    http.post("/v1/unload_lora_adapter", json={"lora_name": "extra"})


def test_load_inplace_keeps_the_id(cluster: LocalCluster, http: httpx.Client,
                                   adapters_dir: Path) -> None:
    moved = adapter(adapters_dir, "sql-v2")
    resp = http.post("/v1/load_lora_adapter", json={"lora_name": "sql", "lora_path": moved,
                                                     "load_inplace": True})
    assert resp.status_code == 200, resp.text
    sql = _on_loop(cluster, lambda: cluster.state.adapters.by_name["sql"])
    assert (sql.lora_int_id, sql.lora_path, sql.load_inplace) == (1, moved, False)
    card = next(m for m in http.get("/v1/models").json()["data"] if m["id"] == "sql")
    assert card["root"] == moved
    back = http.post("/v1/load_lora_adapter", json={
        "lora_name": "sql", "lora_path": str(adapters_dir / "sql"), "load_inplace": True})
    assert back.status_code == 200


@pytest.mark.parametrize(("body", "status", "error"), [
    ({"lora_name": "", "lora_path": "/x"}, 400,
     ("Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput")),
    ({"lora_name": "sql", "lora_path": "/x"}, 400,
     ("The lora adapter 'sql' has already been loaded. If you want to load the adapter in "
      "place, set 'load_inplace' to True.", "InvalidUserInput")),
    ({"lora_name": "nope", "lora_path": "/no/such/adapter"}, 404,
     ("Loading lora nope failed: No adapter found for /no/such/adapter", "NotFoundError")),
])
def test_load_errors_are_vllms(cluster: LocalCluster, http: httpx.Client, body: dict[str, Any],
                               status: int, error: tuple[str, str]) -> None:
    resp = http.post("/v1/load_lora_adapter", json=body)
    assert resp.status_code == status
    assert resp.json()["error"] == {"message": error[0], "type": error[1], "param": None,
                                    "code": status}
    assert [m["id"] for m in http.get("/v1/models").json()["data"]] == [_base(cluster), "sql"]


def test_more_load_errors(cluster: LocalCluster, http: httpx.Client, adapters_dir: Path) -> None:
    base = _base(cluster)
    clash = http.post("/v1/load_lora_adapter", json={"lora_name": base, "lora_path": "/x"})
    assert clash.status_code == 400 and clash.json()["error"]["message"] == (
        f"The lora adapter '{base}' conflicts with a served base model.")
    # An adapter the engines refuse (rank over --max-lora-rank): the engine's failure, a 500.
    big = http.post("/v1/load_lora_adapter", json={
        "lora_name": "big", "lora_path": adapter(adapters_dir, "big", rank=64)})
    assert big.status_code == 500
    assert big.json()["error"]["type"] == "InternalServerError"
    assert big.json()["error"]["message"].startswith(
        "Call to add_lora method failed: Worker failed with error 'LoRA rank 64 is greater "
        "than max_lora_rank 16.'")
    missing = http.post("/v1/load_lora_adapter", json={"lora_name": "x"})
    assert missing.status_code == 400 and "lora_path" in missing.json()["error"]["message"]
    empty = http.post("/v1/unload_lora_adapter", json={"lora_name": ""})
    assert empty.status_code == 400 and empty.json()["error"]["message"] == (
        "'lora_name' needs to be provided to unload a LoRA adapter.")


def test_without_the_switch_or_lora_engines(adapters_dir: Path) -> None:
    """No VLLM_ALLOW_RUNTIME_LORA_UPDATING: no load/unload endpoints (vLLM has none then). Sims
    without --enable-lora: an adapter's requests have nowhere to go (503), base ones are served."""
    opts = ClusterOptions(engines=1, sim={"step_time": 0.002},
                          lora_modules=(LoRAModule("sql", adapter(adapters_dir, "plain")),))
    with LocalCluster(opts) as c, httpx.Client(base_url=c.base_url, timeout=30) as http:
        for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
            assert http.post(path, json={"lora_name": "a", "lora_path": "/a"}).status_code == 404
        resp = http.post("/v1/chat/completions", json=_chat("sql", "hi"))
        assert resp.status_code == 503
        assert resp.json()["error"]["message"] == (
            "No healthy engine has the LoRA adapter 'sql' loaded; retry later.")
        assert http.post("/v1/chat/completions", json=_chat(_base(c), "hi")).status_code == 200
        assert _on_loop(c, lambda: c.state.adapters.engines["engine-0"].unsupported)


def test_requests_prefer_the_engines_holding_their_adapter(adapters_dir: Path) -> None:
    """Engines keeping one adapter loaded (max_cpu_loras 1): each holds the last one it loaded.
    Cold prompts of an adapter go to its holder, which the router learns from list_loras after
    a request made an engine load it."""
    opts = ClusterOptions(
        engines=2, policy=PolicyConfig(home_memory=0),
        sim={"step_time": 0.002, "block_size": 16, "enable_lora": True, "max_loras": 1,
             "max_cpu_loras": 1},
        lora_modules=(LoRAModule("a", adapter(adapters_dir, "pref-a")),
                      LoRAModule("b", adapter(adapters_dir, "pref-b"))))
    with LocalCluster(opts) as c, httpx.Client(base_url=c.base_url, timeout=30) as http:
        adapters = c.state.adapters
        a, b = adapters.by_name["a"], adapters.by_name["b"]
        eventually(lambda: len(_on_loop(c, lambda: adapters.usable(b))) == 2)
        # Both loaded a, then b: each holds b only.
        eventually(lambda: _on_loop(c, lambda: adapters.holders(b)) == set(c.names))
        assert _on_loop(c, lambda: adapters.holders(a)) == set()

        def engine_of(model: str, content: str) -> str:
            resp = http.post("/v1/chat/completions", json=_chat(model, content))
            assert resp.status_code == 200, resp.text
            return resp.headers["x-kvroute-route"].split(";")[0].removeprefix("engine=")

        first = engine_of("a", "prompt number 0")
        other = next(n for n in c.names if n != first)
        eventually(lambda: _on_loop(c, lambda: adapters.holders(a)) == {first})
        assert _list_loras(c, first) == [a.lora_int_id]
        assert _on_loop(c, lambda: adapters.holders(b)) == {other}
        for i in range(1, 9):  # cold prompts, equal loads: the holder wins every time
            assert engine_of("a", f"prompt number {i}") == first
            assert engine_of("b", f"prompt number {i}") == other


def test_render_service_and_remote_render_take_adapter_names(adapters_dir: Path) -> None:
    """`kvroute render --lora-modules`: adapter names render with the base model and are listed.
    A router rendering remotely sends its own adapters' requests (loaded at run time, unknown to
    the service) under the base model's name."""
    path = adapter(adapters_dir, "remote")
    with render_server("--render-processes", "0", "--lora-modules", f"svc={path}") as url:
        with httpx.Client(base_url=url, timeout=30) as svc:
            models = svc.get("/v1/models").json()["data"]
            assert [(m["id"], m["parent"], m["root"]) for m in models][1:] == [
                ("svc", models[0]["id"], path)]
            gen = svc.post("/v1/chat/completions/render", json=_chat("svc", "hi"))
            base = svc.post("/v1/chat/completions/render", json=_chat(models[0]["id"], "hi"))
            assert gen.status_code == 200 and gen.json()["model"] == "svc"
            assert gen.json()["token_ids"] == base.json()["token_ids"]
        opts = ClusterOptions(engines=1, render_url=url, allow_runtime_lora_updating=True,
                              sim={"step_time": 0.002, "enable_lora": True})
        with LocalCluster(opts) as c, httpx.Client(base_url=c.base_url, timeout=30) as http:
            loaded = http.post("/v1/load_lora_adapter",
                               json={"lora_name": "late", "lora_path": path})
            assert loaded.status_code == 200, loaded.text
            for route, body in (("/v1/chat/completions", _chat("late", "hi")),
                                ("/v1/completions", {"model": "late", "prompt": "hi",
                                                     "max_tokens": 2})):
                resp = http.post(route, json=body)
                assert resp.status_code == 200, resp.text
                assert resp.json()["model"] == "late"


@pytest.mark.slow
def test_engines_that_turn_ready_later_get_every_adapter(adapters_dir: Path) -> None:
    """A joining engine gets the static and the run-time adapters; a restarted engine process
    (it holds none) gets them again."""
    opts = ClusterOptions(
        engines=1, processes=True, control=Control(admin_key="admin-secret"),
        sim={"step_time": 0.002, "enable_lora": True, "max_loras": 2},
        lora_modules=(LoRAModule("sql", adapter(adapters_dir, "join-sql")),),
        allow_runtime_lora_updating=True)
    with LocalCluster(opts) as c, httpx.Client(base_url=c.base_url, timeout=30) as http:
        late = http.post("/v1/load_lora_adapter", json={
            "lora_name": "late", "lora_path": adapter(adapters_dir, "join-late")})
        assert late.status_code == 200, late.text
        joined = http.post("/admin/engines", headers={"authorization": "Bearer admin-secret"},
                           json={"name": "joined", "handshake": f"ipc://{c.dir}/joined.hs"})
        assert joined.status_code == 200, joined.text
        c.start_engine("joined")
        ids = [1, 2]  # sql, then late
        eventually(lambda: _on_loop(c, lambda: c.state.adapters.engines.get("joined") is not None
                                    and c.state.adapters.engines["joined"].usable == set(ids)))
        assert _list_loras(c, "joined") == ids
        c.kill_engine("engine-0")
        c.start_engine("engine-0")
        eventually(lambda: "engine-0" in c.state.client.engines
                   and _list_loras_or_none(c, "engine-0") == ids)
        for model in ("sql", "late"):
            resp = http.post("/v1/chat/completions", json=_chat(model, "after the restart"))
            assert resp.status_code == 200, resp.text


def _list_loras_or_none(c: LocalCluster, engine: str) -> list[int] | None:
    """list_loras, or None while the engine is not back (its link down or not yet ready)."""
    try:
        return _list_loras(c, engine)
    except Exception:  # the link's errors while the engine restarts
        return None

"""/admin/*: off without an admin key, the admin key (only) opens it, addresses are checked,
the engine count is capped, engines are listed and drained then removed; keys never on argv."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from devtools.cluster import ClusterOptions, LocalCluster
from router.config import ConfigError, Control
from router.main import parse
from tests.waits import eventually

MODEL = "Qwen/Qwen3-0.6B"
ADMIN = {"authorization": "Bearer admin-secret"}




def _healthy(http: httpx.Client) -> None:
    assert http.get("/health").status_code == 200
    assert http.get("/ready").status_code == 200
    r = http.post("/v1/completions", json={"model": MODEL, "prompt": "still fine",
                                          "max_tokens": 2})
    assert r.status_code == 200, r.text


def _healthy_as_client(c: LocalCluster) -> None:
    with httpx.Client(base_url=c.base_url, timeout=30,
                      headers={"authorization": "Bearer client-secret"}) as http:
        _healthy(http)


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One engine, a client key and an admin key, at most 2 engines."""
    opts = ClusterOptions(engines=1, sim={"step_time": 0.002}, api_key="client-secret",
                          control=Control(admin_key="admin-secret", max_engines=2))
    with LocalCluster(opts) as c:
        yield c


def test_admin_is_off_without_an_admin_key() -> None:
    with LocalCluster(ClusterOptions(engines=1, sim={"step_time": 0.002})) as c:
        with httpx.Client(base_url=c.base_url, timeout=30) as http:
            join = {"name": "x", "handshake": f"ipc://{c.dir}/x.hs"}
            for r in (http.post("/admin/engines", json=join), http.get("/admin/engines"),
                      http.delete("/admin/engines/engine-0"),
                      http.post("/admin/engines", json=join, headers=ADMIN)):
                assert r.status_code == 404, r.text
                assert r.json()["error"]["type"] == "NotFoundError"
            assert list(c.state.client.engines) == ["engine-0"]
            assert not (c.dir / "x.hs").exists()
            _healthy(http)


def test_only_the_admin_key_opens_admin(guarded: LocalCluster) -> None:
    client = {"authorization": "Bearer client-secret"}
    with httpx.Client(base_url=guarded.base_url, timeout=30) as http:
        for headers in ({}, client, {"authorization": "Bearer admin-secretX"}):
            r = http.get("/admin/engines", headers=headers)
            assert r.status_code == 401, (headers, r.text)
            assert r.json()["error"]["type"] == "AuthenticationError"
        listed = http.get("/admin/engines", headers=ADMIN)
        assert listed.status_code == 200
        assert [e["name"] for e in listed.json()["engines"]] == ["engine-0"]
        # The admin key is no client key.
        r = http.post("/v1/completions", headers=ADMIN,
                      json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 401
        r = http.post("/v1/completions", headers=client,
                      json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 200


@pytest.mark.parametrize("case", ["outside_dir", "regular_file", "relative", "dotdot",
                                  "foreign_host", "wildcard", "scheme", "kv_foreign"])
def test_join_addresses_are_checked(guarded: LocalCluster, tmp_path: Path, case: str) -> None:
    victim = tmp_path / "victim.txt"  # outside the cluster's ipc directory
    victim.write_text("keep me")
    inside = guarded.dir / "precious.txt"
    inside.write_text("keep me too")
    handshake, field = {
        "outside_dir": (f"ipc://{victim}", "handshake"),
        "regular_file": (f"ipc://{inside}", "handshake"),
        "relative": ("ipc://relative.hs", "handshake"),
        "dotdot": (f"ipc://{guarded.dir}/../{victim.name}", "handshake"),
        "foreign_host": ("tcp://203.0.113.7:29999", "handshake"),
        "wildcard": ("tcp://0.0.0.0:29999", "handshake"),
        "scheme": ("inproc://x", "handshake"),
        "kv_foreign": (f"ipc://{guarded.dir}/ok.hs", "kv_events"),
    }[case]
    body: dict[str, Any] = {"name": f"j-{case}", "handshake": handshake}
    if case == "kv_foreign":
        body["kv_events"] = "tcp://203.0.113.7:5557"
    with httpx.Client(base_url=guarded.base_url, timeout=30, headers=ADMIN) as http:
        r = http.post("/admin/engines", json=body)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == field
        assert victim.read_text() == "keep me" and inside.read_text() == "keep me too"
        assert list(guarded.state.client.engines) == ["engine-0"]
        assert not (guarded.dir / "ok.hs").exists()
    _healthy_as_client(guarded)


def test_engine_count_is_capped(guarded: LocalCluster) -> None:
    with httpx.Client(base_url=guarded.base_url, timeout=30, headers=ADMIN) as http:
        first = http.post("/admin/engines",
                          json={"name": "spare", "handshake": f"ipc://{guarded.dir}/spare.hs"})
        assert first.status_code == 200, first.text
        for i in range(5):
            r = http.post("/admin/engines", json={
                "name": f"over-{i}", "handshake": f"ipc://{guarded.dir}/over-{i}.hs"})
            assert r.status_code == 409, r.text
            assert "max_engines" in r.json()["error"]["message"]
            assert not (guarded.dir / f"over-{i}.hs").exists()
        assert sorted(guarded.state.client.engines) == ["engine-0", "spare"]
        # Removing one makes room again.
        gone = http.delete("/admin/engines/spare")
        assert gone.status_code == 200 and gone.json()["removed"] is True
        assert sorted(e["name"] for e in http.get("/admin/engines").json()["engines"]) == [
            "engine-0"]
        assert http.delete("/admin/engines/spare").status_code == 404
    _healthy_as_client(guarded)


def test_remove_drains_then_unlinks() -> None:
    opts = ClusterOptions(engines=2, sim={"step_time": 0.01},
                          control=Control(admin_key="admin-secret"))
    with LocalCluster(opts) as c, httpx.Client(base_url=c.base_url, timeout=60) as http:
        body = {"model": MODEL, "prompt": "a long one", "max_tokens": 150, "stream": True,
                "ignore_eos": True}
        with http.stream("POST", "/v1/completions", json=body) as stream:
            assert stream.status_code == 200
            engine = stream.headers["x-kvroute-route"].split(";")[0].removeprefix("engine=")
            other = next(n for n in c.names if n != engine)
            answer: dict[str, Any] = {}

            def remove() -> None:
                with httpx.Client(base_url=c.base_url, timeout=60, headers=ADMIN) as admin:
                    r = admin.delete(f"/admin/engines/{engine}")
                    answer.update(status=r.status_code, body=r.json())

            remover = threading.Thread(target=remove)
            remover.start()
            eventually(lambda: engine in c.state.dispatcher.draining)
            listed = http.get("/admin/engines", headers=ADMIN).json()["engines"]
            assert {e["name"]: e["draining"] for e in listed} == {engine: True, other: False}
            # While draining, new requests go to the other engine only.
            for i in range(4):
                r = http.post("/v1/completions", json={"model": MODEL, "prompt": f"new {i}",
                                                       "max_tokens": 2})
                assert r.status_code == 200
                assert r.headers["x-kvroute-route"].startswith(f"engine={other};")
            lines = [line for line in stream.iter_lines() if line]
        remover.join(60)
        assert lines[-1] == "data: [DONE]" and not any('"error"' in ln for ln in lines)
        assert answer == {"status": 200, "body": {"name": engine, "removed": True,
                                                  "drained": True, "cut": 0}}
        assert list(c.state.client.engines) == [other]
        assert engine not in c.state.fleet.attached
        r = http.post("/v1/completions", json={"model": MODEL, "prompt": "after",
                                               "max_tokens": 2})
        assert r.status_code == 200 and r.headers["x-kvroute-route"].startswith(f"engine={other};")


@pytest.mark.parametrize("transport", ["zmq", "http"])
def test_a_removal_that_cuts_streams_aborts_them_on_the_engine(transport: str) -> None:
    """The engine goes on running after its removal: it must not generate on for the cut (the
    answer would take 200 s to finish by itself)."""
    opts = ClusterOptions(engines=2, transport=transport,
                          sim={"step_time": 0.05, "output": "markov"},
                          control=Control(admin_key="admin-secret", remove_drain_timeout=0.0))
    with LocalCluster(opts) as c, httpx.Client(base_url=c.base_url, timeout=60) as http:
        body = {"model": MODEL, "prompt": "a long one", "max_tokens": 4000, "stream": True,
                "ignore_eos": True}
        with http.stream("POST", "/v1/completions", json=body) as stream:
            assert stream.status_code == 200, stream.read()
            engine = stream.headers["x-kvroute-route"].split(";")[0].removeprefix("engine=")
            sched = c.threads[engine].engine.scheduler
            lines = stream.iter_lines()  # held: a dropped iterator closes the response
            next(line for line in lines if line.startswith("data: "))
            assert sched.requests  # generating
            removed = http.delete(f"/admin/engines/{engine}", headers=ADMIN)
            assert removed.status_code == 200 and removed.json()["cut"] == 1, removed.text
            eventually(lambda: not sched.requests)  # the engine aborted it


def test_keys_come_from_files_or_the_environment(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    api, admin = tmp_path / "api", tmp_path / "admin"
    api.write_text("file-api\n")
    admin.write_text("file-admin\n")
    monkeypatch.delenv("KVROUTE_API_KEY", raising=False)
    monkeypatch.delenv("KVROUTE_ADMIN_KEY", raising=False)
    cfg = parse(["--api-key-file", str(api), "--admin-key-file", str(admin)])
    assert (cfg.api_key, cfg.control.admin_key) == ("file-api", "file-admin")
    assert parse([]).control.admin_key is None and parse([]).api_key is None
    monkeypatch.setenv("KVROUTE_API_KEY", "env-api")
    monkeypatch.setenv("KVROUTE_ADMIN_KEY", "env-admin")
    cfg = parse(["--admin-allow-host", "10.0.0.5", "--max-engines", "3",
                 "--admin-ipc-dir", str(tmp_path)])
    assert (cfg.api_key, cfg.control.admin_key) == ("env-api", "env-admin")
    assert cfg.control == Control(admin_key="env-admin", allowed_hosts=("10.0.0.5",),
                                  ipc_dir=str(tmp_path), max_engines=3)
    # A file wins over the environment.
    assert parse(["--api-key-file", str(api)]).api_key == "file-api"
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="empty"):
        parse(["--admin-key-file", str(tmp_path / "empty")])
    with pytest.raises(ConfigError, match="cannot read"):
        parse(["--api-key-file", str(tmp_path / "missing")])
    # The old flag still works, with a warning that it leaks the key.
    monkeypatch.delenv("KVROUTE_API_KEY")
    capsys.readouterr()
    assert parse(["--api-key", "flag-key"]).api_key == "flag-key"
    assert "deprecated" in capsys.readouterr().err
    # There is no admin key flag: a value given on the command line is only ever a file name.
    with pytest.raises(ConfigError, match="cannot read the admin key file"):
        parse(["--admin-key", "x"])


def test_control_table_in_the_config_file(tmp_path: Path) -> None:
    conf = tmp_path / "router.toml"
    conf.write_text('[control]\nallowed_hosts = ["engine.svc"]\nmax_engines = 8\n')
    cfg = parse(["--config", str(conf)])
    assert cfg.control.allowed_hosts == ("engine.svc",) and cfg.control.max_engines == 8
    conf.write_text("[control]\nmax_engines = 0\n")
    with pytest.raises(ConfigError, match="max_engines"):
        parse(["--config", str(conf)])
    conf.write_text("[control]\nadmin_keys = 1\n")
    with pytest.raises(ConfigError, match="unknown key"):
        parse(["--config", str(conf)])


def test_tcp_join_to_an_allowed_host(guarded: LocalCluster) -> None:
    with httpx.Client(base_url=guarded.base_url, timeout=30, headers=ADMIN) as http:
        r = http.post("/admin/engines", json={"name": "tcp-one", "handshake": "tcp://127.0.0.1:0"})
        assert r.status_code == 200, r.text
        # Port 0: the kernel's choice, read back from the bound socket.
        assert r.json()["handshake"].startswith("tcp://127.0.0.1:")
        assert not r.json()["handshake"].endswith(":0")
        assert http.delete("/admin/engines/tcp-one").status_code == 200


def test_keys_stay_out_of_the_config_repr(tmp_path: Path) -> None:
    (tmp_path / "k").write_text("topsecret-api")
    (tmp_path / "a").write_text("topsecret-admin")
    cfg = parse(["--api-key-file", str(tmp_path / "k"), "--admin-key-file", str(tmp_path / "a")])
    assert cfg.api_key == "topsecret-api" and cfg.control.admin_key == "topsecret-admin"
    assert "topsecret" not in repr(cfg)

"""Router configuration (flags + TOML/JSON, frozen) and admission (slots, FIFO queue, 429/503)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from render.sampling_checks import RequestLimits
from router.config import ConfigError, from_mapping
from router.main import parse
from router.routing.admission import Admission
from serving.errors import OverloadedError
from serving.server import ROUTER_SERVER, SERVERS

TOML = """
host = "0.0.0.0"
port = 9000
api_key = "k"

[policy]
name = "cache_aware"
load_weight = 0.5
cache_threshold = 0.3

[limits]
max_in_flight_per_engine = 8

[[engines]]
name = "a"
handshake = "tcp://10.0.0.1:13345"
kv_events = "tcp://10.0.0.1:5557"
replay = "tcp://10.0.0.1:5558"

[[engines]]
handshake = "tcp://10.0.0.2:13345"
"""


def test_toml_file_and_flags(tmp_path: Path) -> None:
    path = tmp_path / "router.toml"
    path.write_text(TOML)
    cfg = parse(["--config", str(path), "--port", "9100", "--policy", "round_robin"])
    assert (cfg.host, cfg.port, cfg.api_key) == ("0.0.0.0", 9100, "k")
    assert cfg.policy.name == "round_robin" and cfg.policy.load_weight == 0.5
    assert cfg.limits.max_in_flight_per_engine == 8
    assert [e.name for e in cfg.engines] == ["a", "engine-1"]
    assert cfg.engines[0].replay == "tcp://10.0.0.1:5558"
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.port = 1  # type: ignore[misc]


def test_json_file_and_engine_flags(tmp_path: Path) -> None:
    path = tmp_path / "router.json"
    path.write_text('{"limits": {"max_queue": 3}}')
    cfg = parse(["--config", str(path), "--engine",
                 "x=tcp://h:1,kv=tcp://h:2,replay=tcp://h:3,block_size=128",
                 "--engine", "ipc:///tmp/e.hs"])
    assert cfg.limits.max_queue == 3
    assert cfg.engines[0].name == "x" and cfg.engines[0].block_size == 128
    assert cfg.engines[0].kv_events == "tcp://h:2"
    assert cfg.engines[1].name == "engine-1" and cfg.engines[1].handshake == "ipc:///tmp/e.hs"
    assert cfg.http_server == ROUTER_SERVER
    for server in SERVERS:
        assert parse(["--http-server", server]).http_server == server


def test_http_engines_and_mixed_fleets(tmp_path: Path) -> None:
    path = tmp_path / "router.toml"
    path.write_text("""
[link]
http_load_interval = 0.25

[[engines]]
name = "pod-a"
url = "http://10.0.0.5:8000"

[[engines]]
name = "headless"
handshake = "tcp://0.0.0.0:13345"
peer_inputs = ["tcp://10.0.0.9:15000"]
peer_outputs = ["tcp://10.0.0.9:15001"]
""")
    cfg = parse(["--config", str(path)])
    pod, headless = cfg.engines
    assert pod.is_http and pod.url == "http://10.0.0.5:8000" and pod.kv_host == "10.0.0.5"
    assert not headless.is_http and headless.peer_outputs == ("tcp://10.0.0.9:15001",)
    assert cfg.link.http_load_interval == 0.25 and cfg.link.client_index == 0
    flags = parse(["--engine", "p=https://pod.svc:8443,kv=tcp://pod.svc:5557",
                   "--engine", "http://pod-b:8000",
                   "--engine", "z=tcp://h:1,peer_input=tcp://p:2,peer_output=tcp://p:3",
                   "--engine", "q=peer,input=tcp://0.0.0.0:5,output=tcp://0.0.0.0:6,block_size=16",
                   "--client-index", "1"])
    p, b, z, q = flags.engines
    assert p.url == "https://pod.svc:8443" and p.kv_events == "tcp://pod.svc:5557"
    assert b.name == "engine-1" and b.url == "http://pod-b:8000" and not b.handshake
    assert z.peer_inputs == ("tcp://p:2",) and z.peer_outputs == ("tcp://p:3",)
    assert q.handshake == "" and q.input_address == "tcp://0.0.0.0:5" and q.block_size == 16
    assert flags.link.client_index == 1


@pytest.mark.parametrize("engine, needle", [
    ({"name": "a"}, "either a handshake address"),
    ({"name": "a", "handshake": "tcp://h:1", "url": "http://h:2"}, "either"),
    ({"name": "a", "url": "ftp://h:2"}, "url must be"),
    ({"name": "a", "url": "http://h:2", "input": "tcp://h:3"}, "input is a ZMQ engine's"),
    ({"name": "a", "handshake": "tcp://h:1", "peer_inputs": ["tcp://p:1"]}, "pair up"),
    ({"name": "a", "handshake": "tcp://h:1", "peer_inputs": "tcp://p:1"}, "list of addresses"),
])
def test_engine_specs_that_are_refused(engine: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        from_mapping({"engines": [engine]})


@pytest.mark.parametrize("data, needle", [
    ({"prot": 1}, "unknown key"),
    ({"policy": {"name": "fastest"}}, "unknown policy"),
    ({"engines": [{"name": "a", "handshake": "x"}, {"name": "a", "handshake": "y"}]},
     "duplicate"),
    ({"engines": [{"handshake": "x", "color": 1}]}, "engines[0]"),
    ({"limits": {"max_queue": 1, "bogus": 2}}, "limits"),
    ({"http_server": "gunicorn"}, "http_server must be one of"),
    ({"limits": {"max_n": 0}}, "max_n must be at least 1"),
    ({"limits": {"max_logprobs": -2}}, "max_logprobs must be -1"),
])
def test_config_errors_name_the_key(data: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        from_mapping(data)


def test_bad_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("port = [")
    with pytest.raises(ConfigError, match="bad.toml"):
        parse(["--config", str(bad)])
    with pytest.raises(ConfigError, match="cannot read"):
        parse(["--config", str(tmp_path / "missing.toml")])
    with pytest.raises(ConfigError, match="options are"):
        parse(["--engine", "a=tcp://h:1,color=red"])


async def test_admission_queue_fifo_then_429_and_503() -> None:
    adm = Admission(max_in_flight=1, max_queue=2, queue_timeout=5.0, retry_after=2)
    engines = ["e"]

    def has_open() -> bool:
        return bool(adm.open_engines(engines))

    await adm.wait_for_slot(has_open)
    adm.take("e", 100)
    assert adm.loads(engines, lambda e: (3, 1))[0].pending_prefill_tokens == 100
    order: list[int] = []

    async def waiter(i: int) -> None:
        await adm.wait_for_slot(has_open)
        order.append(i)
        adm.take("e", 0)

    tasks = [asyncio.create_task(waiter(i)) for i in range(2)]
    while adm.queued < 2:
        await asyncio.sleep(0)  # let both reach the queue (no I/O involved)
    with pytest.raises(OverloadedError) as full:
        await adm.wait_for_slot(has_open)
    assert (full.value.status, full.value.retry_after) == (429, 2)
    adm.prefilled("e", 100)
    adm.release("e")
    await asyncio.wait_for(tasks[0], 5)
    adm.release("e")
    await asyncio.wait_for(tasks[1], 5)
    assert order == [0, 1]
    short = Admission(max_in_flight=1, max_queue=2, queue_timeout=0.05, retry_after=1)
    short.take("e", 0)
    with pytest.raises(OverloadedError) as timeout:
        await short.wait_for_slot(lambda: bool(short.open_engines(engines)))
    assert timeout.value.status == 503


def test_request_limit_flags() -> None:
    cfg = parse(["--max-n", "4", "--max-logprobs", "-1", "--max-stop-strings", "2",
                 "--max-stop-bytes", "100"])
    assert cfg.limits.request == RequestLimits(4, -1, 2, 100)
    assert parse(["--max-output-entries", "0"]).limits.request.max_output_entries == 0
    assert parse([]).limits.request == RequestLimits() == RequestLimits(1024, 20, 64, 16384,
                                                                        1 << 24)


def test_link_table_guards_the_engine_sockets() -> None:
    cfg = from_mapping({"link": {"allowed_peers": ["10.0.0.5", "::1"],
                                 "max_output_msg_bytes": 1 << 20}})
    assert cfg.link.allowed_peers == ("10.0.0.5", "::1")
    assert cfg.link.max_output_msg_bytes == 1 << 20
    assert from_mapping({}).link.allowed_peers is None
    with pytest.raises(ConfigError, match="'engine-host' is not an IP address"):
        from_mapping({"link": {"allowed_peers": ["engine-host"]}})
    with pytest.raises(ConfigError, match="allowed_peers must be a list"):
        from_mapping({"link": {"allowed_peers": "10.0.0.5"}})
    with pytest.raises(ConfigError, match="max_kv_msg_bytes must be int"):
        from_mapping({"link": {"max_kv_msg_bytes": "big"}})


@pytest.mark.parametrize(("engine", "bound"), [
    ({"handshake": "tcp://0.0.0.0:13345"}, ("127.0.0.1", 14345, 15345)),  # told loopback
    ({"handshake": "tcp://*:13345"}, ("127.0.0.1", 14345, 15345)),
    ({"handshake": "tcp://[::]:13345"}, ("[::1]", 14345, 15345)),
    ({"handshake": "tcp://0.0.0.0:13345", "advertise_host": "10.0.0.9"},
     ("10.0.0.9", 14345, 15345)),
    ({"handshake": "tcp://0.0.0.0:13345", "advertise_host": "router.svc",
      "bind_host": "10.0.0.7"}, ("10.0.0.7", 14345, 15345)),
    ({"handshake": "tcp://10.1.2.3:13345"}, ("10.1.2.3", 14345, 15345)),
    ({"handshake": "tcp://10.1.2.3:0"}, ("10.1.2.3", 0, 0)),  # kernel-chosen, as the handshake
    ({"handshake": "tcp://0.0.0.0:13345", "input": "tcp://0.0.0.0:7",
      "output": "tcp://0.0.0.0:8"}, ("0.0.0.0", 7, 8)),  # a wildcard asked for is kept
])
def test_default_input_and_output_sit_beside_the_handshake_never_on_a_wildcard(
        engine: dict[str, str], bound: tuple[str, int, int]) -> None:
    """Same interface as the handshake (a wildcard's: the one engines are told to dial), ports
    derived from the handshake's: a restarted router binds what its engines still dial."""
    [spec] = from_mapping({"engines": [engine]}).engines
    host, inp, out = bound
    assert (spec.input_address, spec.output_address) == (f"tcp://{host}:{inp}",
                                                          f"tcp://{host}:{out}")


def test_a_handshake_port_without_room_for_its_neighbours_is_refused() -> None:
    with pytest.raises(ConfigError, match="no room for the default input/output ports"):
        from_mapping({"engines": [{"handshake": "tcp://127.0.0.1:64000"}]})
    [spec] = from_mapping({"engines": [{"handshake": "tcp://127.0.0.1:64000",
                                        "input": "tcp://127.0.0.1:1", "output": "ipc:///x"}]}).engines
    assert spec.output_address == "ipc:///x"


def test_a_wildcard_handshake_advertising_a_name_needs_a_bind_host() -> None:
    engine = {"handshake": "tcp://0.0.0.0:13345", "advertise_host": "router.svc"}
    with pytest.raises(ConfigError, match=r"engines\[0\].*set bind_host"):
        from_mapping({"engines": [engine]})
    with pytest.raises(ConfigError, match="bind_host 'eth0' is not an IP address"):
        from_mapping({"engines": [{**engine, "bind_host": "eth0"}]})
    cfg = parse(["--engine", "a=tcp://0.0.0.0:1,advertise_host=router.svc,bind_host=10.0.0.7"])
    assert cfg.engines[0].input_address == "tcp://10.0.0.7:1001"


def test_frontend_switches_default_as_vllm() -> None:
    """vLLM's answer switches: off by default, on by flag or the [frontend] table."""
    off = parse([]).frontend
    assert not (off.enable_prompt_tokens_details or off.enable_force_include_usage
                or off.return_tokens_as_token_ids)
    on = parse(["--enable-prompt-tokens-details", "--enable-force-include-usage",
                "--return-tokens-as-token-ids"]).frontend
    assert on.enable_prompt_tokens_details and on.enable_force_include_usage
    assert on.return_tokens_as_token_ids
    table = from_mapping({"frontend": {"enable_prompt_tokens_details": True}}).frontend
    assert table.enable_prompt_tokens_details and not table.enable_force_include_usage
    with pytest.raises(ConfigError, match="frontend: unknown key"):
        from_mapping({"frontend": {"prompt_details": True}})


def test_a_readopted_engine_names_its_context() -> None:
    cfg = parse(["--engine", "x=tcp://h:1,block_size=128,max_model_len=4096"])
    assert (cfg.engines[0].block_size, cfg.engines[0].max_model_len) == (128, 4096)
    with pytest.raises(ConfigError, match="max_model_len must be an integer"):
        parse(["--engine", "x=tcp://h:1,max_model_len=big"])

"""`--model ORG/NAME`: the real huggingface_hub download path against a fake Hub on loopback.

The fake Hub (tests/fake_hub.py) serves the embedded Qwen3 tokenizer files plus weight files
that must never be requested; HF_HOME is a fresh temporary directory per test.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import pytest

from render import Renderer
from render.hub import RENDER_FILES
from render.protocol import ChatCompletionRequest
from render.service.config import EMBEDDED_MODEL
from tests.fake_hub import FakeHub, fake_hub, repo_from_dir
from tests.procs import kvroute_env, run, started

WEIGHTS = {"model.safetensors": b"\0" * 4096, "pytorch_model.bin": b"\1" * 4096,
           "model.safetensors.index.json": b"{}"}
URL = r"on (http://127\.0\.0\.1:\d+)"
MESSAGES = [{"role": "user", "content": "Fetched from a hub?"}]


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    repo = repo_from_dir(EMBEDDED_MODEL, WEIGHTS, lfs=frozenset(WEIGHTS) - {
        "model.safetensors.index.json"})
    with fake_hub({"org/tiny": repo}) as h:
        yield h


def _env(hf_home: Path, hub_url: str, offline: bool = False) -> dict[str, str]:
    return kvroute_env(HF_HOME=str(hf_home), HF_ENDPOINT=hub_url, HF_HUB_DISABLE_TELEMETRY="1",
                       HF_HUB_OFFLINE="1" if offline else None, TRANSFORMERS_OFFLINE=None,
                       HF_TOKEN=None, HF_HUB_CACHE=None)


def _embedded_ids() -> list[int]:
    renderer = Renderer.load(EMBEDDED_MODEL)
    req = msgspec.convert({"messages": MESSAGES}, ChatCompletionRequest)
    ids: list[int] = list(renderer.render_chat(req).token_ids)
    return ids


def _render(args: list[str], env: dict[str, str]) -> list[int]:
    with started(["render", "--port", "0", "--render-processes", "0", *args], env) as proc:
        url = proc.wait_for(r"kvroute render: ready on (http://\S+)").group(1)
        proc.drain()
        answer = httpx.post(f"{url}/v1/chat/completions/render", timeout=60,
                            json={"model": "org/tiny", "messages": MESSAGES})
        assert answer.status_code == 200, answer.text
        ids: list[int] = answer.json()["token_ids"]
        return ids


def test_render_fetches_only_render_files_then_starts_from_the_cache_with_the_hub_down(
    hub: FakeHub, tmp_path: Path
) -> None:
    env = _env(tmp_path / "hf", hub.url)
    assert _render(["--model", "org/tiny"], env) == _embedded_ids()
    fetched = hub.fetched()
    assert sorted(fetched) == sorted(f for f in RENDER_FILES if (EMBEDDED_MODEL / f).is_file())
    # Not even a HEAD for a weight file, nor for README.md / LICENSE.
    assert not [p for _, p in hub.requests if any(w in p for w in WEIGHTS)]
    snapshot = next((tmp_path / "hf" / "hub" / "models--org--tiny" / "snapshots").iterdir())
    assert sorted(p.name for p in snapshot.iterdir()) == sorted(fetched)

    hub.stop()  # the Hub is down: the cached snapshot serves
    assert _render(["--model", "org/tiny"], env) == _embedded_ids()


def test_router_serves_a_hub_id_at_a_revision(hub: FakeHub, tmp_path: Path) -> None:
    env = _env(tmp_path / "hf", hub.url)
    commit = hub.repos["org/tiny"].commit
    args = ["router", "--port", "0", "--plain-logs", "--model", "org/tiny", "--revision", commit]
    with started(args, env) as proc:
        url = proc.wait_for(r"kvroute router: serving org/tiny " + URL).group(1)
        proc.drain()
        assert "kvroute: fetching org/tiny@" + commit in proc.text
        models = httpx.get(f"{url}/v1/models", timeout=30).json()
        assert [m["id"] for m in models["data"]] == ["org/tiny"]
        tokens = httpx.post(f"{url}/tokenize", timeout=30,
                            json={"model": "org/tiny", "prompt": "hello hub"}).json()
        assert tokens["count"] == 2
    assert not [p for _, p in hub.requests if any(w in p for w in WEIGHTS)]


def test_unknown_revision_and_unknown_repo_are_one_clear_error(
    hub: FakeHub, tmp_path: Path
) -> None:
    env = _env(tmp_path / "hf", hub.url)
    out = run(["router", "--model", "org/tiny", "--revision", "nope"], env)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "org/tiny has no revision 'nope'" in out.stderr
    out = run(["render", "--model", "org/absent"], env)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "org/absent is not on" in out.stderr and "HF_TOKEN" in out.stderr


@pytest.mark.parametrize("command", ["router", "render"])
def test_offline_without_a_cached_copy_is_one_clear_error(
    hub: FakeHub, tmp_path: Path, command: str
) -> None:
    out = run([command, "--model", "org/tiny"], _env(tmp_path / "hf", hub.url, offline=True))
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert "HF_HUB_OFFLINE" in out.stderr and "local model directory" in out.stderr
    assert hub.requests == []


def test_a_missing_directory_is_not_a_traceback(tmp_path: Path) -> None:
    out = run(["router", "--model", str(tmp_path / "nowhere")])
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"model directory {tmp_path / 'nowhere'} does not exist" in out.stderr

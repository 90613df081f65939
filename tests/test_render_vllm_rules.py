"""vLLM 0.32 rules the anchor stage found kvroute missing: context length and empty prompts."""

from __future__ import annotations

import shutil
from pathlib import Path

import msgspec
import pytest

from render import Renderer
from render.errors import BadRequestError
from render.model_files import derive_max_model_len, load_model_files
from render.protocol import CompletionRequest

QWEN3_DIR = Path(__file__).resolve().parent.parent / "render" / "models" / "qwen3"
DEEPSEEK_V3_1 = {
    "model_type": "deepseek_v3",
    "max_position_embeddings": 163840,
    "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096},
}


def test_tokenizer_model_max_length_does_not_cap_a_generative_model() -> None:
    # DeepSeek-V3.1 ships model_max_length 131072; vLLM serves it with 163840 (the yarn factor
    # is already folded into max_position_embeddings, so it is not applied again).
    assert derive_max_model_len(DEEPSEEK_V3_1, {"model_max_length": 131072}) == 163840


def test_linear_rope_factor_scales_the_smallest_length_key() -> None:
    config = {"model_type": "llama", "max_position_embeddings": 4096, "seq_length": 2048,
              "rope_scaling": {"type": "linear", "factor": 2.0}}
    assert derive_max_model_len(config, {}) == 4096
    assert derive_max_model_len({"model_type": "x"}, {}) == 2048


@pytest.mark.parametrize("prompt", ["", [""]])
def test_empty_completion_prompt(prompt: str | list[str]) -> None:
    r = Renderer.load()
    req = msgspec.convert({"prompt": prompt}, CompletionRequest)
    with pytest.raises(BadRequestError) as e:
        r.render_completion(req)
    # "" is rejected before tokenizing (vLLM's validator); [""] renders no ids (Qwen3 adds no BOS).
    assert e.value.status == 400
    expected = "non-empty" if prompt == "" else "The decoder prompt cannot be empty"
    assert expected in str(e.value)


def test_tekken_is_used_only_in_a_mistral_format_repo(tmp_path: Path) -> None:
    # vLLM's tokenizer_mode "auto": mistral-common needs consolidated*.safetensors next to
    # tekken.json; otherwise the HF tokenizer.json and its template render the chat.
    shutil.copy(QWEN3_DIR / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "tekken.json").write_text("{}")
    assert load_model_files(tmp_path).tekken_path is None
    (tmp_path / "consolidated.safetensors").touch()
    assert load_model_files(tmp_path).tekken_path == tmp_path / "tekken.json"

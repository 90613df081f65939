"""Build a tiny random-weight LoRA adapter (PEFT's format) for the tiny Qwen3 model.

Usage: make_tiny_lora.py BASE_MODEL_DIR OUT_DIR   (run with the vllm venv's python)

The adapter targets q_proj and v_proj of every layer with rank 8: ``adapter_config.json`` and
``adapter_model.safetensors`` laid out as PEFT saves them (``base_model.model.<module>.lora_A``
/ ``lora_B`` weights, A as [r, in], B as [out, r]). Both factors are drawn large (B is zero in a
freshly initialised PEFT adapter), so the adapter moves the attention of the random base model
far enough to change its greedy output: the real-vLLM tests tell an adapter request from a
base one by its tokens.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RANK = 8
ALPHA = 16
TARGETS = ("q_proj", "v_proj")
SEED = 1


def adapter_config(base: Path) -> dict[str, object]:
    """PEFT's LoraConfig as ``save_pretrained`` writes it (the fields vLLM's PEFTHelper reads)."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(base),
        "r": RANK,
        "lora_alpha": ALPHA,
        "lora_dropout": 0.0,
        "target_modules": list(TARGETS),
        "bias": "none",
        "fan_in_fan_out": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
        "rank_pattern": {},
        "alpha_pattern": {},
        "layers_to_transform": None,
        "layers_pattern": None,
        "revision": None,
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.splitlines()[2], file=sys.stderr)
        return 2
    base, out = Path(argv[0]), Path(argv[1])
    import torch
    from safetensors.torch import save_file

    config = json.loads((base / "config.json").read_text())
    hidden = int(config["hidden_size"])
    head_dim = int(config.get("head_dim") or hidden // config["num_attention_heads"])
    out_dims = {"q_proj": config["num_attention_heads"] * head_dim,
                "v_proj": config["num_key_value_heads"] * head_dim}
    gen = torch.Generator().manual_seed(SEED)
    tensors = {}
    for layer in range(int(config["num_hidden_layers"])):
        for module in TARGETS:
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            a = torch.randn(RANK, hidden, generator=gen) / hidden**0.5
            b = torch.randn(out_dims[module], RANK, generator=gen)
            tensors[f"{prefix}.lora_A.weight"] = a.to(torch.bfloat16).contiguous()
            tensors[f"{prefix}.lora_B.weight"] = b.to(torch.bfloat16).contiguous()
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    (out / "adapter_config.json").write_text(json.dumps(adapter_config(base), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

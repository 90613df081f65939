"""``--lora-modules``: LoRA adapters served under their own model names, parsed as vLLM does."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class LoRAModule:
    """vLLM's ``LoRAModulePath``: the adapter's model name, its directory (as the engines see
    it), the base model it applies to (None: the first served model) and its MoE layout flag."""

    name: str
    path: str
    base_model_name: str | None = None
    is_3d_lora_weight: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a LoRA module needs a non-empty name, got {self.name!r}")
        if not isinstance(self.path, str) or not self.path:
            raise ValueError(f"LoRA module {self.name!r} needs a non-empty path")
        if self.base_model_name is not None and not isinstance(self.base_model_name, str):
            raise ValueError(f"LoRA module {self.name!r}: base_model_name must be a string")
        if not isinstance(self.is_3d_lora_weight, bool):
            raise ValueError(f"LoRA module {self.name!r}: is_3d_lora_weight must be a boolean")


FIELDS = ("name", "path", "base_model_name", "is_3d_lora_weight")


def parse_lora_module(item: str) -> LoRAModule:
    """One ``--lora-modules`` value in either of vLLM's forms: ``name=path`` (no comma), or a
    JSON object ``{"name": .., "path": .., "base_model_name": .., "is_3d_lora_weight": ..}``."""
    if "=" in item and "," not in item:
        name, path = item.split("=", 1)
        return LoRAModule(name, path)
    try:
        data = json.loads(item)
    except json.JSONDecodeError:
        raise ValueError(f"Invalid JSON format for --lora-modules: {item}") from None
    return lora_module(data, item)


def lora_module(data: Any, where: str) -> LoRAModule:
    """A LoRA module from a JSON object or a config-file table."""
    if not isinstance(data, Mapping):
        raise ValueError(f"Invalid fields for --lora-modules: {where} - expected an object with "
                         f"{', '.join(FIELDS)}")
    unknown = sorted(set(data) - set(FIELDS))
    if unknown or "name" not in data or "path" not in data:
        raise ValueError(f"Invalid fields for --lora-modules: {where} - "
                         + (f"unknown {', '.join(unknown)}" if unknown else "name and path are "
                            "required"))
    return LoRAModule(**dict(data))


def lora_modules(items: Iterable[str | Mapping[str, Any]]) -> tuple[LoRAModule, ...]:
    """Flag values (strings) or config-file tables, in order; a name given twice is an error."""
    modules = tuple(parse_lora_module(i) if isinstance(i, str) else lora_module(i, repr(i))
                    for i in items)
    names = [m.name for m in modules]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"LoRA module names must be unique: {', '.join(dupes)} given twice")
    return modules

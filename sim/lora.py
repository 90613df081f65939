"""The sim engine's LoRA adapters: vLLM's worker-side LRU cache of loaded adapters, and its checks.

vLLM's worker keeps up to ``max_cpu_loras`` adapters loaded, keyed by ``lora_int_id``, least
recently used first out (pinned ones stay). ``add_lora`` loads one (again, with
``load_inplace``); a request naming an id that is not loaded loads it from ``lora_path`` on the
spot, and an adapter that cannot load there fails the engine. Loading reads
``adapter_config.json`` (PEFT's) as vLLM's PEFTHelper does: a missing one is "No adapter found",
a rank over ``max_lora_rank`` or an unsupported feature is refused. The weights are not read:
the sim's outputs do not depend on them.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path

from wire.engine import LoRARequest

NOT_ENABLED = "LoRA is not enabled. Use --enable-lora to enable LoRA."


class LoRAError(Exception):
    """An adapter the worker cannot load; ``str()`` is vLLM's worker-side message."""


def worker_failure(message: str) -> str:
    """How vLLM's multiprocess executor reports a worker's exception to the engine core."""
    return (f"Worker failed with error '{message}', please check the stack trace above for "
            "the root cause")


def check_adapter(lora: LoRARequest, max_lora_rank: int) -> None:
    """vLLM's load-time checks (WorkerLoRAManager._load_adapter, PEFTHelper.validate_legal)."""
    config_path = Path(lora.lora_path).expanduser() / "adapter_config.json"
    try:
        config = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise LoRAError(f"Loading lora {lora.lora_name} failed: No adapter found for "
                        f"{lora.lora_path}") from None
    except (OSError, ValueError) as exc:
        raise LoRAError(str(exc)) from None
    missing = {"r", "lora_alpha", "target_modules"} - set(config)
    if missing:
        raise LoRAError(f"Missing required configuration fields: {missing}")
    errors = []
    if config.get("use_dora"):
        errors.append("vLLM does not yet support DoRA.")
    ranks = [config["r"], *(config.get("rank_pattern") or {}).values()]
    if max(ranks) > max_lora_rank:
        errors.append(f"LoRA rank {max(ranks)} is greater than max_lora_rank {max_lora_rank}.")
    if config.get("bias", "none") != "none":
        errors.append("Adapter bias is not supported.")
    if errors:
        raise LoRAError(" ".join(errors))


class LoRACache:
    """Loaded adapters by id, least recently used first; ``capacity`` is max_cpu_loras."""

    def __init__(self, capacity: int, max_lora_rank: int) -> None:
        self.capacity = capacity
        self.max_lora_rank = max_lora_rank
        self._loaded: OrderedDict[int, LoRARequest] = OrderedDict()
        self._pinned: set[int] = set()

    def add(self, lora: LoRARequest) -> bool:
        """The ``add_lora`` utility, and the load a request triggers; raises LoRAError."""
        lid = lora.lora_int_id
        if lid in self._loaded and not lora.load_inplace:
            self._loaded.move_to_end(lid)
            return True
        check_adapter(lora, self.max_lora_rank)
        self._loaded.pop(lid, None)
        if len(self._loaded) + 1 > self.capacity:
            oldest = next((i for i in self._loaded if i not in self._pinned), None)
            if oldest is not None:
                del self._loaded[oldest]
        self._loaded[lid] = lora
        return True

    def remove(self, lora_id: int) -> bool:
        self._pinned.discard(lora_id)
        return self._loaded.pop(lora_id, None) is not None

    def pin(self, lora_id: int) -> bool:
        if lora_id not in self._loaded:
            raise LoRAError(f"Pinning failed. LoRA {lora_id} is not registered.")
        self._pinned.add(lora_id)
        return True

    def ids(self) -> list[int]:
        """``list_loras``: a set in vLLM, a msgpack array on the wire."""
        return sorted(self._loaded)

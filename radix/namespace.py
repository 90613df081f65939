"""Namespaces: the part of vLLM's block identity that is not token ids (LoRA, cache_salt)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from radix.keys import plain

Namespace = tuple[str | None, str | None]


def namespace_for(lora_name: str | None, cache_salt: str | None) -> Namespace:
    """The namespace of a request: blocks of different adapters or salts never match."""
    return (lora_name or None, cache_salt or None)


def split_event_extra_keys(
    lora_name: str | None, extra_keys: Sequence[Sequence[Any] | None] | None
) -> tuple[str | None, list[tuple[Any, ...] | None] | None]:
    """Split a BlockStored's per-block ``extra_keys`` into (cache_salt, residual per-block keys).

    vLLM publishes each block's extra keys untagged, in order: the LoRA name (on every block when
    the request has one), ``(mm_identifier, offset)`` pairs, the cache_salt (block 0 only) and
    prompt-embeds digests (bytes).  The LoRA name and salt become the namespace (see
    :func:`namespace_for`); what remains (multimodal identity, embeds) is folded into the keys of
    the blocks that carry it, so such blocks only match a prompt that names the same media.
    """
    if not extra_keys:
        return None, None
    salt: str | None = None
    residual: list[tuple[Any, ...] | None] = []
    for block_keys in extra_keys:
        if block_keys is None:
            residual.append(None)
            continue
        items = list(block_keys)
        if lora_name is not None and items and items[0] == lora_name:
            items = items[1:]
        rest = []
        for item in items:
            if isinstance(item, str):
                salt = item
            else:
                rest.append(plain(item))
        residual.append(tuple(rest) if rest else None)
    if all(r is None for r in residual):
        return salt, None
    return salt, residual

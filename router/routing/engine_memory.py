"""What each ZMQ engine said when it last handshook, kept on disk so a restarted router knows it.

A headless engine tells its frontend its block size, context length and KV-event endpoints once,
in the ready map of its handshake. A router that restarts re-adopts a running engine without a
new handshake (the engine's sockets simply reconnect to the same addresses), so without a memory
it would route to the engine but never subscribe to its KV events. Each engine's ready map is
written, on every handshake, to ``STATE_DIR/engines/<digest of its handshake address>.json``
(the handshake address is the link's identity: two routers cannot bind it at once), replaced
atomically; an adopted engine's is read back from there. A memory for another engine name or
address is not used. Writing is best effort: a state directory that cannot be written costs the
memory (logged), never a request.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import msgspec

from router.config import EngineSpec
from wire.engine import EngineReadyResponse

log = logging.getLogger("kvroute.fleet")


class _Entry(msgspec.Struct):
    name: str
    handshake: str
    ready: EngineReadyResponse


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(_Entry)


class EngineMemory:
    """The ready maps of the engines linked from this state directory (None: no memory)."""

    def __init__(self, state_dir: str | Path | None) -> None:
        self.dir = Path(state_dir) / "engines" if state_dir else None

    def _path(self, spec: EngineSpec) -> Path | None:
        if self.dir is None or spec.is_http or not spec.handshake:
            return None  # a pod describes itself over HTTP every time; a peer router's engine
            # is handshaken by its owner
        digest = hashlib.sha256(spec.handshake.encode()).hexdigest()[:24]
        return self.dir / f"{digest}.json"

    def remember(self, spec: EngineSpec, ready: EngineReadyResponse) -> None:
        path = self._path(spec)
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(_ENCODER.encode(_Entry(spec.name, spec.handshake, ready)))
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("cannot keep the engine's ready map: a restarted router will not know "
                        "its KV endpoints", extra={"engine": spec.name, "error": str(exc)})

    def recall(self, spec: EngineSpec) -> EngineReadyResponse | None:
        path = self._path(spec)
        if path is None:
            return None
        try:
            entry = _DECODER.decode(path.read_bytes())
        except (OSError, msgspec.DecodeError):
            return None
        if (entry.name, entry.handshake) != (spec.name, spec.handshake):
            return None
        return entry.ready

"""KV-event publisher of the sim engine, as vLLM's ZmqEventPublisher: PUB frames + a replay ROUTER.

PUB frames are ``[topic, seq (8-byte big-endian, from 0), msgpack(KVEventBatch)]``. The PUB binds
only for wildcard (``*``, ``::``) or ipc/inproc endpoints and connects otherwise; the replay ROUTER
always binds; TCP ports are offset by the data-parallel rank. A replay request ``[b"", start_seq]``
gets every buffered batch with ``seq >= start_seq`` as ``[b"", topic, seq, payload]`` and then the
end marker ``[b"", b"", 0xFF*8, b""]``. Runs on the engine's own thread (no extra locking).
"""

from __future__ import annotations

import logging
import time
from collections import deque

import msgspec
import zmq

from sim.config import KVEventsConfig
from wire.engine import KVEvent, KVEventBatch

log = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def offset_endpoint_port(endpoint: str | None, rank: int) -> str | None:
    """vLLM's rule: TCP ports + rank (port 0 kept), inproc/ipc paths get a ``_dp<rank>`` suffix."""
    if not endpoint or rank == 0:
        return endpoint
    if endpoint.startswith(("inproc://", "ipc://")):
        return f"{endpoint}_dp{rank}"
    if endpoint.startswith("tcp://") and ":" in endpoint[6:]:
        base, _, port = endpoint.rpartition(":")
        return endpoint if int(port) == 0 else f"{base}:{int(port) + rank}"
    raise ValueError(f"invalid KV events endpoint {endpoint!r}")


def is_bind_endpoint(endpoint: str) -> bool:
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def _bind(sock: zmq.Socket[bytes], endpoint: str) -> str:
    """Bind; return the concrete endpoint (a ``*:0`` port becomes the chosen one on 127.0.0.1)."""
    sock.bind(endpoint)
    if endpoint.startswith("tcp://") and endpoint.endswith(":0"):
        last = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        port = last.rpartition(":")[2]
        return f"tcp://127.0.0.1:{port}"
    return endpoint


class KVEventPublisher:
    def __init__(
        self, ctx: zmq.Context[zmq.Socket[bytes]], config: KVEventsConfig, rank: int
    ) -> None:
        self.rank = rank
        self.topic = config.topic.encode()
        self._encoder = msgspec.msgpack.Encoder()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._seq = 0
        endpoint = offset_endpoint_port(config.endpoint, rank)
        assert endpoint is not None
        self.pub: zmq.Socket[bytes] = ctx.socket(zmq.PUB)
        self.pub.set_hwm(config.hwm)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.replay: zmq.Socket[bytes] | None = None
        replay_endpoint = offset_endpoint_port(config.replay_endpoint, rank)
        try:
            if is_bind_endpoint(endpoint):
                endpoint = _bind(self.pub, endpoint)
            else:
                self.pub.connect(endpoint)
            if replay_endpoint is not None:
                self.replay = ctx.socket(zmq.ROUTER)
                self.replay.setsockopt(zmq.LINGER, 0)
                replay_endpoint = _bind(self.replay, replay_endpoint)
        except BaseException:
            # An open socket would keep the context's term() waiting forever.
            self.close()
            raise
        # What the ready response reports: the endpoints actually in use.
        self.config = msgspec.structs.replace(
            config, endpoint=endpoint, replay_endpoint=replay_endpoint
        )

    def publish(self, events: list[KVEvent]) -> None:
        seq = self._seq
        self._seq += 1
        payload = self._encoder.encode(
            KVEventBatch(ts=time.time(), events=events, data_parallel_rank=self.rank)
        )
        self.pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload))
        self._buffer.append((seq, payload))

    def service_replay(self) -> None:
        """Answer every pending replay request (called when the ROUTER polls readable)."""
        assert self.replay is not None
        while True:
            try:
                frames = self.replay.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 3:
                log.warning("invalid replay request with %d frames", len(frames))
                continue
            client, _, start_bytes = frames
            start = int.from_bytes(start_bytes, "big")
            for seq, payload in self._buffer:
                if seq >= start:
                    self.replay.send_multipart(
                        (client, b"", self.topic, seq.to_bytes(8, "big"), payload)
                    )
            self.replay.send_multipart((client, b"", b"", END_SEQ, b""))

    def close(self) -> None:
        self.pub.close(linger=0)
        if self.replay is not None:
            self.replay.close(linger=0)

"""Test helper process: sends fresh ~100k-token chats to a render server, one per "go" on stdin.

The /health latency benchmarks (bench/render_health.py, bench/render_offload.py) probe from their
own event loop; sending 400 KB and reading 700 KB in that same process (its loop, or a thread
contending for its GIL) would put the client's own stalls into the probes. ``chat_request`` also
builds the 100k-token chat of tests/test_render_server.py.
Protocol on stdout: "building" while it builds the next chat (~50 ms of one core: a
control, some other process busy on a core), "ready" once built, then after each "go" line on
stdin "done STATUS" as soon as the answer is in, then "tokens N" (the rendered prompt's length, 0
on an error or an empty answer: parsing 700 KB of JSON is CPU this process spends after the
probed window). PATH (default the chat render) lets a benchmark POST the same bodies elsewhere.

    python -m tests.chat_sender HOST PORT MODEL SEED [PATH]
"""

from __future__ import annotations

import json
import random
import re
import socket
import sys

CHAT = "/v1/chat/completions/render"


def chat_request(rng: random.Random, vocab: list[str], model: str, path: str) -> bytes:
    text = " ".join(rng.choice(vocab) for _ in range(40000))
    body = json.dumps({"model": model, "messages": [
        {"role": "system", "content": "Summarise."}, {"role": "user", "content": text}]})
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: "
            f"application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode()


def roundtrip(sock: socket.socket, request: bytes) -> tuple[int, bytes]:
    sock.sendall(request)
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    m = re.search(rb"(?i)content-length:\s*(\d+)", head)
    size = int(m.group(1)) if m else 0
    chunks = [rest]
    got = len(rest)
    while got < size:
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        chunks.append(chunk)
        got += len(chunk)
    return int(head.split(b" ", 2)[1]), b"".join(chunks)


def main(host: str, port: int, model: str, seed: int, path: str = CHAT) -> None:
    rng = random.Random(seed)
    vocab = ["".join(rng.choice("bcdfghklmnprstvz") + rng.choice("aeiou") for _ in range(3))
             for _ in range(3000)]
    sock = socket.create_connection((host, port))
    while True:
        print("building", flush=True)
        request = chat_request(rng, vocab, model, path)
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            sock.close()
            return
        if path != CHAT:  # answered without reading the body: the server closes the connection
            sock.close()
            sock = socket.create_connection((host, port))
        status, body = roundtrip(sock, request)
        print(f"done {status}", flush=True)
        ok = status == 200 and body
        print(f"tokens {len(json.loads(body)['token_ids']) if ok else 0}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), *sys.argv[5:6])

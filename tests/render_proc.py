"""Test helper: a real `kvroute render` process on port 0, ready when it says so on stdout."""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
READY = re.compile(r"kvroute render: ready on (http://\S+)")


@contextmanager
def render_server(*args: str, timeout: float = 60.0, workers: int = 1) -> Iterator[str]:
    """Starts ``python -m render.server --port 0 ARGS``; yields its URL when all workers are up."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "render.server", "--port", "0", "--workers", str(workers), *args],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    assert proc.stdout is not None
    output: list[str] = []
    url = None
    ready = 0
    deadline = time.monotonic() + timeout
    try:
        while ready < workers:
            left = deadline - time.monotonic()
            if left <= 0 or proc.poll() is not None:
                raise RuntimeError("render server did not get ready:\n" + "".join(output))
            if not select.select([proc.stdout], [], [], left)[0]:
                continue
            line = proc.stdout.readline().decode(errors="replace")
            output.append(line)
            m = READY.search(line)
            if m:
                url, ready = m.group(1), ready + 1
        assert url is not None
        # Keep draining so a chatty server never blocks on a full pipe.
        stdout = proc.stdout
        threading.Thread(target=lambda: output.extend(
            b.decode(errors="replace") for b in iter(stdout.readline, b"")), daemon=True).start()
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()

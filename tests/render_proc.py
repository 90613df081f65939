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
    """Starts ``python -m render.service.server --port 0 ARGS``; yields its URL when all workers
    are up."""
    with render_process(*args, timeout=timeout, workers=workers) as (url, _):
        yield url


@contextmanager
def render_process(*args: str, timeout: float = 60.0, workers: int = 1,
                   new_session: bool = False) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``render_server`` yielding the process too; ``new_session``: in its own process group (a
    terminal's Ctrl-C reaches the whole group)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "render.service.server", "--port", "0", "--workers", str(workers),
         *args],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=new_session,
    )
    assert proc.stdout is not None
    output: list[str] = []
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    try:
        # Raw os.read, not readline: a buffered reader can hold a ready line while select()
        # reports the pipe empty.
        while len(READY.findall("".join(output))) < workers:
            left = deadline - time.monotonic()
            if left <= 0 or proc.poll() is not None:
                raise RuntimeError("render server did not get ready:\n" + "".join(output))
            if select.select([fd], [], [], left)[0]:
                output.append(os.read(fd, 65536).decode(errors="replace"))
        url = READY.findall("".join(output))[0]
        # Keep draining so a chatty server never blocks on a full pipe.
        threading.Thread(target=lambda: output.extend(
            b.decode(errors="replace") for b in iter(lambda: os.read(fd, 65536), b"")),
            daemon=True).start()
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()

"""Test helper: a real `kvroute render` process on port 0, ready when it says so on stdout.

The process's output is read from the start by a thread; a test waits on lines it prints (its
"ready on URL" per worker, "render helpers ready" per helper pool, "template helper ready" per
template helper) instead of polling it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
READY = re.compile(r"kvroute render: ready on (http://\S+)")
HELPERS_READY = re.compile(r"kvroute render: render helpers ready \(worker (\d+): pids ([\d, ]+)\)")
# A template helper (render/service/sandbox.py) has loaded its models.
TEMPLATE_READY = re.compile(
    r"kvroute render: template helper ready \(worker (\d+): pids ([\d, ]+)\)")


class RenderService:
    """A running `kvroute render` process and everything it has printed so far."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.url = ""
        self._output: list[str] = []
        self._changed = threading.Condition()
        self._ended = False
        # Raw os.read, not readline: a buffered reader can hold a line back.
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        try:
            while chunk := os.read(fd, 65536):
                with self._changed:
                    self._output.append(chunk.decode(errors="replace"))
                    self._changed.notify_all()
        except OSError:  # the pipe was closed at teardown
            pass
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    @property
    def output(self) -> str:
        with self._changed:
            return "".join(self._output)

    def wait_output(self, pattern: re.Pattern[str], count: int = 1,
                    timeout: float = 120.0) -> list[re.Match[str]]:
        """Until the output holds ``count`` matches of ``pattern`` (each counted once: a later
        call with a higher count waits for new lines); raises if the process ends or the
        generous ``timeout`` passes first."""

        def found() -> list[re.Match[str]]:
            return list(pattern.finditer("".join(self._output)))

        with self._changed:
            if not self._changed.wait_for(lambda: len(found()) >= count or self._ended, timeout):
                raise TimeoutError(f"no {count} x {pattern.pattern!r} in {timeout:g} s:\n"
                                   + "".join(self._output)[-4000:])
            matches = found()
        if len(matches) < count:
            raise RuntimeError("the render server ended:\n" + self.output[-4000:])
        return matches

    def wait_helpers_ready(self, count: int = 1, timeout: float = 180.0) -> list[int]:
        """Until the ``count``-th helper pool (a respawn counts) has loaded its models: its pids."""
        match = self.wait_output(HELPERS_READY, count, timeout)[count - 1]
        return [int(p) for p in match.group(2).split(",")]


@contextmanager
def render_service(*args: str, timeout: float = 180.0, workers: int = 1,
                   new_session: bool = False) -> Iterator[RenderService]:
    """Starts ``python -m render.service.server --port 0 ARGS``; yields it once all workers are up
    (``timeout``: a generous bound on a hang, the start takes seconds).
    ``new_session``: in its own process group (a terminal's Ctrl-C reaches the whole group)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "render.service.server", "--port", "0", "--workers", str(workers),
         *args],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=new_session,
    )
    service = RenderService(proc)
    try:
        try:
            service.url = service.wait_output(READY, workers, timeout)[0].group(1)
        except (TimeoutError, RuntimeError) as e:
            raise RuntimeError(f"render server did not get ready: {e}") from None
        yield service
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        service._reader.join(15)
        assert proc.stdout is not None
        proc.stdout.close()


@contextmanager
def render_server(*args: str, timeout: float = 180.0, workers: int = 1) -> Iterator[str]:
    """``render_service`` yielding its URL."""
    with render_service(*args, timeout=timeout, workers=workers) as service:
        yield service.url


@contextmanager
def render_process(*args: str, timeout: float = 180.0, workers: int = 1,
                   new_session: bool = False) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``render_service`` yielding its URL and process."""
    with render_service(*args, timeout=timeout, workers=workers,
                        new_session=new_session) as service:
        yield service.url, service.proc

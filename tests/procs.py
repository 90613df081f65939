"""Test helper: a `kvroute` subcommand as a real process, ready when its output says so.

``started`` spawns ``python -m kvroute.cli ARGS`` (the `kvroute` entry point), reads its merged
stdout/stderr until a regex matches (or the process exits, or the timeout passes) and yields the
match; on exit the process (and its process group) is stopped if it still runs.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Proc:
    popen: subprocess.Popen[bytes]
    output: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.output)

    def wait_for(self, pattern: str, timeout: float = 120.0) -> re.Match[str]:
        """Until ``pattern`` appears in the output (raw reads, so no buffered line hides)."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        assert self.popen.stdout is not None
        fd = self.popen.stdout.fileno()
        while (m := regex.search(self.text)) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {pattern!r} after {timeout}s:\n{self.text}")
            if select.select([fd], [], [], left)[0]:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise RuntimeError(f"exited ({self.popen.wait()}) before {pattern!r}:\n"
                                       f"{self.text}")
                self.output.append(chunk.decode(errors="replace"))
        return m

    def drain(self) -> None:
        """Keep reading in the background, so a chatty process never blocks on a full pipe."""
        assert self.popen.stdout is not None
        fd = self.popen.stdout.fileno()
        threading.Thread(target=lambda: self.output.extend(
            b.decode(errors="replace") for b in iter(lambda: os.read(fd, 65536), b"")),
            daemon=True).start()

    def finish(self, timeout: float = 60.0) -> tuple[int, str]:
        """The exit code and the whole output, once the process has exited."""
        code = self.popen.wait(timeout)
        assert self.popen.stdout is not None
        rest = self.popen.stdout.read()
        self.output.append(rest.decode(errors="replace"))
        return code, self.text


def kvroute_env(**overrides: str | None) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1",
               TOKENIZERS_PARALLELISM="false")
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


@contextmanager
def started(args: list[str], env: Mapping[str, str] | None = None) -> Iterator[Proc]:
    """``kvroute ARGS`` in its own process group; stopped (group SIGKILL) if still running."""
    popen = subprocess.Popen([sys.executable, "-m", "kvroute.cli", *args], cwd=ROOT,
                             env=dict(env) if env is not None else kvroute_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True)
    proc = Proc(popen)
    try:
        yield proc
    finally:
        if popen.poll() is None:
            with_group = popen.pid
            try:
                os.killpg(with_group, signal.SIGKILL)
            except ProcessLookupError:
                pass
            popen.wait(30)
        assert popen.stdout is not None
        popen.stdout.close()


def run(args: list[str], env: Mapping[str, str] | None = None,
        timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """``kvroute ARGS`` to completion, output captured."""
    return subprocess.run([sys.executable, "-m", "kvroute.cli", *args], cwd=ROOT,
                          env=dict(env) if env is not None else kvroute_env(),
                          capture_output=True, text=True, timeout=timeout)

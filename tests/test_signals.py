"""Every kvroute process exits promptly on SIGTERM and SIGINT, leaving no child behind; a sim engine
whose router has gone exits by itself.

Bounds are generous ``wait(timeout=...)`` calls (a busy 2-core box), never measured durations.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psutil
import pytest

from tests.procs import Proc, started
from tests.render_proc import HELPERS_READY
from tests.test_render_offload import _helper_pids, _metrics

EXIT_TIMEOUT = 30.0
SIGNALS = ["SIGTERM", "SIGINT"]


def _children(proc: Proc) -> list[psutil.Process]:
    return psutil.Process(proc.popen.pid).children(recursive=True)


def _gone(procs: list[psutil.Process]) -> None:
    _, alive = psutil.wait_procs(procs, timeout=EXIT_TIMEOUT)
    assert alive == []


def _sim_args(handshake: str, *extra: str) -> list[str]:
    return ["sim-engine", "--handshake-address", handshake, "--vocab-size", "1000",
            "--step-time", "0.001", *extra]


@contextmanager
def router_with_sim(tmp_path: Path, *sim_extra: str) -> Iterator[tuple[Proc, Proc, str]]:
    handshake = f"ipc://{tmp_path}/a.hs"
    with started(["router", "--port", "0", "--plain-logs", "--engine", f"a={handshake}"]) as router:
        url = router.wait_for(r"kvroute router: serving \S+ on (http://\S+) ").group(1)
        with started(_sim_args(handshake, *sim_extra)) as sim:
            sim.wait_for(r"sim-engine INFO ready: rank 0")
            router.wait_for(r"engine ready engine=a")
            router.drain()
            sim.drain()
            yield router, sim, url


@pytest.mark.parametrize("sig", SIGNALS)
def test_router_exits_on_signal_and_its_engine_on_the_next(tmp_path: Path, sig: str) -> None:
    """The shutdown order: the router stops first (its engine waits for it), then the engine."""
    with router_with_sim(tmp_path) as (router, sim, url):
        assert httpx.get(f"{url}/ready", timeout=30).status_code == 200
        kids = _children(router)
        router.popen.send_signal(getattr(signal, sig))
        assert router.popen.wait(EXIT_TIMEOUT) == 0
        _gone(kids)
        assert sim.popen.poll() is None  # waits for a router that may come back
        sim.popen.send_signal(getattr(signal, sig))
        assert sim.popen.wait(EXIT_TIMEOUT) == 0


@pytest.mark.parametrize("sig", SIGNALS)
def test_sim_engine_exits_on_signal_while_serving(tmp_path: Path, sig: str) -> None:
    with router_with_sim(tmp_path) as (router, sim, url):
        sim.popen.send_signal(getattr(signal, sig))
        assert sim.popen.wait(EXIT_TIMEOUT) == 0
        router.popen.send_signal(signal.SIGTERM)
        assert router.popen.wait(EXIT_TIMEOUT) == 0


@pytest.mark.parametrize("sig", SIGNALS)
def test_sim_engine_exits_on_signal_before_any_router(tmp_path: Path, sig: str) -> None:
    """Still in the handshake (nobody bound the address): the signal ends the wait."""
    with started(_sim_args(f"ipc://{tmp_path}/nobody.hs")) as sim:
        sim.wait_for(r"handshake with")
        sim.popen.send_signal(getattr(signal, sig))
        assert sim.popen.wait(EXIT_TIMEOUT) == 0


def test_sim_engine_exits_by_itself_when_its_router_is_killed(tmp_path: Path) -> None:
    with router_with_sim(tmp_path, "--frontend-gone-timeout", "1") as (router, sim, _):
        router.popen.kill()
        router.popen.wait(EXIT_TIMEOUT)
        assert sim.popen.wait(EXIT_TIMEOUT + 30) == 0
        assert re.search(r"frontend at \S+ has been gone for 1 s; exiting", sim.text)


@pytest.mark.parametrize("sig", SIGNALS)
def test_render_and_its_helper_exit_on_signal(sig: str) -> None:
    """One worker and its render helper process: SIGTERM to the service, or a terminal's Ctrl-C
    (SIGINT to the whole process group), stops both."""
    with started(["render", "--port", "0", "--render-processes", "1"]) as render:
        render.wait_for(r"kvroute render: ready on (http://\S+)")
        render.wait_for(HELPERS_READY.pattern, timeout=180)
        render.drain()
        kids = _children(render)
        assert any("spawn_main" in " ".join(p.cmdline()) for p in kids)
        if sig == "SIGTERM":
            render.popen.send_signal(signal.SIGTERM)
        else:
            os.killpg(render.popen.pid, signal.SIGINT)
        assert render.popen.wait(EXIT_TIMEOUT) == 0
        _gone(kids)


def test_a_render_helper_exits_on_sigterm_and_is_replaced() -> None:
    with started(["render", "--port", "0", "--render-processes", "1"]) as render:
        url = render.wait_for(r"kvroute render: ready on (http://\S+)").group(1)
        first = render.wait_for(HELPERS_READY.pattern, timeout=180)
        [pid] = [int(p) for p in first.group(2).split(",")]
        helper = psutil.Process(pid)
        helper.send_signal(signal.SIGTERM)
        _gone([helper])
        # The respawned pool announces itself with a second ready line, with its new pid.
        second = render.wait_for(f"(?s){HELPERS_READY.pattern}.*({HELPERS_READY.pattern})",
                                 timeout=180)
        assert int(second.group(5)) != pid
        render.drain()
        with httpx.Client(base_url=url, timeout=60) as client:
            assert _metrics(client).get("kvroute_render_helper_restarts_total", 0) >= 1
            assert _helper_pids(render.popen.pid) not in ([], [pid])
        assert render.popen.poll() is None

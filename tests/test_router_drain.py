"""SIGTERM: the router drains, and at the drain deadline what is still open ends with OpenAI's
error (an error event then [DONE] for a stream, a 503 body for a collected answer), then it exits.

Order is asserted, not durations: the stream's last events are the error and [DONE], the
connection then ends, and the process exits (a generous ``wait`` bound on a hang).
"""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path

import httpx

from tests.procs import started
from tests.test_signals import EXIT_TIMEOUT
from tests.waits import eventually

MODEL = "Qwen/Qwen3-0.6B"


def _in_flight(http: httpx.Client) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith('kvroute_in_flight{engine="a"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_streams_open_at_the_drain_deadline_end_with_an_error_event_then_done(
        tmp_path: Path) -> None:
    handshake = f"ipc://{tmp_path}/a.hs"
    config = tmp_path / "router.toml"
    config.write_text("[limits]\ndrain_timeout = 1.0\n")
    with started(["router", "--port", "0", "--plain-logs", "--config", str(config),
                  "--engine", f"a={handshake}"]) as router:
        url = router.wait_for(r"kvroute router: serving \S+ on (http://\S+) ").group(1)
        # A step of 0.05 s: 3000 tokens would take minutes, far past the deadline.
        with started(["sim-engine", "--handshake-address", handshake,
                      "--step-time", "0.05"]) as sim:
            sim.wait_for(r"sim-engine INFO ready: rank 0")
            router.wait_for(r"engine ready engine=a")
            router.drain()
            sim.drain()
            collected: list[httpx.Response] = []
            long = {"model": MODEL, "prompt": "a long one", "max_tokens": 3000}

            def collect() -> None:
                collected.append(httpx.post(f"{url}/v1/completions", json=long, timeout=120))

            with httpx.Client(base_url=url, timeout=120) as http, \
                    http.stream("POST", "/v1/completions", json={**long, "stream": True}) as r:
                assert r.status_code == 200
                lines = r.iter_lines()
                first = next(line for line in lines if line.startswith("data: "))
                assert "choices" in json.loads(first[6:]), first
                waiter = threading.Thread(target=collect)
                waiter.start()
                eventually(lambda: _in_flight(http) == 2)  # both are on the engine
                router.popen.send_signal(signal.SIGTERM)
                events = [line[6:] for line in lines if line.startswith("data: ")]
            # Tokens kept coming until the deadline; then the error, then [DONE], then the end.
            assert events[-1] == "[DONE]", events[-3:]
            error = json.loads(events[-2])["error"]
            assert error["code"] == 503 and error["type"] == "ServiceUnavailable", error
            assert "drain deadline" in error["message"]
            assert all("error" not in json.loads(e) for e in events[:-2])
            waiter.join(EXIT_TIMEOUT)
            [answer] = collected
            assert answer.status_code == 503, answer.text
            assert "drain deadline" in answer.json()["error"]["message"]
            assert router.popen.wait(EXIT_TIMEOUT) == 0
            assert sim.popen.poll() is None  # the engine was not stopped, only its requests

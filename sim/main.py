"""`kvroute sim-engine`: run one simulated vLLM engine in the foreground until SIGTERM/SIGINT."""

from __future__ import annotations

import logging
import signal
import socket
import sys
from types import FrameType

from sim.config import build_parser, config_from_args
from sim.engine import SimEngine
from sim.protocol import HandshakeTimeout


def cli(argv: list[str]) -> int:
    ns = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s sim-engine %(levelname)s %(message)s"
    )
    from render.hub import ModelUnavailable

    try:
        config = config_from_args(ns)
    except (ValueError, OSError, ModelUnavailable) as e:
        print(f"kvroute sim-engine: {e}", file=sys.stderr)
        return 2
    engine: SimEngine | None = None

    def on_signal(signum: int, frame: FrameType | None) -> None:
        # The engine's loop is woken to stop, not unwound by an exception: pyzmq's poll
        # retries after a signal and an exception the handler raises there is lost, so the
        # wait for a frontend would go on. Like vLLM on SIGTERM, no ENGINE_CORE_DEAD is sent.
        if engine is None:
            raise SystemExit(0)
        engine.stop_from_signal()

    # SIGINT too: a shell starts background jobs with SIGINT ignored, and Ctrl-C must stop it.
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # A signal may be taken by a thread other than the one blocked in zmq's poll, which then
    # goes on waiting: the wakeup socket makes that poll return, and the handler runs.
    wake_rx, wake_tx = socket.socketpair()
    wake_rx.setblocking(False)
    wake_tx.setblocking(False)
    signal.set_wakeup_fd(wake_tx.fileno(), warn_on_full_buffer=False)
    engine = SimEngine(config, signal_fd=wake_rx)
    face = None
    if config.http is not None:
        from sim.http.face import HttpFace

        face = HttpFace(engine).start()
    try:
        logging.info(
            "rank %d: handshake with %s (block_size=%d, num_gpu_blocks=%d, step_time=%gs)",
            config.data_parallel_rank,
            config.handshake_address,
            config.block_size,
            config.num_gpu_blocks,
            config.step_time,
        )
        if face is not None:
            if not face.wait_ready() or face.error is not None:
                print(f"kvroute sim-engine: the HTTP face failed to start: {face.error!r}",
                      file=sys.stderr)
                return 1
            # The line tests and tools wait for (with --port 0 it says which port).
            if config.http is not None and config.http.render_work == "vllm":
                print("kvroute sim-engine: text requests also do vLLM's render work "
                      "(--render-work vllm)", flush=True)
            if config.http is not None and config.http.render_time is not None:
                base, per_token = config.http.render_time
                print(f"kvroute sim-engine: text requests wait vLLM's render time, "
                      f"{base * 1e3:g} ms + {per_token * 1e6:g} us a prompt token, one at a "
                      "time (--render-work vllm-time)", flush=True)
            print(f"kvroute sim-engine: HTTP face on {face.url}", flush=True)
        engine.run()
    except HandshakeTimeout as e:
        print(f"kvroute sim-engine: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    except Exception:
        return 1
    finally:
        if face is not None:
            face.stop()
        # A signal before run() took over its sockets: close them, or the exit's context
        # teardown waits for them for ever.
        engine.release()
    return 0

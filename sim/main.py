"""`kvroute sim-engine`: run one simulated vLLM engine in the foreground until SIGTERM/SIGINT."""

from __future__ import annotations

import logging
import signal
import sys
from types import FrameType

from sim.config import build_parser, config_from_args
from sim.engine import SimEngine
from sim.protocol import HandshakeTimeout


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    # Unwinds run() through its finally: sockets close, and (like vLLM on SIGTERM) no
    # ENGINE_CORE_DEAD is sent.
    raise SystemExit(0)


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
    # SIGINT too: a shell starts background jobs with SIGINT ignored, and Ctrl-C must stop it.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGINT, _exit_on_signal)
    engine = SimEngine(config)
    try:
        logging.info(
            "rank %d: handshake with %s (block_size=%d, num_gpu_blocks=%d, step_time=%gs)",
            config.data_parallel_rank,
            config.handshake_address,
            config.block_size,
            config.num_gpu_blocks,
            config.step_time,
        )
        engine.run()
    except HandshakeTimeout as e:
        print(f"kvroute sim-engine: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    except Exception:
        return 1
    finally:
        # A signal before run() took over its sockets: close them, or the exit's context
        # teardown waits for them for ever.
        engine.release()
    return 0

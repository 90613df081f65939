"""Is a linked ZMQ engine still there? Its sockets' connection events and idle probes tell.

vLLM's engine sends nothing while it has no work, so silence alone says nothing about an idle
engine, and under load it takes ``dead_after`` seconds. Two cheaper signals, both confirmed by a
probe before an engine is declared dead (a stranger admitted to a socket can open and drop
connections too):

- **Connection events**: a ZMQ socket monitor on the engine's input ROUTER and output PULL
  reports every dropped connection at once (a killed process's sockets are closed by its kernel,
  on this host or another). The probe is a utility call with no reconnect grace: if the engine's
  DEALER is gone the input socket cannot route it (EHOSTUNREACH), and the engine is dead. A probe
  that routes but is not answered in time proves nothing while the engine has work (a long step);
  the silence watchdog keeps that case.
- **Idle probes**: a linked engine without work that has not been heard from for ``idle_after``
  seconds gets the same cheap utility call (``is_sleeping``); one that routes but stays
  unanswered past the verify timeout is hung, and is declared dead (and kept probed, so it is
  re-adopted if it wakes up).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from router.link.engine_state import EngineState, EngineStatus

# Events read from the monitors: a dropped connection is what matters.
WATCHED = zmq.EVENT_DISCONNECTED


def open_monitors(eng: EngineState) -> None:
    """Monitor the engine's input and output sockets (call once their sockets are bound).

    libzmq keeps one monitor per socket; the PAIR sockets are ours, not pyzmq's cached
    ``get_monitor_socket`` one, so a tool that asks for its own monitor gets it (in place of
    this one) instead of sharing our events."""
    eng.monitors = []
    for sock in (eng.input, eng.output):
        address = f"inproc://kvroute.monitor.{id(sock):x}"
        sock.monitor(address, WATCHED)
        pair = sock.context.socket(zmq.PAIR)
        pair.connect(address)
        eng.monitors.append(pair)


def close_monitors(eng: EngineState) -> None:
    """Stop and close the monitors: open ones would keep the context from terminating."""
    for sock in (eng.input, eng.output):
        with contextlib.suppress(zmq.ZMQError):
            sock.disable_monitor()
    for mon in eng.monitors:
        mon.close(linger=0)
    eng.monitors = []


async def watch_connections(eng: EngineState,
                            dropped: Callable[[EngineState], Awaitable[None]]) -> None:
    """Runs for the engine's lifetime: ``dropped(eng)`` after every connection its input or
    output socket lost while the engine was linked."""
    poller = zmq.asyncio.Poller()
    for mon in eng.monitors:
        poller.register(mon, zmq.POLLIN)
    while True:
        for mon, _ in await poller.poll():
            event = parse_monitor_message(await mon.recv_multipart())
            if event["event"] != zmq.EVENT_DISCONNECTED:
                continue
            eng.counters.disconnects += 1
            if eng.status is EngineStatus.READY:
                await dropped(eng)


def idle_due(eng: EngineState, now: float, idle_after: float, busy: bool) -> bool:
    """A linked engine with no work, not heard from for ``idle_after`` seconds."""
    return (eng.status is EngineStatus.READY and not busy and not eng.checking
            and now - eng.last_output >= idle_after)

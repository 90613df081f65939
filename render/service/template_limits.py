"""Inside a template helper process: a cap on its address space and a timer on each render.

A request's own chat template is code the operator did not write: one line of Jinja can ask for
ten gigabytes (``'x' * 10**10``) or loop for ever (nested ``range`` loops). It renders in a helper
process of its own (render/service/sandbox.py) whose address space, once its models are loaded, is
capped at what it holds plus ``memory_mib``: an allocation past that fails with MemoryError
instead of growing the process until the kernel's OOM killer picks a victim. Each render runs
under a ``seconds`` interval timer whose SIGALRM raises in the helper's main thread (where a
process pool runs its jobs) at the template's next bytecode. Both become a 400 naming the limit,
and the helper lives on. What neither can stop (a single C call that neither returns nor
allocates past the cap in time, or a native allocation failure that aborts) the serving process
stops from outside: it kills the helper ``KILL_GRACE`` seconds past the time limit.
"""

from __future__ import annotations

import os
import resource
import signal
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from render.errors import TemplateLimitError
from render.memory import release_freed_heap
from render.service.config import TemplateLimits

T = TypeVar("T")
# How long past the time limit the serving process waits before it kills the helper.
KILL_GRACE = 2.0


class OverTime(BaseException):
    """SIGALRM in a helper: a BaseException, so no ``except Exception`` on the way swallows it."""


def _alarm(signum: int, frame: Any) -> None:
    raise OverTime()


def _address_space() -> int | None:
    """This process's virtual size in bytes (None where /proc cannot tell)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def install(limits: TemplateLimits) -> None:
    """Called once in a helper process whose models are loaded: caps its address space at what it
    maps now plus the allowance, and makes SIGALRM raise ``OverTime``."""
    size = _address_space()
    if size is not None and sys.platform.startswith("linux"):
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = size + (limits.memory_mib << 20)
        if hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    signal.signal(signal.SIGALRM, _alarm)


def over_time(limits: TemplateLimits) -> TemplateLimitError:
    return TemplateLimitError(
        f"The request's chat template took longer than the {limits.seconds:g} s one render may "
        "take.", "time")


def over_memory(limits: TemplateLimits) -> TemplateLimitError:
    return TemplateLimitError(
        f"The request's chat template needed more than the {limits.memory_mib} MiB of memory one "
        "render may take.", "memory")


def process_ended(limits: TemplateLimits) -> TemplateLimitError:
    return TemplateLimitError(
        "The request's chat template ended the process rendering it (limits: "
        f"{limits.seconds:g} s, {limits.memory_mib} MiB).", "ended")


def run_limited(limits: TemplateLimits, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` under the time limit; running past it or out of memory is a
    TemplateLimitError. An alarm landing after ``fn`` returned, before the timer is disarmed,
    escapes as OverTime: the serving process reads that as over time too."""
    signal.setitimer(signal.ITIMER_REAL, limits.seconds)
    try:
        return fn(*args)
    except OverTime:
        raise over_time(limits) from None
    except MemoryError:
        release_freed_heap()  # what the failed render grew the heap by
        raise over_memory(limits) from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)

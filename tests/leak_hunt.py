"""A pytest plugin that names the test that left an object to the garbage collector with a
resource still open (a socket, a file): ``./dev test -p tests.leak_hunt`` (any pytest command).

Such an object in a reference cycle is freed in whichever later test runs the next full
collection, and its ResourceWarning (an error in this suite) fails that test, not the one that
leaked it. Loaded, this plugin runs a full collection after every test's teardown and appends
what was caught, with the test that just ended and, under ``PYTHONTRACEMALLOC=25``, where the
object was allocated, to ``$KVROUTE_LEAK_LOG`` (default ``leaks.txt``); the tests themselves
pass on. A full collection per test makes the suite slower: not loaded by default.
"""

from __future__ import annotations

import gc
import os
import sys
import tracemalloc
from typing import Any

import pytest


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    caught: list[Any] = []
    previous = sys.unraisablehook
    sys.unraisablehook = caught.append
    try:
        gc.collect()
    finally:
        sys.unraisablehook = previous
    if not caught:
        return
    with open(os.environ.get("KVROUTE_LEAK_LOG", "leaks.txt"), "a") as log:
        for u in caught:
            log.write(f"== after {item.nodeid} (pid {os.getpid()})\n"
                      f"{u.exc_value!r} in {u.object!r}\n")
            where = tracemalloc.get_object_traceback(u.object) if tracemalloc.is_tracing() else None
            if where is not None:
                log.write("\n".join(where.format()) + "\n")

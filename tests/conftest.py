"""Shared pytest configuration: fixtures live in their own modules, registered here.

Hypothesis profiles: ``ci`` (the default) is derandomized, so every machine and every run tries
the same examples and a failure seen in CI reproduces on a laptop; ``dev`` explores new random
examples each run. Pick one with ``HYPOTHESIS_PROFILE=dev`` or ``--hypothesis-profile dev``.
Neither has a deadline: an example's duration depends on how busy the machine is.
"""

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

pytest_plugins = ["tests.engines", "tests.vllm_serve", "tests.parity_report"]


@pytest.fixture(scope="session", autouse=True)
def _router_state_under_tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Routers started by tests keep their engines' handshake state (`--state-dir`, default
    $XDG_STATE_HOME/kvroute) under the session's tmp dir, never in the user's home."""
    old = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("xdg-state"))
    yield
    if old is None:
        os.environ.pop("XDG_STATE_HOME", None)
    else:
        os.environ["XDG_STATE_HOME"] = old

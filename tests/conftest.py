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

pytest_plugins = ["tests.engines", "tests.vllm_serve", "tests.parity_report",
                  "tests.openai_clients"]

# Under pytest-xdist (./dev test runs two workers) tests are sent to the workers by group: every
# test that uses the session's real vLLM processes (tests/engines.py, tests/vllm_serve.py), or
# starts a vLLM engine of its own (tests/test_*_vllm.py), is in the group "vllm", so those
# processes start once and no two engine starts compete; any other test is grouped by its file,
# so a module-scoped fixture (a server, a referee run) is made once.
SHARED_VLLM = frozenset({"vllm_engine", "vllm_serve"})


def uses_shared_vllm(item: pytest.Item) -> bool:
    names = set(getattr(item, "fixturenames", ()))
    callspec = getattr(item, "callspec", None)
    via_param = callspec is not None and callspec.params.get("engine") == "vllm"
    return bool(names & SHARED_VLLM) or via_param or item.path.name.endswith("_vllm.py")


def pytest_itemcollected(item: pytest.Item) -> None:
    # As each test is collected: xdist reads the groups when the collection is modified.
    if item.config.pluginmanager.hasplugin("xdist"):
        group = "vllm" if uses_shared_vllm(item) else item.path.name
        item.add_marker(pytest.mark.xdist_group(group))


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

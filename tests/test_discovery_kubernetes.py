"""Kubernetes discovery (lightkube) against the fake API server: list, watch, bookmarks, 410,
dropped watches, outages; and the engine set after any sequence of them equals the pods'."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from discovery.endpoints import Endpoint
from discovery.kubernetes import KubernetesSource
from discovery.options import KubernetesOptions
from discovery.selector import Selector
from tests.discovery_follow import Follower
from tests.fake_kube import FakeKube, FakePod
from tests.waits import arrives

SELECTOR = "app=engine"


def _source(kube: FakeKube, tmp: Path, **options: object) -> KubernetesSource:
    opts = {"selector": SELECTOR, "port": "http", "kubeconfig": str(kube.kubeconfig(tmp / "kc")),
            "retry_min": 0.01, "retry_max": 0.05, **options}
    return KubernetesSource(KubernetesOptions(**opts))  # type: ignore[arg-type]


def expected(pods: dict[str, FakePod], selector: str = SELECTOR, port: str = "http"
             ) -> dict[str, Endpoint]:
    """The naive model: the engine set rebuilt from the pods as they are now."""
    sel = Selector.parse(selector)
    out = {}
    for p in pods.values():
        if p.ip is None or not sel.matches(p.labels) or port not in p.ports:
            continue
        ready = p.ready and p.phase == "Running" and not p.deleting
        out[p.name] = Endpoint(p.name, f"http://{p.ip}:{p.ports[port]}", ready)
    return out


async def synced(kube: FakeKube, source: KubernetesSource, follower: Follower) -> None:
    """Until the source has seen everything the server has (bookmarks bring its version up
    past events its selector filters out) and the follower has every change it yielded."""
    def caught_up() -> bool:
        follower.check()
        kube.bookmark()
        return source.resource_version == str(kube.current_version()) \
            and follower.engines == source.pods

    await arrives(caught_up)


@pytest.fixture
async def kube() -> AsyncIterator[FakeKube]:
    with FakeKube() as k:
        yield k


async def test_pods_join_change_address_turn_not_ready_and_leave(kube: FakeKube,
                                                                tmp_path: Path) -> None:
    kube.add_pod("a", "127.0.0.2")
    kube.add_pod("pending", None)  # no address yet: not an engine
    kube.add_pod("other", "127.0.0.9", labels={"app": "else"})
    source = _source(kube, tmp_path)
    async with Follower(source) as f:
        await arrives(lambda: kube.open_watches() == 1)
        assert f.engines == {"a": Endpoint("a", "http://127.0.0.2:8000", True)}
        kube.add_pod("b", "127.0.0.3", ready=False, ports={"http": 9000})
        kube.update_pod("pending", ip="127.0.0.4")
        await synced(kube, source, f)
        assert f.engines == expected(kube.pods) and f.engines["b"].ready is False
        assert f.engines["b"].url == "http://127.0.0.3:9000"  # the named port's number
        kube.update_pod("b", ready=True)
        kube.update_pod("a", ip="127.0.0.5")  # recreated elsewhere: a new address
        kube.update_pod("pending", deleting=True)  # terminating: leaving
        await synced(kube, source, f)
        assert f.engines == expected(kube.pods)
        assert f.engines["a"].url == "http://127.0.0.5:8000"
        assert f.engines["pending"].ready is False
        kube.delete_pod("pending")
        kube.update_pod("b", labels={"app": "else"})  # no longer selected: it leaves
        await synced(kube, source, f)
        assert f.engines == {"a": Endpoint("a", "http://127.0.0.5:8000", True)}
    assert source.counters.lists == 1 and source.counters.errors == 0
    watch = [q for path, q in kube.requests if q.get("watch") == "true"]
    assert watch and all(q["allowWatchBookmarks"] == "true" and q["labelSelector"] == SELECTOR
                         for q in watch)


async def test_a_numbered_port_and_a_missing_port_name(kube: FakeKube, tmp_path: Path) -> None:
    kube.add_pod("a", "127.0.0.2", ports={"metrics": 9090})
    async with Follower(_source(kube, tmp_path, port=8001)) as f:
        await arrives(lambda: f.engines == {"a": Endpoint("a", "http://127.0.0.2:8001")})
    async with Follower(source := _source(kube, tmp_path, port="http")) as f:
        await synced(kube, source, f)
        assert f.engines == {}  # no container port named http: not an engine


async def test_a_cut_watch_relists_without_losing_or_duplicating(kube: FakeKube,
                                                                 tmp_path: Path) -> None:
    for i in range(3):
        kube.add_pod(f"p{i}", f"127.0.0.{i + 2}")
    source = _source(kube, tmp_path)
    async with Follower(source) as f:
        await arrives(lambda: kube.open_watches() == 1)
        assert kube.drop_watches() == 1  # the connection is cut mid-stream
        # While no watch is open: one pod goes, one comes, one changes.
        kube.delete_pod("p0")
        kube.add_pod("p3", "127.0.0.9")
        kube.update_pod("p1", ready=False)
        await synced(kube, source, f)
        assert f.engines == expected(kube.pods)
        assert source.counters.lists == 2 and source.counters.errors == 1
    joined = [c.endpoint.name for c in f.log if c.kind.value == "joined"]
    assert sorted(joined) == ["p0", "p1", "p2", "p3"]  # each once


async def test_a_watch_ended_by_the_server_resumes_from_its_version(kube: FakeKube,
                                                                    tmp_path: Path) -> None:
    kube.add_pod("a", "127.0.0.2")
    source = _source(kube, tmp_path)
    async with Follower(source) as f:
        await arrives(lambda: kube.open_watches() == 1)
        assert kube.drop_watches(clean=True) == 1
        kube.add_pod("b", "127.0.0.3")
        await synced(kube, source, f)
        assert f.engines == expected(kube.pods)
    assert source.counters.lists == 1  # resumed, no relist needed
    versions = [q.get("resourceVersion") for _, q in kube.requests if q.get("watch")]
    assert len(versions) >= 2 and versions[0] == versions[1]


@pytest.mark.parametrize("how", ["in_stream", "status"])
async def test_410_gone_relists(kube: FakeKube, tmp_path: Path, how: str) -> None:
    kube.add_pod("a", "127.0.0.2")
    kube.add_pod("b", "127.0.0.3")
    source = _source(kube, tmp_path)
    async with Follower(source) as f:
        await arrives(lambda: kube.open_watches() == 1)
        if how == "in_stream":
            assert kube.expire_watches() == 1  # ERROR event with a 410 Status
        else:
            kube.fail_next(1, 410)  # the resumed watch is answered 410
            kube.drop_watches(clean=True)
        kube.delete_pod("a")
        kube.add_pod("c", "127.0.0.4")
        await synced(kube, source, f)
        assert f.engines == expected(kube.pods)
    assert source.counters.expired == 1 and source.counters.lists == 2
    assert source.counters.errors == 0
    assert [c.endpoint.name for c in f.log] == ["a", "b", "a", "c"]  # a left, c joined


async def test_bookmarks_keep_a_resumed_watch_out_of_410(kube: FakeKube, tmp_path: Path) -> None:
    kube.add_pod("a", "127.0.0.2")
    source = _source(kube, tmp_path)
    async with Follower(source) as f:
        await arrives(lambda: kube.open_watches() == 1)
        for i in range(5):  # changes the selector filters out: the watch sees none of them
            kube.add_pod(f"x{i}", "127.0.0.9", labels={"app": "else"})
        assert kube.bookmark() == 1
        await arrives(lambda: source.resource_version == str(kube.current_version()))
        kube.compact()  # history before now is gone
        kube.drop_watches(clean=True)
        kube.add_pod("b", "127.0.0.3")
        await synced(kube, source, f)
        assert f.engines == expected(kube.pods)
    assert source.counters.bookmarks >= 1
    assert source.counters.expired == 0 and source.counters.lists == 1


async def test_an_unreachable_api_server_keeps_the_engines(kube: FakeKube,
                                                          tmp_path: Path) -> None:
    kube.add_pod("a", "127.0.0.2")
    source = _source(kube, tmp_path)
    async with Follower(source) as f:
        await arrives(lambda: kube.open_watches() == 1)
        kube.fail_next(4, 503)  # the next lists fail
        kube.drop_watches()
        await arrives(lambda: source.counters.errors >= 5)
        assert f.engines == {"a": Endpoint("a", "http://127.0.0.2:8000")}
        kube.add_pod("b", "127.0.0.3")
        await synced(kube, source, f)
        assert f.engines == expected(kube.pods)


# ---- any sequence of pod changes and watch faults ----

NAMES = ("p0", "p1", "p2", "p3")
IPS = ("127.0.0.2", "127.0.0.3", "127.0.0.4", None)
LABELS = ({"app": "engine"}, {"app": "else"}, {"app": "engine", "tier": "x"})
def histories(names: tuple[str, ...] = NAMES, min_size: int = 0,
              max_size: int = 25) -> st.SearchStrategy[list[tuple[Any, ...]]]:
    """Sequences of pod changes and watch faults over ``names``, with waits for the source to
    catch up in between (so intermediate states are reached, not only the last one)."""
    name = st.sampled_from(names)
    op = st.one_of(
        st.tuples(st.just("add"), name, st.sampled_from(IPS), st.booleans(),
                  st.sampled_from(range(len(LABELS)))),
        st.tuples(st.just("ip"), name, st.sampled_from(IPS)),
        st.tuples(st.just("ready"), name, st.booleans()),
        st.tuples(st.just("labels"), name, st.sampled_from(range(len(LABELS)))),
        st.tuples(st.just("terminate"), name),
        st.tuples(st.just("delete"), name),
        st.tuples(st.just("drop"), st.booleans()),
        st.tuples(st.just("expire")),
        st.tuples(st.just("compact")),
        st.tuples(st.just("bookmark")),
        st.tuples(st.just("fail"), st.sampled_from([410, 500])),
    )
    return st.lists(st.one_of(op, st.just(("settle",))), min_size=min_size, max_size=max_size)


async def apply_op(kube: FakeKube, source: KubernetesSource, follower: Follower | None,
                   op: tuple[Any, ...]) -> None:
    """One step of a history: a pod change (on a pod not there yet, it is created first),
    a watch fault, or (with a follower) a wait until the source has caught up."""
    kind, args = op[0], op[1:]
    name: Any = args[0] if args and args[0] in NAMES else None
    if name is not None and name not in kube.pods and kind != "add":
        kube.add_pod(name, "127.0.0.5")  # a pod to change: it is there first
    if kind == "add":
        _, ip, ready, labels = args
        if name in kube.pods:
            kube.delete_pod(name)
        kube.add_pod(name, ip, ready=ready, labels=LABELS[labels])
    elif kind == "ip":
        kube.update_pod(name, ip=args[1])
    elif kind == "ready":
        kube.update_pod(name, ready=args[1])
    elif kind == "labels":
        kube.update_pod(name, labels=LABELS[args[1]])
    elif kind == "terminate":
        kube.update_pod(name, deleting=True)
    elif kind == "delete":
        kube.delete_pod(name)
    elif kind == "drop":
        kube.drop_watches(clean=args[0])
    elif kind == "expire":
        kube.expire_watches()
    elif kind == "compact":
        kube.compact()
    elif kind == "bookmark":
        kube.bookmark()
    elif kind == "fail":
        kube.fail_next(1, args[0])
    elif kind == "settle" and follower is not None:
        await synced(kube, source, follower)


async def _scenario(tmp: Path, ops: list[tuple[Any, ...]]) -> None:
    with FakeKube() as kube:
        source = _source(kube, tmp)
        async with Follower(source) as f:
            for op in ops:
                await apply_op(kube, source, f, op)
                await asyncio.sleep(0)  # let the source take some of it
            await synced(kube, source, f)
            assert f.engines == expected(kube.pods)


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=histories(min_size=4))
def test_any_history_converges_to_the_pods(tmp_path: Path, ops: list[tuple[Any, ...]]) -> None:
    asyncio.run(_scenario(tmp_path, ops))

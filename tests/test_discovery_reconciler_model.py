"""Property: whatever happens to the pods and the watch (add, IP change, readiness flips,
relabels, deletes, dropped watches, 410s), once things settle the fleet holds exactly one
serving engine per ready pod, at the pod's address, and nothing else: the naive model rebuilt
from the final pod list. The real router objects (engine client, fleet, dispatcher, drains),
real lightkube against the fake API server; engines are never started (none has requests, so
a drain ends at once)."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings

from discovery.endpoints import Endpoint
from discovery.kubernetes import KubernetesSource
from discovery.options import KubernetesOptions
from radix import PrefixIndex
from router.config import EngineSpec, LinkConfig
from router.kvfeed.kv_subscriber import KVSubscriber
from router.link.engine_client import EngineClient
from router.link.http_client import HttpEngineClient
from router.link.transport import EngineLinks
from router.obs.metrics import RouterMetrics
from router.routing.admission import Admission
from router.routing.discovered import Reconciler
from router.routing.dispatch import Dispatcher
from router.routing.drain import Drains
from router.routing.fleet import Fleet
from router.routing.policy import Policy, PolicyConfig
from tests.fake_kube import FakeKube
from tests.test_discovery_kubernetes import apply_op, expected, histories
from tests.waits import arrives


async def _scenario(ops: list[tuple[Any, ...]]) -> None:
    with tempfile.TemporaryDirectory(prefix="kvr-") as tmp, FakeKube() as kube:
        index = PrefixIndex(max_blocks=1000)
        client = EngineLinks([], EngineClient(), HttpEngineClient(LinkConfig()))
        await client.start()
        kv = KVSubscriber(index)
        await kv.start()
        admission = Admission(8, 8, 1.0, 1)
        fleet = Fleet(client, kv, index, admission, [])
        dispatcher = Dispatcher(client, Policy(PolicyConfig(), index), admission,
                                RouterMetrics())
        drains = Drains(fleet, dispatcher, poll=0.001)
        paths = iter(range(10**6))

        def spec_for(engine: str, endpoint: Endpoint) -> EngineSpec:
            return EngineSpec(engine, f"ipc://{tmp}/{next(paths)}.hs")

        rec = Reconciler(fleet, drains, spec_for, drain_timeout=5.0, max_engines=64)
        source = KubernetesSource(KubernetesOptions(
            selector="app=engine", port="http", retry_min=0.005, retry_max=0.02,
            kubeconfig=str(kube.kubeconfig(Path(tmp) / "kc"))))
        task = asyncio.create_task(rec.run(source))
        def settled() -> bool:
            assert not task.done(), task
            kube.bookmark()
            want = {n: e.url for n, e in expected(kube.pods).items() if e.ready}
            return source.resource_version == str(kube.current_version()) \
                and {n: i.url for n, i in rec.engines().items()} == want \
                and not drains.tasks and len(client.engines) == len(want)

        try:
            for op in ops:
                if op[0] == "settle":
                    await arrives(settled, timeout=20)
                else:
                    await apply_op(kube, source, None, op)
                await asyncio.sleep(0)
            await arrives(settled, timeout=20)
            engines = rec.engines()
            assert set(client.engines) == {i.engine for i in engines.values()}
            assert not dispatcher.draining
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await drains.close()
            await kv.close()
            await client.close()


MOVED = [("add", "p0", "127.0.0.2", True, 0), ("settle",), ("ip", "p0", "127.0.0.3"),
         ("settle",)]
FLAP = [("add", "p0", "127.0.0.2", True, 0), ("settle",), ("ready", "p0", False),
        ("ready", "p0", True), ("settle",), ("ready", "p0", False), ("settle",),
        ("ready", "p0", True)]
BACK = [("add", "p0", "127.0.0.2", True, 0), ("settle",), ("delete", "p0"), ("settle",),
        ("add", "p0", "127.0.0.2", True, 0), ("expire",), ("delete", "p0"),
        ("add", "p0", "127.0.0.4", True, 0)]


@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@example(ops=MOVED)
@example(ops=FLAP)
@example(ops=BACK)
@given(ops=histories(("p0", "p1"), min_size=6, max_size=20))
def test_the_fleet_converges_to_the_ready_pods(ops: list[tuple[Any, ...]]) -> None:
    asyncio.run(_scenario(ops))

"""What the chart renders for each topology fits together: the routers find exactly the engine
pods (selector, Role), the engines reach exactly their router's ports, NetworkPolicies admit
only engines to those and only routers to the engines, grace periods cover the drains, probes
hit real routes, and the values schema refuses what the chart cannot run."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from discovery.selector import Selector
from router.config import from_mapping
from router.front.app import PROBES
from router.front.state import CUT_GRACE
from router.routing.policy import POLICIES
from serving.server import ServeOptions
from tests.chart import CHART, EXAMPLES, FULL, NAMESPACE, Rendered, helm, render, template_args

pytestmark = pytest.mark.deploy

EXAMPLE = {f.stem: f for f in EXAMPLES}


def _admits(rule: dict[str, Any], port: int | str) -> bool:
    return any(p["port"] == port or (isinstance(port, int) and isinstance(p["port"], int)
                                     and p["port"] <= port <= p.get("endPort", p["port"]))
               for p in rule.get("ports", []))


def _labels(r: Rendered, workload: str) -> dict[str, str]:
    labels: dict[str, str] = r.pod(workload)["metadata"]["labels"]
    return labels


def _toml(r: Rendered, key: str = "router.toml") -> dict[str, Any]:
    return tomllib.loads(r.get("ConfigMap", f"{FULL}-router")["data"][key])


def test_pods_the_routers_find_the_chart_s_engines_with_a_role_to_watch_them() -> None:
    r = render(EXAMPLE["pods-small"])
    engine = _labels(r, f"{FULL}-engine")
    discovery = _toml(r)["discovery"]
    # The selector string selects exactly the engine Deployment's pods.
    assert dict(p.split("=") for p in discovery["selector"].split(",")) == engine
    assert discovery["namespace"] == NAMESPACE and discovery["port"] == "http"
    vllm = r.container(f"{FULL}-engine")
    assert {"name": "http", "containerPort": 8000} in vllm["ports"]
    role = r.get("Role", f"{FULL}-discovery")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"],
                              "verbs": ["get", "list", "watch"]}]
    binding = r.get("RoleBinding", f"{FULL}-discovery")
    assert binding["roleRef"]["name"] == f"{FULL}-discovery"
    pod = r.pod(f"{FULL}-router")["spec"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": pod["serviceAccountName"],
                                    "namespace": NAMESPACE}]
    assert pod["automountServiceAccountToken"] is True
    router = r.get("Deployment", f"{FULL}-router")
    assert router["spec"]["replicas"] == 2
    assert router["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    # The pods publish KV events on every interface, for every router replica's subscriber.
    args = vllm["args"]
    kv = json.loads(args[args.index("--kv-events-config") + 1])
    assert kv["endpoint"] == "tcp://*:5557" and kv["replay_endpoint"] == "tcp://*:5558"
    assert "--enable-scale-out" in args and "--enable-prompt-tokens-details" in args


def test_pods_of_your_own_found_by_your_selector_in_their_namespace() -> None:
    r = render(EXAMPLE["pods-large"])
    assert not [k for k in r.objs if k == ("Deployment", f"{FULL}-engine")]
    discovery = _toml(r)["discovery"]
    assert discovery["namespace"] == "llm-engines"
    selector = Selector.parse(discovery["selector"])
    assert selector.matches({"app": "vllm-qwen3-8b"})
    assert not selector.matches({"app": "vllm-qwen3-8b", "vllm.ai/role": "canary"})
    assert not selector.matches({"app": "other"})
    # The Role is where the pods are; the binding names the routers' account in the release's.
    assert r.get("Role", f"{FULL}-discovery")["metadata"]["namespace"] == "llm-engines"
    # The engine NetworkPolicy selects the same pods, there.
    policy = r.get("NetworkPolicy", f"{FULL}-engine")
    assert policy["metadata"]["namespace"] == "llm-engines"
    assert policy["spec"]["podSelector"]["matchLabels"] == {"app": "vllm-qwen3-8b"}
    assert policy["spec"]["podSelector"]["matchExpressions"] == [
        {"key": "vllm.ai/role", "operator": "NotIn", "values": ["canary"]}]


def test_grace_periods_cover_the_drains() -> None:
    for example in ("pods-small", "pods-large", "headless"):
        r = render(EXAMPLE[example])
        router = r.container(f"{FULL}-router")
        pod = r.pod(f"{FULL}-router")["spec"]
        key = "router.toml" if example != "headless" else f"{FULL}-router-0.toml"
        toml = _toml(r, key)
        pre = router["lifecycle"]["preStop"]["sleep"]["seconds"]
        drain = toml["limits"]["drain_timeout"]
        # preStop, then the router's drain, then the cut streams' last writes, in the grace.
        assert pod["terminationGracePeriodSeconds"] >= pre + drain + CUT_GRACE, example
        if example == "pods-small":
            vllm = r.container(f"{FULL}-engine")
            shutdown = int(vllm["args"][vllm["args"].index("--shutdown-timeout") + 1])
            engine_pre = vllm["lifecycle"]["preStop"]["sleep"]["seconds"]
            engine_grace = r.pod(f"{FULL}-engine")["spec"]["terminationGracePeriodSeconds"]
            assert engine_grace > engine_pre + shutdown
            # A leaving pod's streams get as long from the routers as from vLLM.
            assert toml["discovery"]["drain_timeout"] >= engine_pre + shutdown
            # The routers outlast the longest stream an engine lets finish.
            assert drain >= shutdown


def test_render_s_grace_covers_its_server_s_graceful_timeout() -> None:
    r = render(EXAMPLE["render-only"])
    pre = r.container(f"{FULL}-render")["lifecycle"]["preStop"]["sleep"]["seconds"]
    grace = r.pod(f"{FULL}-render")["spec"]["terminationGracePeriodSeconds"]
    assert grace > pre + ServeOptions(server="uvicorn").graceful_timeout  # render sets none


def test_probes_hit_real_routes() -> None:
    r = render(None, "render.enabled=true")
    router = r.container(f"{FULL}-router")
    assert router["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert router["livenessProbe"]["httpGet"]["path"] == "/health"
    assert router["startupProbe"]["httpGet"]["path"] == "/health"
    assert {"/ready", "/health"} <= PROBES
    assert r.container(f"{FULL}-render")["livenessProbe"]["httpGet"]["path"] == "/health"
    # The router renders through the render Service when there is one.
    args = router["args"]
    assert args[args.index("--render-url") + 1] == f"http://{FULL}-render:8100"


def test_headless_engines_dial_router_0_and_every_router_binds_their_ports() -> None:
    r = render(EXAMPLE["headless"])
    script = r.container(f"{FULL}-engine")["args"][0]
    assert '--data-parallel-rpc-port "$(( 29500 + ordinal ))"' in script
    assert "--headless" in script and '"enable_kv_cache_events": true' in script
    env = {e["name"]: e.get("value") for e in r.container(f"{FULL}-engine")["env"]}
    handshake = r.get("Service", f"{FULL}-router-handshake")
    assert env["ROUTER_HOST"] == f"{FULL}-router-handshake.{NAMESPACE}.svc"
    assert handshake["spec"]["selector"]["statefulset.kubernetes.io/pod-name"] == f"{FULL}-router-0"
    published = {p["port"] for p in handshake["spec"]["ports"]}
    owner, peer = _toml(r, f"{FULL}-router-0.toml"), _toml(r, f"{FULL}-router-1.toml")
    assert len(owner["engines"]) == len(peer["engines"]) == 4 + 2
    for slot, (mine, theirs) in enumerate(zip(owner["engines"], peer["engines"], strict=True)):
        ports = [int(mine[k].rsplit(":", 1)[1]) for k in ("handshake", "input", "output")]
        assert ports == [29500 + slot, 30500 + slot, 31500 + slot] and set(ports) <= published
        # The owner hands the engine the peer's addresses: its pod's name, the ports it binds.
        peer_host = f"{FULL}-router-1.{FULL}-router-pods.{NAMESPACE}.svc"
        assert mine["peer_inputs"] == [theirs["input"].replace("0.0.0.0", peer_host)]
        assert mine["peer_outputs"] == [theirs["output"].replace("0.0.0.0", peer_host)]
        assert "handshake" not in theirs and theirs["block_size"] == mine["block_size"]
        assert theirs["kv_events"] == mine["kv_events"] == (
            f"tcp://{FULL}-engine-{slot}.{FULL}-engine.{NAMESPACE}.svc:5557")
    headless = r.get("Service", f"{FULL}-router-pods")["spec"]
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is True
    assert r.get("StatefulSet", f"{FULL}-router")["spec"]["serviceName"] == f"{FULL}-router-pods"
    # A new set of routers restarts the engines (their peer list is fixed at the handshake).
    assert r.pod(f"{FULL}-engine")["metadata"]["annotations"]["kvroute.io/routers"] == "2"


def test_network_policies_headless() -> None:
    r = render(EXAMPLE["headless"])
    router_pods, engine_pods = _labels(r, f"{FULL}-router"), _labels(r, f"{FULL}-engine")
    router = r.get("NetworkPolicy", f"{FULL}-router")["spec"]
    assert router["podSelector"]["matchLabels"] == router_pods
    assert router["policyTypes"] == ["Ingress"]
    engine_ports = {p["port"] for p in
                    r.get("Service", f"{FULL}-router-handshake")["spec"]["ports"]}
    assert len(engine_ports) == 3 * 6  # handshake, input, output of 6 slots
    for port in engine_ports:
        admitting = [rule for rule in router["ingress"] if _admits(rule, port)]
        # Admitted, and only from engine pods: no rule without `from` (anyone) covers it.
        assert admitting and all(rule.get("from") == [{"podSelector": {"matchLabels":
                                 engine_pods}}] for rule in admitting), port
    for port in (29499, 29506, 30506, 31506):  # the ports next to the ranges stay closed
        assert not any(_admits(rule, port) for rule in router["ingress"]), port
    http = [rule for rule in router["ingress"] if _admits(rule, 8000)]
    assert http and all("from" not in rule for rule in http)  # the API is open to clients
    engine = r.get("NetworkPolicy", f"{FULL}-engine")["spec"]
    assert engine["podSelector"]["matchLabels"] == engine_pods
    assert engine["ingress"] and all(
        rule["from"] == [{"podSelector": {"matchLabels": router_pods}}]
        for rule in engine["ingress"])
    kv_ports = {p["port"] for p in r.get("Service", f"{FULL}-engine")["spec"]["ports"]}
    assert kv_ports == {5557, 5558}
    assert all(any(_admits(rule, p) for rule in engine["ingress"]) for p in kv_ports)


def test_network_policies_pods() -> None:
    r = render(EXAMPLE["pods-small"])
    router_pods = _labels(r, f"{FULL}-router")
    router = r.get("NetworkPolicy", f"{FULL}-router")["spec"]
    # The routers bind no engine port: they dial the pods. Only the API is open.
    assert [rule["ports"] for rule in router["ingress"]] == [[{"protocol": "TCP", "port": 8000}]]
    engine = r.get("NetworkPolicy", f"{FULL}-engine")["spec"]
    assert engine["podSelector"]["matchLabels"] == _labels(r, f"{FULL}-engine")
    [rule] = engine["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": router_pods}}]
    assert {p["port"] for p in rule["ports"]} == {8000, 5557, 5558}
    # Your own pods, in their namespace: the routers come from the release's namespace, and
    # the extra peers (Prometheus) are admitted too.
    large = render(EXAMPLE["pods-large"])
    [rule] = large.get("NetworkPolicy", f"{FULL}-engine")["spec"]["ingress"]
    assert rule["from"][0] == {"podSelector": {"matchLabels": router_pods},
                               "namespaceSelector": {"matchLabels": {
                                   "kubernetes.io/metadata.name": NAMESPACE}}}
    assert rule["from"][1]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "monitoring"}
    assert {p["port"] for p in rule["ports"]} == {"http", 5557, 5558}
    # Not fenced unless asked: those pods may serve other clients.
    unfenced = render(EXAMPLE["pods-large"], "networkPolicy.fenceSelectedPods=false")
    assert ("NetworkPolicy", f"{FULL}-engine") not in unfenced.objs
    off = render(None, "networkPolicy.enabled=false")
    assert not off.kinds("NetworkPolicy")


def test_render_only_is_render_alone() -> None:
    r = render(EXAMPLE["render-only"])
    assert {k for k, _ in r.objs} == {"Deployment", "Service", "PodDisruptionBudget",
                                      "HorizontalPodAutoscaler", "NetworkPolicy"}
    assert {n for _, n in r.objs} == {f"{FULL}-render"}
    hpa = r.get("HorizontalPodAutoscaler", f"{FULL}-render")["spec"]
    assert hpa["scaleTargetRef"]["name"] == f"{FULL}-render"
    assert "replicas" not in r.get("Deployment", f"{FULL}-render")["spec"]  # the HPA's
    args = r.container(f"{FULL}-render")["args"]
    assert args[args.index("--model") + 1] == "Qwen/Qwen3-8B"
    env = {e["name"] for e in r.container(f"{FULL}-render")["env"]}
    assert "HF_HUB_OFFLINE" not in env and "HF_TOKEN" in env  # a Hub id is fetched at start
    [rule] = r.get("NetworkPolicy", f"{FULL}-render")["spec"]["ingress"]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "gateway"}}}]


def test_router_autoscaling_on_cpu_or_in_flight_requests() -> None:
    r = render(EXAMPLE["pods-large"])
    hpa = r.get("HorizontalPodAutoscaler", f"{FULL}-router")["spec"]
    assert hpa["metrics"] == [{"type": "Pods", "pods": {
        "metric": {"name": "kvroute_in_flight"},
        "target": {"type": "AverageValue", "averageValue": "1500"}}}]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (4, 16)
    assert "replicas" not in r.get("Deployment", f"{FULL}-router")["spec"]
    cpu = render(None, "router.autoscaling.enabled=true")
    [metric] = cpu.get("HorizontalPodAutoscaler", f"{FULL}-router")["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu"
    refused = helm(*template_args(EXAMPLE["headless"], ("router.autoscaling.enabled=true",)),
                   check=False)
    assert refused.returncode != 0 and "headless.routers" in refused.stderr
    pdb = r.get("PodDisruptionBudget", f"{FULL}-router")["spec"]
    assert pdb["maxUnavailable"] == 1 and pdb["selector"]["matchLabels"] == _labels(
        r, f"{FULL}-router")


def test_service_monitors_scrape_the_router_and_render_services() -> None:
    r = render(None, "serviceMonitor.enabled=true", "render.enabled=true")
    for component in ("router", "render"):
        monitor = r.get("ServiceMonitor", f"{FULL}-{component}")["spec"]
        service = r.get("Service", f"{FULL}-{component}")
        labels = service["metadata"]["labels"]
        assert monitor["selector"]["matchLabels"].items() <= labels.items()
        assert monitor["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}
        assert monitor["endpoints"][0]["path"] == "/metrics"


@pytest.mark.parametrize("topology", ["pods", "headless"])
def test_extra_config_reaches_every_router(topology: str, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"topology": topology, "headless": {"routers": 2},
                                      "router": {"extraConfig": "[streams]\nmax_resumes = 1\n"}}))
    r = render(values)
    files = r.get("ConfigMap", f"{FULL}-router")["data"]
    assert len(files) == (1 if topology == "pods" else 2)
    for text in files.values():
        assert from_mapping(tomllib.loads(text)).streams.max_resumes == 1


def test_the_schema_refuses_what_the_chart_cannot_run() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["properties"]["router"]["properties"]["policy"]["enum"] == list(POLICIES)
    for bad, says in (("topology=zmq", "topology"), ("router.replica=3", "replica"),
                      ("keys.api.as=argv", "as"), ("router.policy=fastest", "policy"),
                      ("pods.portName=Not_A_Name", "portName"),
                      ("pods.create=false", "pods.selector")):  # whose pods, then?
        done = helm(*template_args(None, (bad,)), check=False)
        assert done.returncode != 0 and says in done.stderr, bad


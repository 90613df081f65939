"""The Helm chart renders, and what it renders is accepted by kvroute's own parsers and routes."""

from __future__ import annotations

import os
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from render.service.config import parse_args as parse_render_args
from router.main import parse as parse_router_args

pytestmark = pytest.mark.deploy

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "kvroute"
CACHE = Path(os.environ.get("KVROUTE_CACHE", Path.home() / ".cache" / "kvroute"))
HELM = CACHE / "helm" / "helm" / "helm"


def helm(*args: str) -> str:
    if not HELM.exists():
        pytest.fail(f"{HELM} missing: run scripts/helm.sh (./dev test does)")
    done = subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def render(*sets: str) -> dict[tuple[str, str], dict[str, Any]]:
    flags = [x for s in sets for x in ("--set", s)]
    out = helm("template", "rel", str(CHART), *flags)
    docs = [d for d in yaml.safe_load_all(out) if d]
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def container(objs: dict[tuple[str, str], dict[str, Any]], kind: str, name: str) -> Any:
    return objs[(kind, name)]["spec"]["template"]["spec"]["containers"][0]


def test_chart_lints() -> None:
    assert "0 chart(s) failed" in helm("lint", str(CHART))


def test_router_config_and_args_are_kvroute_s_own(tmp_path: Path) -> None:
    objs = render("engine.replicas=3", "router.spareEngineSlots=2", "router.apiKeySecret=k",
                  "router.adminKeySecret=adm")
    toml_text = objs[("ConfigMap", "rel-kvroute-router")]["data"]["router.toml"]
    (tmp_path / "router.toml").write_text(toml_text)
    router = container(objs, "Deployment", "rel-kvroute-router")
    args = router["args"]
    assert args[:2] == ["kvroute", "router"]
    # The keys are files mounted from the Secrets: nothing secret on the command line (readable
    # in /proc/PID/cmdline) or in the environment.
    assert "--api-key" not in args and not any("$(" in a for a in args)
    assert not [e for e in router["env"] if "valueFrom" in e]
    pod = objs[("Deployment", "rel-kvroute-router")]["spec"]["template"]["spec"]
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert secrets == {"api-key": "k", "admin-key": "adm"}
    mounts = {m["name"]: m["mountPath"] for m in router["volumeMounts"]}
    files = {}
    for volume, key in (("api-key", "api-key"), ("admin-key", "admin-key")):
        local = tmp_path / key
        local.write_text(f"{key}-value\n")
        files[f"{mounts[volume]}/{key}"] = str(local)
    argv = [str(tmp_path / "router.toml") if a == "/etc/kvroute/router.toml" else a
            for a in args[2:]]
    argv = [files.get(a, a) for a in argv]
    cfg = parse_router_args(argv)
    assert cfg.api_key == "api-key-value" and cfg.control.admin_key == "admin-key-value"
    assert cfg.port == 8000 and cfg.host == "0.0.0.0"
    assert [e.name for e in cfg.engines] == [f"engine-{i}" for i in range(5)]
    spec = cfg.engines[1]
    # Engines dial the handshake Service; the router binds wildcards on fixed ports.
    assert spec.advertise_host == "rel-kvroute-router-handshake"
    assert (spec.handshake, spec.input_address, spec.output_address) == (
        "tcp://0.0.0.0:29501", "tcp://0.0.0.0:30501", "tcp://0.0.0.0:31501")
    assert cfg.engines[1].kv_events == "tcp://rel-kvroute-engine-1.rel-kvroute-engine:5557"
    # Every port an engine dials is published by the handshake Service.
    handshake_svc = objs[("Service", "rel-kvroute-router-handshake")]
    svc_ports = {p["port"] for p in handshake_svc["spec"]["ports"]}
    for e in cfg.engines:
        for address in (e.handshake, e.input, e.output):
            assert address is not None and int(address.rsplit(":", 1)[1]) in svc_ports


def test_engine_dials_its_own_handshake_port() -> None:
    objs = render()
    engine = container(objs, "StatefulSet", "rel-kvroute-engine")
    script = engine["args"][0]
    assert '--data-parallel-rpc-port "$(( 29500 + ordinal ))"' in script
    assert "--headless" in script and '"enable_kv_cache_events": true' in script
    env = {e["name"]: e.get("value") for e in engine["env"]}
    assert env["ROUTER_HOST"] == "rel-kvroute-router-handshake"


def test_probes_hit_real_routes() -> None:
    from router.front.app import PROBES

    objs = render()
    router = container(objs, "Deployment", "rel-kvroute-router")
    assert router["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert router["livenessProbe"]["httpGet"]["path"] == "/health"
    assert {"/ready", "/health"} <= PROBES
    render_c = container(objs, "Deployment", "rel-kvroute-render")
    assert render_c["livenessProbe"]["httpGet"]["path"] == "/health"
    cfg = parse_render_args(render_c["args"][2:])
    assert cfg.port == 8100 and cfg.workers == 2 and cfg.render_processes == 1
    # The router drains within the pod's grace period.
    grace = objs[("Deployment", "rel-kvroute-router")]["spec"]["template"]["spec"][
        "terminationGracePeriodSeconds"]
    toml = tomllib.loads(objs[("ConfigMap", "rel-kvroute-router")]["data"]["router.toml"])
    assert grace > toml["limits"]["drain_timeout"]


def _admits(rule: dict[str, Any], port: int) -> bool:
    return any(p["port"] <= port <= p.get("endPort", p["port"]) for p in rule.get("ports", []))


def _pod_labels(objs: dict[tuple[str, str], dict[str, Any]], kind: str, name: str) -> Any:
    return objs[(kind, name)]["spec"]["template"]["metadata"]["labels"]


def test_network_policies_let_only_engines_reach_the_router_s_engine_ports() -> None:
    objs = render("engine.replicas=3", "router.spareEngineSlots=2")
    router_pods = _pod_labels(objs, "Deployment", "rel-kvroute-router")
    engine_pods = _pod_labels(objs, "StatefulSet", "rel-kvroute-engine")
    router = objs[("NetworkPolicy", "rel-kvroute-router")]["spec"]
    assert router["podSelector"]["matchLabels"] == router_pods
    assert router["policyTypes"] == ["Ingress"]
    engine_ports = {p["port"] for p in
                    objs[("Service", "rel-kvroute-router-handshake")]["spec"]["ports"]}
    assert len(engine_ports) == 3 * 5  # handshake, input, output for each of 5 slots
    for port in engine_ports:
        admitting = [r for r in router["ingress"] if _admits(r, port)]
        # Admitted, and only from engine pods: no rule without `from` (anyone) covers it.
        assert admitting and all(r.get("from") == [{"podSelector": {"matchLabels": engine_pods}}]
                                 for r in admitting), port
    for port in (29500 - 1, 29505, 30505, 31505):  # the ports next to the ranges stay closed
        assert not any(_admits(r, port) for r in router["ingress"]), port
    http = [r for r in router["ingress"] if _admits(r, 8000)]
    assert http and all("from" not in r for r in http)  # the API is open to clients
    engine = objs[("NetworkPolicy", "rel-kvroute-engine")]["spec"]
    assert engine["podSelector"]["matchLabels"] == engine_pods
    assert engine["policyTypes"] == ["Ingress"]
    assert engine["ingress"] and all(
        r["from"] == [{"podSelector": {"matchLabels": router_pods}}] for r in engine["ingress"])
    kv_ports = {p["port"] for p in objs[("Service", "rel-kvroute-engine")]["spec"]["ports"]}
    assert kv_ports == {5557, 5558}
    assert all(any(_admits(r, p) for r in engine["ingress"]) for p in kv_ports)


def test_network_policies_can_be_narrowed_or_left_out() -> None:
    objs = render("networkPolicy.routerHttpFrom[0].namespaceSelector.matchLabels.team=llm")
    router = objs[("NetworkPolicy", "rel-kvroute-router")]["spec"]
    [http] = [r for r in router["ingress"] if _admits(r, 8000)]
    assert http["from"] == [{"namespaceSelector": {"matchLabels": {"team": "llm"}}}]
    off = render("networkPolicy.enabled=false")
    assert not [key for key in off if key[0] == "NetworkPolicy"]

"""The Helm chart lints, every example renders into objects Kubernetes 1.33 accepts, and what it
renders (router and render arguments, config files) is accepted by kvroute's own parsers, with
no key on any command line."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from kvroute.cli import SUBCOMMANDS
from render.service.config import parse_args as parse_render_args
from router.main import parse as parse_router_args
from tests.chart import (
    CHART,
    EXAMPLES,
    FULL,
    NAMESPACE,
    VAR,
    Rendered,
    expand,
    helm,
    local_files,
    localize,
    pod_env,
    render,
    template_args,
)

pytestmark = pytest.mark.deploy

KUBERNETES = "1.33.0"
# Kinds of CRDs the chart may render, which kubernetes-validate has no schema for.
CRD_KINDS = {"ServiceMonitor"}
# More than the examples: each topology's other settings.
VARIANTS: dict[str, tuple[str, ...]] = {
    "defaults": (),
    "headless-one-router": ("topology=headless",),
    "pods-render-service-monitor": ("render.enabled=true", "serviceMonitor.enabled=true",
                                    "router.autoscaling.enabled=true"),
    "pods-keys-as-env": ("keys.api.secretName=a", "keys.api.as=env",
                         "keys.admin.secretName=b", "keys.admin.as=env",
                         "keys.engine.secretName=c", "keys.engine.as=env"),
    "pods-keys-as-files": ("keys.api.secretName=a", "keys.admin.secretName=b",
                           "keys.engine.secretName=c", "model.hfToken.secretName=hf"),
}
CASES = [pytest.param(f, (), id=f.stem) for f in EXAMPLES] + [
    pytest.param(None, sets, id=name) for name, sets in VARIANTS.items()]


def secret_values(r: Rendered) -> dict[tuple[str, str], str]:
    """A distinct value for every Secret key any object of ``r`` refers to."""
    refs: set[tuple[str, str]] = set()
    for _, c in r.containers():
        for e in c.get("env") or []:
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                refs.add((ref["name"], ref["key"]))
    for kind in ("Deployment", "StatefulSet"):
        for o in r.kinds(kind):
            for v in o["spec"]["template"]["spec"].get("volumes", []):
                if "secret" in v:
                    refs.update((v["secret"]["secretName"], i["key"]) for i in v["secret"]["items"])
    return {ref: f"sekrit-{ref[0]}-{ref[1]}-value" for ref in refs}


def test_the_examples_are_the_four_the_issue_asks_for() -> None:
    assert {f.stem for f in EXAMPLES} == {"pods-small", "pods-large", "headless", "render-only"}


@pytest.mark.parametrize(("values", "sets"), CASES)
def test_lint_strict(values: Path | None, sets: tuple[str, ...]) -> None:
    flags = (["-f", str(values)] if values else []) + [x for s in sets for x in ("--set", s)]
    out = helm("lint", "--strict", str(CHART), *flags).stdout
    assert "1 chart(s) linted, 0 chart(s) failed" in out


@pytest.mark.parametrize(("values", "sets"), CASES)
def test_rendered_objects_validate_for_kubernetes_1_33(values: Path | None,
                                                       sets: tuple[str, ...]) -> None:
    text = render(values, *sets).text
    done = subprocess.run(
        [str(Path(sys.executable).parent / "kubernetes-validate"), "--strict", "--quiet",
         "-k", KUBERNETES, "-"], input=text, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
    # Silent but for the CRDs it has no schema of (checked by hand in test_deploy_topologies).
    assert all("Couldn't find schema for kind" in ln and ln.split("kind ")[1].split()[0]
               in CRD_KINDS for ln in lines), lines


def test_the_validator_refuses_what_the_api_server_would() -> None:
    text = render().text.replace("terminationGracePeriodSeconds:", "terminationGraceSeconds:", 1)
    done = subprocess.run(
        [str(Path(sys.executable).parent / "kubernetes-validate"), "--strict", "--quiet",
         "-k", KUBERNETES, "-"], input=text, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "terminationGraceSeconds" in done.stdout + done.stderr


def _router_argvs(r: Rendered, tmp: Path) -> list[tuple[list[str], dict[str, str]]]:
    """Each router pod's argv (after the image's `kvroute` ENTRYPOINT) with its files local,
    and its environment."""
    name = f"{FULL}-router"
    obj = next(o for o in r.objs.values() if o["metadata"]["name"] == name
               and o["kind"] in ("Deployment", "StatefulSet"))
    replicas = obj["spec"].get("replicas", 1)
    secrets = secret_values(r)
    files = local_files(r, name, tmp, secrets)
    out = []
    for i in range(replicas if obj["kind"] == "StatefulSet" else 1):
        env = pod_env(r.container(name), f"{name}-{i}", secrets)
        out.append((localize(expand(r.container(name)["args"], env), files), env))
    return out


@pytest.mark.parametrize(("values", "sets"), CASES)
def test_router_and_render_run_what_kvroute_parses(values: Path | None, sets: tuple[str, ...],
                                                   tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    r = render(values, *sets)
    if ("ConfigMap", f"{FULL}-router") in r.objs:  # every topology but render-only
        for index, (argv, env) in enumerate(_router_argvs(r, tmp_path)):
            assert argv[0] == "router" and argv[0] in SUBCOMMANDS
            for key in [k for k in os.environ if k.startswith("KVROUTE_")]:
                monkeypatch.delenv(key)
            for key, value in env.items():
                monkeypatch.setenv(key, value)
            cfg = parse_router_args(argv[1:])
            assert (cfg.host, cfg.port) == ("0.0.0.0", 8000)
            toml = tomllib.loads(Path(argv[argv.index("--config") + 1]).read_text())
            assert toml["limits"]["drain_timeout"] == cfg.limits.drain_timeout
            # Each key given (a file flag, or its variable) is read, from its Secret.
            for flag, var, got in (("--api-key-file", "KVROUTE_API_KEY", cfg.api_key),
                                   ("--admin-key-file", "KVROUTE_ADMIN_KEY",
                                    cfg.control.admin_key),
                                   ("--engine-api-key-file", "KVROUTE_ENGINE_API_KEY",
                                    cfg.link.engine_api_key)):
                given = flag in argv or var in env
                assert (got is not None and got.startswith("sekrit-")) == given, (flag, got)
            if cfg.discovery is not None:  # pods
                assert cfg.discovery.kind == "kubernetes" and not cfg.engines
            else:  # headless: router i is client i
                assert cfg.link.client_index == index and cfg.engines
    if any(k == "Deployment" and n == f"{FULL}-render" for k, n in r.objs):
        args = r.container(f"{FULL}-render")["args"]
        assert args[0] == "render" and args[0] in SUBCOMMANDS
        cfg_r = parse_render_args(args[1:])
        assert cfg_r.port == 8100 and cfg_r.host == "0.0.0.0"


def _secret_env(container: dict[str, Any]) -> set[str]:
    return {e["name"] for e in container.get("env") or []
            if "secretKeyRef" in e.get("valueFrom", {})}


@pytest.mark.parametrize(("values", "sets"), CASES)
def test_no_secret_on_any_command_line(values: Path | None, sets: tuple[str, ...]) -> None:
    r = render(values, *sets)
    secrets = secret_values(r)
    secret_paths = {f"{m['mountPath']}" for _, c in r.containers()
                    for m in c.get("volumeMounts", []) if m["name"].startswith("key-")}
    for workload, c in r.containers():
        line = [*(c.get("command") or []), *(c.get("args") or [])]
        hidden = _secret_env(c)
        for i, arg in enumerate(line):
            # No key flag with a value, no $(VAR) of a Secret, no shell reading one; a key
            # file's path only as the value of its --*-key-file flag.
            assert not any(arg == f or arg.startswith(f + "=") for f in
                           ("--api-key", "--admin-key", "--engine-api-key")), (workload, arg)
            assert not set(VAR.findall(arg)) & hidden, (workload, arg)
            assert not any(f"${v}" in arg or f"${{{v}}}" in arg for v in hidden), (workload, arg)
            if any(p in arg for p in secret_paths):
                assert i > 0 and line[i - 1].endswith("-key-file"), (workload, arg)
            assert not any(value in arg for value in secrets.values())
        # A key in the environment comes from a Secret, never from a literal value.
        for e in c.get("env") or []:
            if any(w in e["name"] for w in ("KEY", "TOKEN")):
                assert "secretKeyRef" in e.get("valueFrom", {}), (workload, e)
    # A key given as a flag in values is refused by the schema.
    for flag in ("--api-key=x", "--admin-key", "--engine-api-key=x"):
        done = helm(*template_args(None, (f"router.extraArgs[0]={flag}",)), check=False)
        assert done.returncode != 0 and "extraArgs" in done.stderr, flag


def test_the_chart_runs_kvroute_s_own_image_paths() -> None:
    r = render(None, "render.enabled=true")
    for name in (f"{FULL}-router", f"{FULL}-render"):
        c = r.container(name)
        assert "command" not in c  # the image's ENTRYPOINT, kvroute
        assert c["args"][0] in SUBCOMMANDS
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert r.pod(name)["spec"]["securityContext"]["runAsNonRoot"] is True
        mounts = {m["mountPath"] for m in c["volumeMounts"]}
        assert {"/tmp", "/var/lib/kvroute", "/var/cache/kvroute"} <= mounts
    assert NAMESPACE in r.get("ConfigMap", f"{FULL}-router")["data"]["router.toml"]

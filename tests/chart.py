"""Test helper: the Helm chart rendered with the cached helm binary, and what it renders read back
as kvroute would run it (argv with the pod's files and variables, config files)."""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "kvroute"
EXAMPLES = sorted((CHART / "examples").glob("*.yaml"))
CACHE = Path(os.environ.get("KVROUTE_CACHE", Path.home() / ".cache" / "kvroute"))
HELM = CACHE / "helm" / "helm" / "helm"
NAMESPACE = "llm"
RELEASE = "rel"
FULL = f"{RELEASE}-kvroute"
VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")  # Kubernetes' $(VAR) in args and command
WORKLOADS = ("Deployment", "StatefulSet")


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    if not HELM.exists():
        pytest.fail(f"{HELM} missing: run scripts/helm.sh (./dev test does)")
    done = subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=120)
    if check:
        assert done.returncode == 0, done.stderr
    return done


def template_args(values: Path | None = None, sets: tuple[str, ...] = ()) -> list[str]:
    flags = ["-f", str(values)] if values else []
    flags += [x for s in sets for x in ("--set", s)]
    return ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, *flags]


@dataclass
class Rendered:
    """The objects of one `helm template`, by (kind, name)."""

    text: str
    objs: dict[tuple[str, str], dict[str, Any]]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        return self.objs[(kind, name)]

    def kinds(self, kind: str) -> list[dict[str, Any]]:
        return [o for (k, _), o in self.objs.items() if k == kind]

    def pod(self, name: str) -> dict[str, Any]:
        """The pod template of the workload ``name``, whatever its kind."""
        [obj] = [o for (k, n), o in self.objs.items() if n == name and k in WORKLOADS]
        spec: dict[str, Any] = obj["spec"]["template"]
        return spec

    def container(self, name: str) -> dict[str, Any]:
        c: dict[str, Any] = self.pod(name)["spec"]["containers"][0]
        return c

    def containers(self) -> list[tuple[str, dict[str, Any]]]:
        """(workload name, container) of every container of every workload."""
        return [(o["metadata"]["name"], c) for (k, _), o in self.objs.items() if k in WORKLOADS
                for c in o["spec"]["template"]["spec"].get("containers", [])
                + o["spec"]["template"]["spec"].get("initContainers", [])]


def render(values: Path | None = None, *sets: str) -> Rendered:
    out = helm(*template_args(values, sets)).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    return Rendered(out, {(d["kind"], d["metadata"]["name"]): d for d in docs})


def pod_env(container: dict[str, Any], pod_name: str, secrets: dict[tuple[str, str], str],
            ) -> dict[str, str]:
    """The container's environment as the kubelet builds it: values, the pod's name, Secret
    keys (``secrets[(secret, key)]``)."""
    env = {}
    for e in container.get("env") or []:
        source = e.get("valueFrom")
        if source is None:
            env[e["name"]] = e["value"]
        elif "fieldRef" in source:
            assert source["fieldRef"]["fieldPath"] == "metadata.name", e
            env[e["name"]] = pod_name
        else:
            ref = source["secretKeyRef"]
            env[e["name"]] = secrets[(ref["name"], ref["key"])]
    return env


def expand(args: list[str], env: dict[str, str]) -> list[str]:
    """Kubernetes' expansion of $(VAR) in args (an unknown variable is left as written)."""
    return [VAR.sub(lambda m: env.get(m.group(1), m.group(0)), a) for a in args]


def local_files(r: Rendered, workload: str, tmp: Path, secrets: dict[tuple[str, str], str],
                ) -> dict[str, Path]:
    """The pod's ConfigMap and Secret volumes written under ``tmp``: container path -> file."""
    spec = r.pod(workload)["spec"]
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    files: dict[str, Path] = {}
    for mount in r.container(workload).get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if "configMap" in volume:
            data = r.get("ConfigMap", volume["configMap"]["name"])["data"]
        elif "secret" in volume:
            name = volume["secret"]["secretName"]
            data = {i["path"]: secrets[(name, i["key"])] for i in volume["secret"]["items"]}
        else:
            continue
        for key, text in data.items():
            local = tmp / mount["name"] / key
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_text(text)
            files[f"{mount['mountPath']}/{key}"] = local
    return files


def localize(args: list[str], files: dict[str, Path]) -> list[str]:
    return [str(files[a]) if a in files else a for a in args]

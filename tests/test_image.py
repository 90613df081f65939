"""The Dockerfile, read by BuildKit's own parser (no docker engine here): it parses, its build
stage installs the project the way ./dev does (scripts/install.sh from pyproject.toml), the
image runs as a non-root user, and what its build stage copies builds a wheel with every
package and the embedded tokenizer."""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import dockerfile
import pytest

from kvroute.cli import SUBCOMMANDS

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# Where the image lets kvroute write (the chart mounts emptyDir volumes there); the rest of the
# root filesystem may be read-only.
WRITABLE = ("/tmp", "/var/lib/kvroute", "/var/cache/kvroute")


def stages() -> list[list[dockerfile.Command]]:
    """The Dockerfile's commands, one list per FROM."""
    out: list[list[dockerfile.Command]] = []
    for cmd in dockerfile.parse_file(str(DOCKERFILE)):
        if cmd.cmd == "FROM":
            out.append([])
        if out:
            out[-1].append(cmd)
    return out


def env_of(stage: list[dockerfile.Command]) -> dict[str, str]:
    pairs = [c.value for c in stage if c.cmd == "ENV"]
    return {k: v for value in pairs for k, v in zip(value[::2], value[1::2], strict=True)}


def top_packages() -> set[str]:
    return {p.split(".")[0] for p in PYPROJECT["tool"]["setuptools"]["packages"]}


def copied(stage: list[dockerfile.Command]) -> list[tuple[str, str]]:
    """(source, destination) of the stage's COPY commands from the build context."""
    out = []
    for c in stage:
        if c.cmd == "COPY" and not any(f.startswith("--from") for f in c.flags):
            *sources, dest = c.value
            out.extend((s, dest) for s in sources)
    return out


def test_it_parses_with_known_instructions_only() -> None:
    commands = dockerfile.parse_file(str(DOCKERFILE))
    known = {c.upper() for c in dockerfile.all_cmds()}
    assert commands and all(c.cmd in known for c in commands), [c.cmd for c in commands]
    with pytest.raises(dockerfile.GoParseError):  # the parser does refuse a broken file
        dockerfile.parse_string("FROM x\nRUN <<EOF\nunterminated\n")


def test_multi_stage_non_root_with_kvroute_as_entrypoint() -> None:
    build, runtime = stages()
    assert build[0].value[-2:] == ("AS", "build") and runtime[0].value[-2:] == ("AS", "runtime")
    [user] = [c.value[0] for c in runtime if c.cmd == "USER"]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0  # numeric: runAsNonRoot can check it
    [entry] = [c for c in runtime if c.cmd == "ENTRYPOINT"]
    assert entry.json and entry.value == ("kvroute",)
    [cmd] = [c for c in runtime if c.cmd == "CMD"]
    assert cmd.json
    # The runtime stage takes only the built virtualenv from the build stage: no source tree,
    # no pip cache, no compiler.
    from_build = [c for c in runtime if c.cmd == "COPY" and "--from=build" in c.flags]
    assert [c.value for c in from_build] == [("/opt/kvroute", "/opt/kvroute")]
    assert not copied(runtime)
    env = env_of(runtime)
    assert env["PATH"].split(":")[0] == "/opt/kvroute/bin"
    # Every place kvroute writes by default is one the chart mounts writable.
    for var in ("HOME", "XDG_STATE_HOME", "HF_HOME"):
        path = env[var] if var != "XDG_STATE_HOME" else env[var] + "/kvroute"
        assert any(path == w or path.startswith(w + "/") for w in WRITABLE), (var, path)
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"


def test_the_build_stage_is_the_project_s_own_install() -> None:
    build, _ = stages()
    sources = {s.rstrip("/") for s, _ in copied(build)}
    # pyproject.toml, the readme it names, the install script, and every package it lists.
    needed = {"pyproject.toml", PYPROJECT["project"]["readme"], "scripts/install.sh",
              *top_packages()}
    assert needed <= sources, needed - sources
    assert sources <= needed | {"."}, sources - needed  # nothing the build does not use
    runs = [shlex.split(c.value[0]) for c in build if c.cmd == "RUN"]
    assert ["bash", "scripts/install.sh", "/opt/kvroute", "."] in runs
    # ./dev installs through the same script: one install step for developers, CI and the image.
    dev = (ROOT / "dev").read_text()
    assert re.search(r'bash scripts/install\.sh "\$VENV" -e "\.\[test\]"', dev)
    script = (ROOT / "scripts" / "install.sh").read_text()
    assert '-m pip install -q "${@:-.}"' in script and "-m venv" in script


def test_dockerignore_keeps_what_the_build_copies() -> None:
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    assert not [p for p in patterns if p.startswith("!")]  # plain exclusions only, checked below
    build, _ = stages()
    for source, _ in copied(build):
        parts = Path(source).parts
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        assert not [p for p in patterns for pre in prefixes if fnmatch.fnmatch(pre, p)], source
    assert {".git", ".venv"} <= set(patterns)


def _context(dest: Path) -> Path:
    """The build stage's /src: what its COPY lines take from the repo, less .dockerignore's
    caches."""
    build, _ = stages()
    for source, target in copied(build):
        src = ROOT / source
        to = dest / (target if not target.endswith("/") else target + src.name)
        if target == "./":
            to = dest / src.name
        if src.is_dir():
            shutil.copytree(src, to, ignore=shutil.ignore_patterns("__pycache__", "*.pyc",
                                                                   "*.egg-info"))
        else:
            to.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, to)
    return dest


@pytest.mark.deploy
def test_what_the_build_stage_copies_builds_and_runs(tmp_path: Path) -> None:
    ctx = _context(tmp_path / "src")
    out = tmp_path / "wheel"
    # With build isolation, as pip does in the image: pyproject's build-system requirements.
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ctx)],
        capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    [wheel] = out.glob("kvroute-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if n.endswith(".py")} >= top_packages()
    # Every module of every package, subpackages included (a subpackage left out of
    # pyproject's list would be missing from the image).
    sources = {str(p.relative_to(ROOT)) for pkg in top_packages()
               for p in (ROOT / pkg).rglob("*.py")}
    assert sources - set(names) == set()
    assert "render/models/qwen3/tokenizer.json" in names  # the embedded tokenizer
    entry_points = zipfile.ZipFile(wheel).read(
        next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "kvroute = kvroute.cli:main" in entry_points
    # Installed alone (its dependencies from this venv), run outside the source tree: the
    # version, every subcommand's --help, and the embedded model from the installed files.
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q",
                           "--target", str(site), str(wheel)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    env = dict(os.environ, PYTHONPATH=str(site))
    probe = ("import kvroute.cli, render.models as m; print(m.__file__); "
             "print(m.EMBEDDED_MODEL); kvroute.cli.main(['--version'])")
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         cwd=tmp_path, env=env, timeout=60)
    assert ran.returncode == 0, ran.stderr
    module, model, version = ran.stdout.split()[:3]
    assert module.startswith(str(site)) and model.startswith(str(site)), ran.stdout
    assert (Path(model) / "tokenizer.json").is_file() and version == "kvroute"
    for sub in SUBCOMMANDS:
        helped = subprocess.run([sys.executable, "-m", "kvroute.cli", sub, "--help"],
                                capture_output=True, text=True, cwd=tmp_path, env=env,
                                timeout=60)
        assert helped.returncode == 0 and "usage: kvroute" in helped.stdout, helped.stderr

#!/usr/bin/env bash
# Installs kvroute from pyproject.toml into a virtualenv: the one install step, run by ./dev
# (editable, with the test extra) and by the image's build stage (deploy/image/Dockerfile).
#   scripts/install.sh VENV [PIP_INSTALL_ARGS...]     default args: "." (kvroute and its deps)
set -euo pipefail
venv="$1"; shift
[[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q -U pip
"$venv/bin/python" -m pip install -q "${@:-.}"

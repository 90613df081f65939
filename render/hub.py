"""Model ids: `--model ORG/NAME` fetches the files render reads (never weights) into the HF cache.

A model argument that names an existing directory is used as it is. Otherwise an ``ORG/NAME`` id
is fetched with ``huggingface_hub.snapshot_download`` restricted to ``RENDER_FILES``, so it lands in
the usual cache (``HF_HOME`` / ``HF_HUB_CACHE``) and honours ``HF_TOKEN``, ``HF_ENDPOINT`` and
``HF_HUB_OFFLINE`` as every Hugging Face tool does; a copy already cached serves when the Hub cannot
be reached. What cannot be had becomes one ``ModelUnavailable`` whose message says what to set.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import TextIO

# Everything render/model_files.py reads: tokenizer, its config and special tokens, the model's
# config and generation config, chat templates. Weights (*.safetensors, *.bin, ...) never match.
RENDER_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "tekken.json",
)
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


class ModelUnavailable(Exception):
    """The model is neither a directory nor a Hub id that can be fetched; the message says why
    and what to do."""


def is_repo_id(model: str) -> bool:
    return _REPO_ID.fullmatch(model) is not None and ".." not in model


def resolve_model(model: str | Path, revision: str | None = None,
                  progress: TextIO | None = sys.stderr) -> Path:
    """The local directory for ``model``: itself if it is a directory, else the fetched snapshot
    of the Hub id (its render files only). ``progress`` gets one line before and one after a
    fetch."""
    path = Path(model)
    if path.is_dir():
        return path
    text = str(model)
    if not is_repo_id(text):
        raise ModelUnavailable(
            f"model directory {text} does not exist (and {text!r} is not a Hugging Face id "
            "ORG/NAME)")
    return _fetch(text, revision, progress)


def _fetch(repo_id: str, revision: str | None, progress: TextIO | None) -> Path:
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    rev = revision or "main"
    where = f"{constants.ENDPOINT} into {constants.HF_HUB_CACHE}"
    if progress is not None:
        mode = " (HF_HUB_OFFLINE: cache only)" if constants.HF_HUB_OFFLINE else ""
        print(f"kvroute: fetching {repo_id}@{rev}: tokenizer, config and chat template only, no "
              f"weights, from {where}{mode} ...", file=progress, flush=True)
    try:
        folder = Path(snapshot_download(repo_id, revision=revision,
                                        allow_patterns=list(RENDER_FILES)))
    except RevisionNotFoundError:
        raise ModelUnavailable(f"{repo_id} has no revision {rev!r} on {constants.ENDPOINT}"
                               ) from None
    except (RepositoryNotFoundError, GatedRepoError) as exc:
        raise ModelUnavailable(
            f"{repo_id} is not on {constants.ENDPOINT}, or it is private or gated: set HF_TOKEN "
            f"to a token that may read it ({type(exc).__name__})") from None
    except LocalEntryNotFoundError as exc:
        if constants.HF_HUB_OFFLINE:
            why = "HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set and it is not in the cache"
            fix = "set HF_HUB_OFFLINE=0 (and unset TRANSFORMERS_OFFLINE) to download it"
        else:
            why = f"{constants.ENDPOINT} cannot be reached and it is not in the cache"
            fix = "check the network (or HF_ENDPOINT)"
        raise ModelUnavailable(
            f"cannot fetch {repo_id}: {why} ({constants.HF_HUB_CACHE}); {fix}, or pass a local "
            f"model directory to --model (e.g. one made by `hf download {repo_id} "
            f"--include '*.json' --local-dir DIR`)") from exc
    except HfHubHTTPError as exc:
        raise ModelUnavailable(f"cannot fetch {repo_id} from {constants.ENDPOINT}: {exc}"
                               ) from None
    if not (folder / "tokenizer.json").is_file():
        raise ModelUnavailable(f"{repo_id} has no tokenizer.json: render needs a fast tokenizer")
    if progress is not None:
        files = sorted(p.name for p in folder.iterdir())
        print(f"kvroute: {repo_id} ready in {folder} ({', '.join(files)})", file=progress,
              flush=True)
    return folder

"""API parity: every request of the corpus gets the same answer from kvroute as from `vllm serve`.

The oracle is the session's real `vllm serve` (tests/vllm_serve.py); kvroute is a router in front
of the session's real headless engine of the same model (tests/engines.py), re-adopted as
tests/test_router_vllm.py does, serving it under the same name. Each case (tests/parity_corpus.py)
goes to both at once (one case at a time), and the answers are compared field by field
(tests/parity_compare.py). A case listed in ``EXPECTED`` must differ (its mark comes off once it
does not); any other must not. The run ends with ``K/N identical`` and the fields that differ
(tests/parity_report.py), and a test checks that the corpus names every field of vLLM's
ChatCompletionRequest and CompletionRequest, as listed by vLLM itself.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from devtools.cluster import ClusterOptions, LocalCluster
from tests.engines import TINY_MODEL, VLLM_VENV, EngineProc
from tests.parity_compare import differences, send, view
from tests.parity_corpus import BY_NAME, CASES, CHAT, COMPLETIONS, EXPECTED
from tests.parity_report import record
from tests.vllm_serve import SERVED_NAME, VllmServe

pytestmark = [pytest.mark.vllm]

# Lists the request fields of vLLM's own protocol classes, in vLLM's venv.
_FIELDS_SCRIPT = """
import json
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
print(json.dumps({"/v1/chat/completions": list(ChatCompletionRequest.model_fields),
                  "/v1/completions": list(CompletionRequest.model_fields)}))
"""


@pytest.fixture(scope="module")
def router(vllm_engine: EngineProc) -> Iterator[LocalCluster]:
    e = vllm_engine
    assert e.ready is not None
    spec = e.linked(max_model_len=True)
    with LocalCluster(ClusterOptions(external=(spec,), model=str(TINY_MODEL),
                                     served_model_name=SERVED_NAME, ready_timeout=120)) as c:
        yield c


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def oracle_side() -> Iterator[tuple[ThreadPoolExecutor, httpx.Client]]:
    """The oracle's requests go on a thread of their own, with their own client: the two
    servers (separate engines) answer a case at the same time."""
    with ThreadPoolExecutor(1, thread_name_prefix="oracle") as pool, \
            httpx.Client(timeout=120) as client:
        yield pool, client


@pytest.fixture(scope="session")
def vllm_request_fields() -> dict[str, list[str]]:
    """The fields of vLLM 0.32's chat and completions request classes, by endpoint."""
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1")
    out = subprocess.run([str(VLLM_VENV / "bin" / "python"), "-c", _FIELDS_SCRIPT], env=env,
                         capture_output=True, text=True, timeout=300, check=True)
    fields: dict[str, list[str]] = json.loads(out.stdout.strip().splitlines()[-1])
    return fields


def test_corpus_covers_every_vllm_field(vllm_request_fields: dict[str, list[str]]) -> None:
    assert set(vllm_request_fields) == {CHAT, COMPLETIONS}
    missing = {}
    for path, names in vllm_request_fields.items():
        used = {key for case in CASES if case.path == path and case.body for key in case.body}
        if absent := sorted(set(names) - used):
            missing[path] = absent
    assert not missing, f"fields of vLLM's request classes no case sends: {missing}"


@pytest.mark.parametrize("name", list(BY_NAME))
def test_same_answer_as_vllm_serve(name: str, vllm_serve: VllmServe, router: LocalCluster,
                                   http: httpx.Client,
                                   oracle_side: tuple[ThreadPoolExecutor, httpx.Client],
                                   record_property: Callable[[str, object], None]) -> None:
    case = BY_NAME[name]
    pool, oracle_http = oracle_side
    theirs = pool.submit(send, oracle_http, vllm_serve.base_url, case)
    ours = view(case, send(http, router.base_url, case))
    oracle = view(case, theirs.result())
    diff = differences(oracle, ours)
    why = EXPECTED.get(name)
    record(record_property, name, diff, why)
    if why is not None:
        assert diff, (f"{name} now answers as vLLM does: take it out of EXPECTED "
                      f"(tests/parity_corpus.py) and docs/parity.md ({why})")
        return
    shown = "\n".join(f"  {path}: vLLM {json.dumps(a)[:300]} | kvroute {json.dumps(b)[:300]}"
                      for path, (a, b) in list(diff.items())[:20])
    assert not diff, f"{name} differs from vllm serve:\n{shown}"

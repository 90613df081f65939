"""OpenAI SDK clients for tests, each closed when its test ends.

An SDK client left to the garbage collector is freed as part of a reference cycle (its resources
point back at it), in whichever test runs the next full collection. The collector finalizes a
cycle's objects in no set order: when a pooled socket goes before the client's own close, the
socket warns it was left open, and under this suite's ``filterwarnings = error`` that warning
fails the unrelated test that happened to collect it (seen in CI, in a pure-data hypothesis test).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest

OpenAIClient = Callable[..., openai.OpenAI]


@pytest.fixture
def openai_client() -> Iterator[OpenAIClient]:
    """``openai_client(base_url, **kwargs)``: a client of the router (or pod) at ``base_url``
    (its ``/v1``), no retries, closed at the end of the test; ``kwargs`` go to ``OpenAI``."""
    made: list[openai.OpenAI] = []

    def make(base_url: str, **kwargs: Any) -> openai.OpenAI:
        client = openai.OpenAI(base_url=f"{base_url}/v1", api_key=kwargs.pop("api_key", "x"),
                               max_retries=0, **kwargs)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()

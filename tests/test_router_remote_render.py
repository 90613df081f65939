"""`--render-url`: the router renders through a remote `kvroute render` and answers the same."""

from __future__ import annotations

from typing import Any

import httpx

from devtools.cluster import ClusterOptions, LocalCluster
from tests.openai_clients import OpenAIClient
from tests.render_proc import render_server

MODEL = "Qwen/Qwen3-0.6B"


def test_remote_render_gives_the_same_answers(openai_client: OpenAIClient) -> None:
    body: dict[str, Any] = {
        "model": MODEL, "max_tokens": 12, "seed": 4,
        "messages": [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": "Remote or local?"}]}
    answers = []
    with render_server("--render-processes", "0") as url:  # small bodies only: no helper
        for render_url in (None, url):
            opts = ClusterOptions(engines=1, render_url=render_url)
            with LocalCluster(opts) as c:
                client = openai_client(c.base_url)
                chat = client.chat.completions.create(**body)
                assert chat.usage is not None
                answers.append((chat.choices[0].message.content, chat.usage.prompt_tokens))
                comp = client.completions.create(model=MODEL, prompt="abc", max_tokens=3, seed=1)
                assert comp.usage is not None
                answers.append((comp.choices[0].text, comp.usage.prompt_tokens))
                if render_url is not None:
                    with httpx.Client(base_url=c.base_url) as http:
                        missing = http.post("/v1/chat/completions",
                                            json={**body, "model": "nope"})
                    # The router validates the model itself before asking the render service.
                    assert missing.status_code == 404
                    assert missing.json()["error"]["type"] == "NotFoundError"
    assert answers[:2] == answers[2:]

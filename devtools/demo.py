"""`kvroute demo`: router + simulated engines on the embedded tokenizer; a few requests shown."""

from __future__ import annotations

import argparse
import signal
import threading
from typing import Any

from devtools.cluster import ClusterOptions, LocalCluster
from router.routing.policy import POLICIES, PolicyConfig

SYSTEM = ("You are kvroute's demo assistant. Every request in this demo shares this system prompt, "
          "so after the first one the router sends them to the engine that already holds it. ")


def _show(title: str, engine_route: str | None, text: str, usage: Any) -> None:
    details = getattr(usage, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", None)
    print(f"\n== {title}")
    print(f"   route : {engine_route}")
    print(f"   usage : prompt={usage.prompt_tokens} completion={usage.completion_tokens} "
          f"cached (engine-reported)={cached}")
    print(f"   answer: {text!r}")


def run_requests(base_url: str, model: str) -> None:
    from openai import OpenAI

    # Any: the demo passes plain dicts, which the SDK's overloads cannot narrow.
    client: Any = OpenAI(base_url=f"{base_url}/v1", api_key="demo", max_retries=0)
    messages = [{"role": "system", "content": SYSTEM * 4},
                {"role": "user", "content": "Say hello to the cache."}]
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=messages, max_tokens=24, seed=1)
    chat = raw.parse()
    _show("chat (non-stream)", raw.headers.get("x-kvroute-route"),
          chat.choices[0].message.content or "", chat.usage)

    messages[-1] = {"role": "user", "content": "Now stream me something."}
    with client.chat.completions.with_streaming_response.create(
        model=model, messages=messages, max_tokens=24, stream=True,
        stream_options={"include_usage": True},
    ) as resp:
        route = resp.headers.get("x-kvroute-route")
        pieces, usage = [], None
        for chunk in resp.parse():
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
            usage = chunk.usage or usage
    _show("chat (stream, same system prompt)", route, "".join(pieces), usage)

    raw_c = client.completions.with_raw_response.create(
        model=model, prompt="The quick brown fox", max_tokens=12, seed=2)
    comp = raw_c.parse()
    _show("completion", raw_c.headers.get("x-kvroute-route"), comp.choices[0].text, comp.usage)


def cli(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="kvroute demo", description=__doc__)
    p.add_argument("--engines", type=int, default=3)
    p.add_argument("--policy", choices=POLICIES, default="cache_aware")
    p.add_argument("--step-time", type=float, default=0.005, help="sim seconds per decode step")
    p.add_argument("--serve", action="store_true", help="keep serving after the requests")
    args = p.parse_args(argv)
    opts = ClusterOptions(engines=args.engines, policy=PolicyConfig(name=args.policy),
                          sim={"step_time": args.step_time})
    print(f"starting kvroute with {args.engines} simulated engines (policy {args.policy}) ...")
    with LocalCluster(opts) as cluster:
        model = cluster.state.models.registry.names()[0]
        print(f"router at {cluster.base_url}, model {model!r}, engines {cluster.names}")
        run_requests(cluster.base_url, model)
        if args.serve:
            print(f"\nserving at {cluster.base_url}/v1 (Ctrl-C to stop)")
            done = threading.Event()
            signal.signal(signal.SIGINT, lambda *_: done.set())
            signal.signal(signal.SIGTERM, lambda *_: done.set())
            done.wait()
    print("\ndemo finished")
    return 0

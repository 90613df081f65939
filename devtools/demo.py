"""`kvroute demo`: router + simulated engines on the embedded tokenizer; a short tour, then it
serves until Ctrl-C (`--once`: the tour alone)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import threading
from types import FrameType
from typing import Any

from devtools.cluster import ClusterOptions, LocalCluster
from router.config import Frontend
from router.main import banner
from router.routing.policy import POLICIES, PolicyConfig
from sim.config import OUTPUTS

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

    with OpenAI(base_url=f"{base_url}/v1", api_key="demo", max_retries=0) as client:
        _tour(client, model)


def _tour(client: Any, model: str) -> None:
    # Any: the demo passes plain dicts, which the SDK's overloads cannot narrow.
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


def examples(base_url: str, model: str) -> str:
    """Commands a user can paste into another terminal to reach the demo."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Hello there!"}],
                       "max_tokens": 16})
    python = os.path.relpath(sys.executable)
    if python.startswith(".."):
        python = sys.executable
    client = (f'from openai import OpenAI; c = OpenAI(base_url="{base_url}/v1", '
              f'api_key="none"); print(c.chat.completions.create(model="{model}", '
              'messages=[{"role": "user", "content": "Hello there!"}], max_tokens=16)'
              '.choices[0].message.content)')
    return "\n".join([
        "",
        "Try it from another terminal (the engines are simulated: an answer repeats your last "
        "line after '(simulated)'):",
        f"  curl -s {base_url}/v1/chat/completions -H 'Content-Type: application/json' \\",
        f"       -d {shlex.quote(body)}",
        f"  {shlex.quote(python)} -c {shlex.quote(client)}",
        f"  curl -s {base_url}/metrics | grep kvroute_routing_decisions",
        "",
        "Serving until Ctrl-C.",
    ])


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the demo as Ctrl-C does


def cli(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="kvroute demo", description=__doc__)
    p.add_argument("--port", type=int, default=8000, help="router port (0: any free one)")
    p.add_argument("--once", action="store_true", help="run the tour and exit")
    p.add_argument("--engines", type=int, default=3)
    p.add_argument("--policy", choices=POLICIES, default="cache_aware")
    p.add_argument("--step-time", type=float, default=0.005, help="sim seconds per decode step")
    p.add_argument("--output", choices=OUTPUTS, default="echo",
                   help="the simulated engines' answers: echo (readable) or random words")
    args = p.parse_args(argv)
    if args.engines < 1:
        p.error("--engines must be >= 1")
    # The tour shows each answer's cached prompt tokens (vLLM's --enable-prompt-tokens-details).
    opts = ClusterOptions(engines=args.engines, policy=PolicyConfig(name=args.policy),
                          sim={"step_time": args.step_time, "output": args.output},
                          port=args.port,
                          frontend=Frontend(enable_prompt_tokens_details=True))
    # Both explicitly: a shell starts background jobs with SIGINT ignored, and Ctrl-C must work.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)
    print(f"kvroute demo: starting the router and {args.engines} simulated engines "
          f"(policy {args.policy}) ...", flush=True)
    cluster = LocalCluster(opts)
    try:
        cluster.start()
    except OSError as exc:
        cluster.stop()
        print(f"kvroute demo: cannot listen on 127.0.0.1:{args.port}: {exc} (try --port 0)",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        cluster.stop()
        return 0
    try:
        model = cluster.state.models.registry.names()[0]
        url = cluster.base_url
        print(banner(cluster.config(), url, cluster.state), flush=True)
        run_requests(url, model)
        if args.once:
            return 0
        print(examples(url, model), flush=True)
        threading.Event().wait()  # until SIGINT / SIGTERM raise KeyboardInterrupt
    except KeyboardInterrupt:
        print("\nkvroute demo: stopping", flush=True)
    finally:
        cluster.stop()
    return 0

"""The workloads of bench/compare.py: chat requests with send times, built once and replayed
unchanged in front of every router.

Prompt text is made of words that are one Qwen3 token each (the embedded tokenizer's vocabulary,
a leading space and 3-9 lowercase letters), so a text of N words is N tokens and every size below
is in tokens. Each workload sends ``rate`` requests per second on a fixed schedule for
``seconds`` (a burst adds its own), every request streamed with ``max_tokens`` output tokens:

    tenants    shared system prompts: T tenants, each request one tenant's system prompt and a
               fresh user turn
    multiturn  conversations that grow: each conversation sends its history plus one more turn
               every ``turn_gap`` seconds
    agentic    tool loops: a few agent types with long shared tool definitions, sessions of short
               steps (a tool call and its result appended each step)
    burst      one long prefix sent by a burst of requests at once, over background tenant traffic
    skewed     tenants drawn by a Zipf law: the hottest alone outgrows one engine
    pressure   more distinct prefixes than the whole fleet's KV cache holds, drawn uniformly
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from functools import cache

from render.models import EMBEDDED_MODEL

WORKLOADS = ("tenants", "multiturn", "agentic", "burst", "skewed", "pressure")


@dataclass(frozen=True)
class Request:
    at: float  # seconds after the run starts
    body: bytes  # the /v1/chat/completions JSON
    prompt_tokens: int  # message text tokens (the chat template adds a few)


@dataclass(frozen=True)
class Workload:
    name: str
    requests: list[Request]
    distinct_prefix_tokens: int  # the shared prefixes' tokens, all told (for the report)


@cache
def words() -> tuple[str, ...]:
    """Vocabulary entries that are a space and 3-9 lowercase letters: one token each."""
    vocab = json.loads((EMBEDDED_MODEL / "tokenizer.json").read_text())["model"]["vocab"]
    out = sorted(w[1:] for w in vocab if w.startswith("Ġ") and 3 <= len(w) - 1 <= 9
                 and w[1:].isascii() and w[1:].isalpha() and w[1:].islower())
    return tuple(out)


def text(rng: random.Random, n: int) -> str:
    ws = words()
    return " " + " ".join(rng.choice(ws) for _ in range(n))


def chat(messages: list[dict[str, str]], model: str, max_tokens: int) -> bytes:
    # The final usage chunk carries the engine's own count of the prompt's cached tokens
    # (prompt_tokens_details): each request's hit, graded by the engine that served it.
    return json.dumps({"model": model, "messages": messages, "max_tokens": max_tokens,
                       "stream": True, "stream_options": {"include_usage": True},
                       "temperature": 0}).encode()


@dataclass(frozen=True)
class Spec:
    """What every workload shares: the served model name, output length, schedule and seed."""

    model: str
    rate: float
    seconds: float
    max_tokens: int = 16
    seed: int = 0
    scale: float = 1.0  # prompt sizes and counts (a miniature run shrinks them)

    def n(self, x: float) -> int:
        return max(1, round(x * self.scale))

    def times(self) -> list[float]:
        step = 1.0 / self.rate
        return [i * step for i in range(int(self.seconds * self.rate))]


def _tenant_requests(spec: Spec, rng: random.Random, prefixes: list[str], pick: list[int],
                     times: list[float]) -> list[Request]:
    out = []
    for t, tenant in zip(times, pick, strict=True):
        user = rng.randint(spec.n(40), spec.n(120))
        msgs = [{"role": "system", "content": prefixes[tenant]},
                {"role": "user", "content": text(rng, user)}]
        out.append(Request(t, chat(msgs, spec.model, spec.max_tokens),
                           len(prefixes[tenant].split()) + user))
    return out


def tenants(spec: Spec, count: int = 24, prefix: int = 1500) -> Workload:
    rng = random.Random(spec.seed)
    prefixes = [f"You are the assistant of tenant {i}." + text(rng, spec.n(prefix))
                for i in range(count)]
    times = spec.times()
    pick = [rng.randrange(count) for _ in times]
    return Workload("tenants", _tenant_requests(spec, rng, prefixes, pick, times),
                    count * spec.n(prefix))


def skewed(spec: Spec, count: int = 32, prefix: int = 1500, s: float = 1.1) -> Workload:
    rng = random.Random(spec.seed + 5)
    prefixes = [f"You are the assistant of tenant {i}." + text(rng, spec.n(prefix))
                for i in range(count)]
    weights = [1.0 / (i + 1) ** s for i in range(count)]
    times = spec.times()
    pick = rng.choices(range(count), weights, k=len(times))
    w = _tenant_requests(spec, rng, prefixes, pick, times)
    return Workload("skewed", w, count * spec.n(prefix))


def pressure(spec: Spec, count: int = 120, prefix: int = 1500) -> Workload:
    rng = random.Random(spec.seed + 6)
    prefixes = [f"Document {i}." + text(rng, spec.n(prefix)) for i in range(count)]
    times = spec.times()
    pick = [rng.randrange(count) for _ in times]
    return Workload("pressure", _tenant_requests(spec, rng, prefixes, pick, times),
                    count * spec.n(prefix))


def multiturn(spec: Spec, turns: int = 8, system: int = 300, user: int = 150,
              reply: int = 100, turn_gap: float = 2.0) -> Workload:
    """Conversations start at ``rate / turns`` per second; each sends ``turns`` requests, one
    every ``turn_gap`` seconds, each with the whole history so far."""
    rng = random.Random(spec.seed + 2)
    out: list[Request] = []
    starts = [i * turns / spec.rate for i in range(int(spec.seconds * spec.rate / turns) + 1)]
    for c, t0 in enumerate(starts):
        msgs = [{"role": "system", "content": f"Conversation {c}." + text(rng, spec.n(system))}]
        size = spec.n(system)
        for k in range(turns):
            at = t0 + k * turn_gap
            msgs.append({"role": "user", "content": text(rng, spec.n(user))})
            size += spec.n(user)
            if at < spec.seconds:
                out.append(Request(at, chat(msgs, spec.model, spec.max_tokens), size))
            msgs = [*msgs, {"role": "assistant", "content": text(rng, spec.n(reply))}]
            size += spec.n(reply)
    out.sort(key=lambda r: r.at)
    return Workload("multiturn", out, len(starts) * spec.n(system))


def agentic(spec: Spec, agents: int = 6, tools: int = 4000, steps: int = 10,
            step_gap: float = 1.5, result: int = 60, call: int = 40) -> Workload:
    """Sessions start at ``rate / steps`` per second, each of one agent type (its long tool
    definitions shared by every session of that type), then ``steps`` short turns: each appends
    the tool call the agent made and the tool's result."""
    rng = random.Random(spec.seed + 3)
    defs = [f"Agent {a} tools:" + text(rng, spec.n(tools)) for a in range(agents)]
    out: list[Request] = []
    starts = [i * steps / spec.rate for i in range(int(spec.seconds * spec.rate / steps) + 1)]
    for s, t0 in enumerate(starts):
        a = s % agents
        msgs = [{"role": "system", "content": defs[a]},
                {"role": "user", "content": f"Task {s}." + text(rng, spec.n(80))}]
        size = spec.n(tools) + spec.n(80)
        for k in range(steps):
            at = t0 + k * step_gap
            if at < spec.seconds:
                out.append(Request(at, chat(msgs, spec.model, spec.max_tokens), size))
            msgs = [*msgs, {"role": "assistant", "content": "call" + text(rng, spec.n(call))},
                    {"role": "user", "content": "result" + text(rng, spec.n(result))}]
            size += spec.n(call) + spec.n(result)
    out.sort(key=lambda r: r.at)
    return Workload("agentic", out, agents * spec.n(tools))


def burst(spec: Spec, size: int = 48, prefix: int = 6000, within: float = 1.0) -> Workload:
    """Background tenant traffic at half the rate, and at a third of the run ``size`` requests
    within ``within`` seconds that share one long prefix (a shared document, a new system
    prompt rolled out)."""
    rng = random.Random(spec.seed + 4)
    half = Spec(spec.model, spec.rate / 2, spec.seconds, spec.max_tokens, spec.seed, spec.scale)
    background = tenants(half).requests
    doc = "Shared document." + text(rng, spec.n(prefix))
    t0 = spec.seconds / 3
    n = spec.n(size)
    out = list(background)
    for i in range(n):
        tail = text(rng, spec.n(30))
        msgs = [{"role": "system", "content": doc}, {"role": "user", "content": tail}]
        out.append(Request(t0 + within * i / n, chat(msgs, spec.model, spec.max_tokens),
                           spec.n(prefix) + spec.n(30)))
    out.sort(key=lambda r: r.at)
    return Workload("burst", out, spec.n(prefix) + 24 * spec.n(1500))


BUILDERS = {"tenants": tenants, "multiturn": multiturn, "agentic": agentic, "burst": burst,
            "skewed": skewed, "pressure": pressure}


def build(name: str, spec: Spec) -> Workload:
    return BUILDERS[name](spec)

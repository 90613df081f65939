"""Micro-benchmark of the render library (no HTTP): per-call CPU µs for ~1k / ~10k-token chats.

Measures, on the embedded Qwen3 tokenizer, in one process and one run:
  * tokenizers call variants on the same text (to pick the cheapest exact one);
  * ``Renderer.chat_token_ids`` for unique chats (every piece new: cold cache), for the same chat
    resent (warm cache), for a multi-turn conversation resending its growing history (the common
    chat-client shape), and with the piece cache disabled (the plain tokenizer path);
  * the template render alone.
Run: ``.venv/bin/python bench/render_lib.py [--repeat N]``. Prints a table (median / p90 µs per
call, CPU time via ``time.process_time``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from render import Renderer, fast_bpe, fast_tokens  # noqa: E402
from render.protocol import ChatCompletionRequest  # noqa: E402

WORDS = (
    "the cache router engine token block prefix request stream model latency throughput "
    "memory kernel batch schedule decode prefill attention layer weight value query key"
).split()


def _text(seed: int, n_words: int) -> str:
    # Deterministic prose; every 8th word carries the seed, so no piece repeats across chats.
    words = (WORDS[(seed * 7 + i * 13 + i // 5) % len(WORDS)] for i in range(n_words))
    return " ".join(f"{w}{seed}" if i % 8 == 0 else w for i, w in enumerate(words)) + "."


def chat(seed: int, n_words: int, turns: int = 4) -> ChatCompletionRequest:
    msgs: list[dict[str, str]] = [{"role": "system", "content": f"[{seed}] You are helpful."}]
    per = max(1, n_words // (2 * turns))
    for t in range(turns):
        # Distinct text seeds per (chat, turn, role): no message repeats in another chat.
        msgs.append({"role": "user", "content": f"{seed}-{t}: " + _text(seed * 1000 + 2 * t, per)})
        msgs.append({"role": "assistant", "content": _text(seed * 1000 + 2 * t + 1, per)})
    msgs.append({"role": "user", "content": f"{seed} final question?"})
    return msgspec.convert({"messages": msgs}, ChatCompletionRequest)


def _time(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    samples = []
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        samples.append((time.process_time() - t0) * 1e6)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.9) - 1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=60)
    args = ap.parse_args()
    r = Renderer.load()  # the default: fastokens + its segment cache (render/fast_tokens.py)
    pieces_r = Renderer.load(fast_tokenizer=False)  # the fallback: piece cache + tiktoken
    plain = Renderer.load(cache_bytes=0, fast_tokenizer=False)
    tok = r.tokenizer
    fast = fast_bpe.build(tok)
    tok_file = Path(__file__).resolve().parent.parent / "render/models/qwen3/tokenizer.json"
    plain_fast = fast_tokens.build(tok_file, tok, 0) if r.fast else None
    rows: list[tuple[str, int, float, float]] = []
    for label, n_words in (("1k", 900), ("10k", 9000)):
        req = chat(1, n_words)
        text = r.chat_prompt(req)
        n_tok = len(r.chat_token_ids(req))
        variants: dict[str, Callable[[], object]] = {
            "tokenizers encode(add_special_tokens=False)": lambda text=text: (
                tok.encode(text, add_special_tokens=False).ids
            ),
            "tokenizers encode_batch([text])": lambda text=text: (
                tok.encode_batch([text], add_special_tokens=False)[0].ids
            ),
            "tokenizers encode_batch_fast([text]) (no offsets)": lambda text=text: (
                tok.encode_batch_fast([text], add_special_tokens=False)[0].ids
            ),
            "template render only": lambda req=req: r.chat_prompt(req),
        }
        if plain_fast is not None:
            variants["fastokens encode (render/fast_tokens.py, cache off)"] = (
                lambda text=text, f=plain_fast: f.encode(text)
            )
        if fast is not None:
            pieces = [p for p in pieces_r.pieces.split(text) if isinstance(p, str)]
            variants["tiktoken fast BPE on the pieces (render/fast_bpe.py)"] = (
                lambda pieces=pieces: fast(pieces)
            )
        for name, fn in variants.items():
            rows.append((f"{label}: {name}", n_tok, *_time(fn, args.repeat)))
        seeds = iter(range(1000, 1000 + 10 * args.repeat))
        unique = [chat(next(seeds), n_words) for _ in range(args.repeat)]
        it = iter(unique)
        rows.append(
            (
                f"{label}: chat, unique prompts, no cache (HF encode_batch_fast)",
                n_tok,
                *_time(lambda it=it: plain.chat_token_ids(next(it)), args.repeat),
            )
        )
        it = iter([chat(s + 5000, n_words) for s in range(args.repeat)])
        rows.append(
            (
                f"{label}: chat, unique prompts, piece cache + fast BPE (cold)",
                n_tok,
                *_time(lambda it=it: pieces_r.chat_token_ids(next(it)), args.repeat),
            )
        )
        it = iter([chat(s + 7000, n_words) for s in range(args.repeat)])
        rows.append(
            (
                f"{label}: chat, unique prompts, fastokens (default, cold)",
                n_tok,
                *_time(lambda it=it: r.chat_token_ids(next(it)), args.repeat),
            )
        )
        r.chat_token_ids(req)
        rows.append(
            (
                f"{label}: chat, same chat resent (warm)",
                n_tok,
                *_time(lambda req=req: r.chat_token_ids(req), args.repeat),
            )
        )
        # A chat client resending its growing history: each request = previous + 2 new turns.
        grow = []
        base: list[dict[str, str]] = [{"role": "system", "content": "You are helpful."}]
        per = max(1, n_words // 16)
        for t in range(args.repeat):
            base = base + [
                {"role": "user", "content": f"q{t} " + _text(t + 77, per)},
                {"role": "assistant", "content": f"a{t} " + _text(t + 99, per)},
            ]
            grow.append(
                msgspec.convert(
                    {"messages": base[-17:] + [{"role": "user", "content": "next?"}]},
                    ChatCompletionRequest,
                )
            )
        it = iter(grow)
        rows.append(
            (
                f"{label}: multi-turn, growing history (fastokens segment cache, default)",
                n_tok,
                *_time(lambda it=it: r.chat_token_ids(next(it)), args.repeat),
            )
        )
        it = iter(grow)
        rows.append(
            (
                f"{label}: multi-turn, growing history (piece cache)",
                n_tok,
                *_time(lambda it=it: pieces_r.chat_token_ids(next(it)), args.repeat),
            )
        )
        it = iter(grow)
        rows.append(
            (
                f"{label}: multi-turn, growing history (no cache)",
                n_tok,
                *_time(lambda it=it: plain.chat_token_ids(next(it)), args.repeat),
            )
        )
    width = max(len(r[0]) for r in rows)
    print(f"{'case':<{width}}  {'tokens':>7}  {'p50 µs':>9}  {'p90 µs':>9}")
    for name, n, p50, p90 in rows:
        print(f"{name:<{width}}  {n:>7}  {p50:>9.0f}  {p90:>9.0f}")


if __name__ == "__main__":
    main()

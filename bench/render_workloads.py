"""Request bodies for bench/render.py: unique ~1k / ~10k-token chats and growing multi-turn chats.

Text is drawn from a seeded pseudo-vocabulary so every request is unique (no cache can answer it
from an earlier one) yet reproducible. Multi-turn conversations share one system prompt, as a
chat product's users do, and resend their whole history each turn; requests are ordered turn by
turn across conversations, the order in which a fleet of chat clients sends them.
"""

from __future__ import annotations

import json
import random

_SYLLABLES = (
    "ka ro mi tu sen dal or ver pha ne gri lo mun tas el bri qua dor fen ix zo ap "
    "cle ment ion ure ab ly ing ter con pre dis un re ex ous ive ful less ness ward"
).split()
_PUNCT = (".", ",", "?", "!", ";", ":", " -", " (note)", "\n")
SYSTEM_PROMPT_WORDS = 350  # ~500 tokens shared by every conversation


def _words(rng: random.Random, n: int) -> str:
    out = []
    for i in range(n):
        w = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3)))
        if rng.random() < 0.08:
            w = w.capitalize()
        if rng.random() < 0.04:
            w = str(rng.randint(0, 99999))
        out.append(w)
        if i % 11 == 10:
            out[-1] += rng.choice(_PUNCT)
    return " ".join(out)


def unique_chats(model: str, n: int, words: int, seed: int) -> list[bytes]:
    """``n`` single-turn chats (system + user) of ``words`` random words each (~1.4 tokens/word)."""
    rng = random.Random(seed)
    bodies = []
    for i in range(n):
        messages = [
            {"role": "system", "content": f"You are assistant #{i}. " + _words(rng, 30)},
            {"role": "user", "content": _words(rng, words)},
        ]
        bodies.append(json.dumps({"model": model, "messages": messages}).encode())
    return bodies


def multi_turn_chats(
    model: str, conversations: int, turns: int, seed: int, turn_words: int = 110
) -> list[bytes]:
    """Every conversation's request at turn 1, then at turn 2, ...; history grows each turn."""
    system = _words(random.Random(1234), SYSTEM_PROMPT_WORDS)  # the same across runs, as in life
    rng = random.Random(seed)
    histories: list[list[dict[str, str]]] = [
        [{"role": "system", "content": system}] for _ in range(conversations)
    ]
    bodies = []
    for _ in range(turns):
        for h in histories:
            h.append({"role": "user", "content": _words(rng, turn_words)})
            bodies.append(json.dumps({"model": model, "messages": h}).encode())
            h.append({"role": "assistant", "content": _words(rng, turn_words)})
    return bodies

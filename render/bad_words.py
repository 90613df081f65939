"""``bad_words`` -> ``_bad_words_token_ids``: vLLM's ``SamplingParams.update_from_tokenizer``.

vLLM's engine reads only the token ids its frontend computed: each word is encoded without
special tokens as written (leading spaces stripped) and, where that gives a different first
token and the same length, also with one leading space, so that the word is banned both at the
start of the text and inside it. At most ``MAX_BAD_WORDS`` sequences (``VLLM_MAX_NUM_BAD_WORDS``).
"""

from __future__ import annotations

from collections.abc import Callable

from render.errors import BadRequestError

MAX_BAD_WORDS = 128

Encode = Callable[[str], list[int]]


def bad_words_token_ids(words: list[str] | None, encode: Encode,
                        limit: int = MAX_BAD_WORDS) -> list[list[int]] | None:
    """The token-id sequences vLLM's engine bans for ``words``; None when there are none.
    ``encode(text)`` is the model's tokenizer without special tokens."""
    if not words:
        return None
    out: list[list[int]] = []
    for word in words:
        plain = word.lstrip()
        for spaced, text in enumerate((plain, " " + plain)):
            ids = encode(text)
            if not spaced:
                if not ids:
                    raise BadRequestError(
                        "bad_words entries must tokenize to at least one token.", "bad_words")
            elif not ids or ids[0] == out[-1][0] or len(ids) != len(out[-1]):
                continue  # the spaced form adds nothing (or nothing enforceable)
            out.append(ids)
            if len(out) > limit:
                raise BadRequestError(f"Too many bad words after tokenization: {len(out)}. "
                                      f"The max number is {limit}.", "bad_words")
    return out

"""gpt-oss's Harmony output (``openai`` tool calls, ``openai_gptoss`` reasoning) in one stage.

The output is messages: ``<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>TYPE]<|message|>TEXT``
ended by ``<|end|>``, ``<|call|>`` or ``<|return|>``, the next one opened by ``<|start|>ROLE``.
As vLLM's HarmonyParser sorts them: ``analysis`` is reasoning, ``final`` (and ``commentary``
without a recipient) content, a ``functions.NAME`` recipient a tool call whose text is its
arguments (the model's bytes), anything else is dropped. vLLM's answer joins the messages of one
kind with a newline, so a second message's text streams after one.
"""

from __future__ import annotations

import re

from output.holdback import Cutter
from output.parsers.emit import Out

HEADER, BODY, BETWEEN = range(3)
MESSAGE, START = "<|message|>", "<|start|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
MARKERS = ("<|channel|>", MESSAGE, START, "<|constrain|>", *ENDS)
# Recipients that are built-in tools, not functions (vLLM's BUILTIN_TOOL_TO_MCP_SERVER_LABEL).
BUILTINS = frozenset({"browser", "python", "container", "web_search_preview",
                      "code_interpreter"})
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL = re.compile(r"<\|channel\|>\s*([^\s<]+)")
REASONING, CONTENT, TOOL, IGNORE = range(4)


def is_function(recipient: str) -> bool:
    if not recipient or recipient.startswith("<|") or recipient == "assistant":
        return False
    if recipient.startswith("functions."):
        return len(recipient) > len("functions.")
    return recipient.split(".", 1)[0] not in BUILTINS


class Harmony:
    __slots__ = ("out", "reasoning", "state", "buf", "header", "raw", "kind", "index", "seen",
                 "first", "_cut")

    def __init__(self, out: Out, reasoning: bool) -> None:
        self.out = out
        self.reasoning = reasoning  # analysis is shown (vLLM's openai_gptoss parser is set)
        self.state = HEADER  # the prompt ends with <|start|>assistant
        self.buf = ""
        self.header = ""
        self.raw = ""  # the open message's text so far (its <|start|> included)
        self.kind = IGNORE
        self.index = -1
        self.seen = {REASONING: False, CONTENT: False}  # a message of the kind had text
        self.first = True  # no text of the current message yet
        self._cut = {HEADER: Cutter((MESSAGE,)), BODY: Cutter(ENDS),
                     BETWEEN: Cutter((START,))}

    def feed(self, text: str) -> None:
        self.buf += text
        while True:
            state = self.state
            n, marker = self._cut[state].cut(self.buf)
            text, self.buf = self.buf[:n], self.buf[n:]
            if state == HEADER:
                self.header += text
                self.raw += text
            elif state == BODY:
                self._body(text)
            if marker is None:
                return
            self.buf = self.buf[len(marker):]
            if state == HEADER:
                self._open()
            elif state == BODY:
                self.state = BETWEEN
            else:
                self.header = ""
                self.raw = marker
                self.state = HEADER

    def finish(self) -> None:
        if self.state == BODY:
            self._body(self.buf)
        elif self.state == HEADER and (self.raw or self.buf):
            # Cut before its text began: vLLM answers the message's raw text as content.
            self.kind = CONTENT
            self.first = True
            self._body(self.raw + self.buf)
        self.buf = ""

    def _open(self) -> None:
        """The header is complete: what kind of message follows."""
        header = self.header
        role = header.split("<|channel|>", 1)[0].split(" to=", 1)[0].strip()
        found = _RECIPIENT.search(header)
        recipient = found.group(1).split("<|constrain|>", 1)[0] if found else None
        found = _CHANNEL.search(header)
        channel = found.group(1) if found else None
        self.index = -1
        if role not in ("", "assistant"):
            self.kind = IGNORE
        elif recipient and is_function(recipient):
            self.kind = TOOL
            self.index = self.out.call(recipient.removeprefix("functions."))
            self.out.region = True
        elif channel == "analysis":
            self.kind = REASONING if self.reasoning else IGNORE
        elif channel == "final" or (channel == "commentary" and recipient is None):
            self.kind = CONTENT
        else:
            self.kind = IGNORE
        self.state = BODY
        self.header = self.raw = ""
        self.first = True

    def _body(self, text: str) -> None:
        if not text:
            return
        kind = self.kind
        if kind == TOOL:
            self.out.args(self.index, text)
            return
        if kind == IGNORE:
            return
        if self.first and self.seen[kind]:
            text = "\n" + text  # vLLM joins the messages of one kind with a newline
        self.first = False
        self.seen[kind] = True
        if kind == REASONING:
            self.out.think(text)
        else:
            self.out.text(text)

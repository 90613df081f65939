"""Mistral calls after ``[TOOL_CALLS]``: the pre-v11 JSON array and the v11+ ``NAME[ARGS]{...}``.

Pre-v11 tokenizers (no ``[ARGS]`` token, e.g. Mistral Nemo): ``[TOOL_CALLS][{"name": ...,
"arguments": {...}}, ...]`` (or one bare object); each element with a string name and an
``arguments`` key is a call, announced once both are known, its argument bytes forwarded as the
JSON scan validates them; text after the JSON is no content. v11+: ``[TOOL_CALLS]NAME[ARGS]{...}``
(or ``NAME{...}``), one ``[TOOL_CALLS]`` per call; the arguments are the first JSON value after
the name (``{}`` when empty), forwarded as written. The content is the text before the first
``[TOOL_CALLS]``; call ids are 9 random letters and digits, as Mistral's templates require.
"""

from __future__ import annotations

import random
import string

from output.holdback import Cutter
from output.parsers.base import LeadingSpace
from output.parsers.emit import Out
from output.parsers.json_args import forward_args
from output.parsers.jsonscan import JsonScan

BOT, ARGS = "[TOOL_CALLS]", "[ARGS]"
TEXT, OPEN, ARRAY, NAME, VALUE, AFTER = range(6)
_ALNUM = string.ascii_letters + string.digits


def mistral_call_id(name: str, index: int) -> str:
    return "".join(random.choices(_ALNUM, k=9))


class MistralCalls:
    __slots__ = ("out", "v11", "state", "buf", "lead", "scan", "name", "index", "calls", "sent",
                 "raw", "_bot", "_name")

    def __init__(self, out: Out, v11: bool) -> None:
        self.out = out
        self.v11 = v11
        self.state = TEXT
        self.buf = ""
        self.lead = LeadingSpace(out)
        self.scan = JsonScan()
        self.name = ""
        self.index = -1
        self.calls: dict[int, int] = {}  # pre-v11: array element -> call index
        self.sent: dict[int, int] = {}  # call index -> how far its arguments were forwarded
        self.raw: str | None = None  # pre-v11: the text after the marker, until a call is made
        self._bot = Cutter((BOT,))
        self._name = Cutter((ARGS, "{", BOT))

    def feed(self, text: str) -> None:
        self.buf += text
        while self._step(False):
            pass

    def finish(self) -> None:
        while self._step(True):
            pass
        if self.state == TEXT:
            self.lead.text(self.buf)
            self.lead.release()
        elif self.state == NAME:
            self._announce()
            self._end_args()
        elif self.state == VALUE:
            self._end_args()
        if self.raw is not None and not self.calls and not self.lead.seen_text:
            # No call in it: vLLM answers the text after the marker as the content.
            self.out.text((self.raw + (self.buf if self.state in (OPEN, ARRAY) else "")).strip())
        self.buf = ""

    def _step(self, final: bool) -> bool:
        state = self.state
        if state == TEXT:
            n, marker = self._bot.cut(self.buf)
            self.lead.text(self.buf[:n])
            self.buf = self.buf[n:]
            if marker is None:
                return False
            self.buf = self.buf[len(marker):]
            self.lead.drop()
            self.out.region = True
            self.state = NAME if self.v11 else OPEN
            self.name = ""
            if not self.v11:
                self.raw = ""
            return True
        if state == OPEN:  # pre-v11: the JSON after the marker(s)
            self.buf = self.buf.lstrip()
            if self.buf.startswith(BOT):
                self.buf = self.buf[len(BOT):]
                return True
            if not self.buf or (not final and BOT.startswith(self.buf)):
                return False
            self.scan = JsonScan(depth=2 if self.buf[0] == "[" else 1)
            self.state = ARRAY
            return True
        if state == ARRAY:
            self.scan.feed(self.buf, self.scan.pos, final)
            self._elements()
            if self.scan.done or self.scan.error:
                if self.raw is not None:
                    self.raw += self.buf
                self.buf = ""
                self.state = AFTER
            return False
        if state == NAME:
            n, marker = self._name.cut(self.buf)
            self.name += self.buf[:n]
            self.buf = self.buf[n:]
            if marker is None:
                return False
            self._announce()
            if marker == BOT:
                self._end_args()
                self.buf = self.buf[len(marker):]
                self.name = ""
                return True
            if marker == ARGS:
                self.buf = self.buf[len(marker):]
            self.scan = JsonScan()
            self.sent[self.index] = 0
            self.state = VALUE
            return True
        if state == VALUE:  # v11+: the first JSON value, then up to the next call
            lead = len(self.buf) - len(self.buf.lstrip())
            scan = self.scan
            if scan.pos == 0:
                scan.pos = lead
            scan.feed(self.buf, scan.pos, final)
            end = scan.end if scan.done and scan.end is not None else scan.open_end
            start = max(self.sent.get(self.index, 0), lead)
            if end > start and not scan.error:
                self.out.args(self.index, self.buf[start:end])
                self.sent[self.index] = end
            if scan.done or scan.error:
                n, marker = self._bot.cut(self.buf)
                if scan.error and self.sent.get(self.index, 0) <= lead:
                    self.out.args(self.index, self.buf[lead:n].strip())
                if marker is None:
                    return False
                self.buf = self.buf[n + len(marker):]
                self.state = NAME
                self.name = ""
                return True
            return False
        if self.raw is not None:
            self.raw += self.buf
        self.buf = ""  # AFTER: the rest is no content
        return False

    def _announce(self) -> None:
        self.index = self.out.call(self.name)

    def _end_args(self) -> None:
        if self.index >= 0 and self.sent.get(self.index, 0) == 0:
            self.out.args(self.index, "{}")
        self.index = -1

    def _elements(self) -> None:
        scan = self.scan
        names: dict[int, str] = {}
        for f in scan.fields:
            if f.key == "name" and isinstance(f.text, str):
                names.setdefault(f.element, f.text)
        has_args = {f.element for f in scan.fields if f.key == "arguments"}
        for element in range(scan.elements):
            # An element with a name and no arguments is a call without any (vLLM: "{}"),
            # known once the next element began or the JSON ended.
            done = element < scan.elements - 1 or scan.done
            if element in names and element not in has_args and done and (
                    element not in self.calls):
                bare = self.calls[element] = self.out.call(names[element])
                self.out.args(bare, "{}")
        for f in scan.fields:
            if f.key != "arguments" or f.start is None:
                continue
            call = self.calls.get(f.element)
            if call is None:
                name = names.get(f.element)
                if name is None:
                    continue
                call = self.calls[f.element] = self.out.call(name)
                self.sent[call] = f.start
            self.sent[call] = forward_args(self.out, call, self.buf, f, self.sent[call],
                                           scan.open_end)


def mistral(out: Out, v11: bool) -> MistralCalls:
    return MistralCalls(out, v11)

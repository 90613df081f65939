"""Llama 3.x / 4 JSON calls (``llama3_json``, ``llama4_json``): the output IS the calls.

``{"name": "f", "parameters": {...}}`` (or ``"arguments"``), several joined by ``; ``, maybe
after ``<|python_tag|>``. As vLLM streams them, an output is calls when it begins with the tag or
``{``, and is text otherwise. A call is announced once its name and arguments key are known and
its argument bytes stream as the JSON scan validates them; text between calls is no content. A
first call that breaks before it was announced makes the whole output content, as vLLM answers
it; one that breaks after keeps the raw rest of its text as arguments.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from output.parsers.emit import Out
from output.parsers.json_args import forward_args, forward_broken
from output.parsers.jsonscan import Field, JsonScan

TAG = "<|python_tag|>"
START, TEXT, CALLS, BODY, BROKEN = range(5)
ARGS_KEYS = ("arguments", "parameters")


class JsonObjectCalls:
    __slots__ = ("out", "state", "buf", "raw", "tagged", "scan", "index", "sent")

    def __init__(self, out: Out) -> None:
        self.out = out
        self.state = START
        self.buf = ""
        self.tagged = False  # the leading tag question is settled
        self.raw = ""  # the output so far, while it may still turn out to be text
        self.scan = JsonScan()
        self.index = -1
        self.sent = 0

    def feed(self, text: str) -> None:
        if self.state == TEXT:
            self.out.text(text)
            return
        self.buf += text
        self._run(False)

    def finish(self) -> None:
        self._run(True)
        if self.state == BROKEN:
            self.out.args(self.index, self.buf.rstrip())
        self.buf = ""

    def _run(self, final: bool) -> None:
        while True:
            state = self.state
            if state == START:
                if not self.tagged:
                    if self.buf.startswith(TAG):
                        self.raw, self.buf = TAG, self.buf[len(TAG):]
                    elif TAG.startswith(self.buf) and not final:
                        return  # may still become the tag
                    self.tagged = True
                if not self.buf and not final:
                    return
                if self.buf.startswith("{"):
                    self._open()
                else:
                    self._as_text()
                    return
            elif state == CALLS:  # between calls: wait for the next object
                i = self.buf.find("{")
                if i < 0:
                    self.buf = ""
                    return
                self.buf = self.buf[i:]
                self._open()
            elif state == BODY:
                if not self._body(final):
                    return
            else:  # BROKEN, TEXT: nothing more to find
                return

    def _as_text(self) -> None:
        """The output is text: as it began (vLLM streams it so), or because its first call
        broke before it was announced (vLLM's answer is then the whole output)."""
        self.out.text(self.raw + self.buf)
        self.raw = self.buf = ""
        self.state = TEXT

    def _open(self) -> None:
        self.state = BODY
        self.scan = JsonScan()
        self.index = -1
        self.sent = 0

    def _body(self, final: bool) -> bool:
        scan = self.scan
        scan.feed(self.buf, scan.pos, final)
        if self.index < 0:
            name = next((f.text for f in scan.fields if f.key == "name"), None)
            has_args = any(f.key in ARGS_KEYS for f in scan.fields)
            if isinstance(name, str) and has_args:
                self.index = self.out.call(name)
                self.out.region = True
        if scan.error or (final and not scan.done) or (scan.done and self.index < 0):
            if self.index < 0:
                if self.out.ncalls == 0:
                    self._as_text()
                else:
                    self.state = CALLS
                    self.buf = self.buf[max(scan.pos, 1):]
                return True
            cut = forward_broken(self.out, self.index, self.buf, self._args(), self.sent, scan)
            self.buf = self.buf[cut:]
            self.state = BROKEN
            return True
        if self.index >= 0:
            self._forward()
        if scan.done:
            assert scan.end is not None
            self.raw = ""
            self.buf = self.buf[scan.end:]
            self.state = CALLS
            return True
        return False

    def _args(self) -> Field | None:
        return next((f for f in self.scan.fields if f.key in ARGS_KEYS), None)

    def _forward(self) -> None:
        self.sent = forward_args(self.out, self.index, self.buf, self._args(), self.sent,
                                 self.scan.open_end)


def llama3_json(out: Out, tools: Sequence[dict[str, Any]]) -> JsonObjectCalls:
    return JsonObjectCalls(out)

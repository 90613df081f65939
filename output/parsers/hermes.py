"""Hermes tool calls (Qwen2.5/3): ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``.

As vLLM's ``hermes`` parser decides them: the content is the text before the first call
(whitespace-only content is none), text after a call is dropped, and a call needs a string
``name`` and an ``arguments`` key. A call is announced (index, id, name) once both are known and
its argument bytes stream as the JSON scan validates them. A call that breaks before it was
announced (not JSON, a key missing, cut by max_tokens) is, as in vLLM, text: the whole output is
content when no call came before it. One that breaks after keeps the raw rest of its body as
arguments, as vLLM's own stream does (docs/parsers.md lists these cases).
"""

from __future__ import annotations

from output.holdback import Cutter
from output.parsers.base import LeadingSpace
from output.parsers.emit import Out
from output.parsers.json_args import forward_args, forward_broken
from output.parsers.jsonscan import Field, JsonScan

TEXT, BODY, AFTER, SKIP, RAW, BROKEN = range(6)


class JsonCalls:
    """Calls written as one JSON object each between a start and an end marker."""

    __slots__ = ("out", "start", "args_keys", "state", "buf", "lead", "scan", "index", "sent",
                 "_start", "_end")

    def __init__(self, out: Out, start: str = "<tool_call>", end: str = "</tool_call>",
                 args_keys: tuple[str, ...] = ("arguments",)) -> None:
        self.out = out
        self.start = start
        self.args_keys = args_keys
        self.state = TEXT
        self.buf = ""
        self.lead = LeadingSpace(out)
        self.scan = JsonScan()
        self.index = -1  # the call being parsed, once announced
        self.sent = 0  # how far into buf its arguments were forwarded
        self._start = Cutter((start,))
        self._end = Cutter((end,))

    def feed(self, text: str) -> None:
        self.buf += text
        self._run(False)

    def finish(self) -> None:
        self._run(True)
        if self.state == TEXT:
            self.lead.text(self.buf)
            self.lead.release()
        elif self.state == RAW:
            self.out.text(self.buf)
        # Otherwise what is left is a partial end marker, whitespace, or text vLLM drops.
        self.buf = ""

    def _run(self, final: bool) -> None:
        while True:
            state = self.state
            if state == TEXT:
                n, marker = self._start.cut(self.buf)
                self.lead.text(self.buf[:n])
                self.buf = self.buf[n:]
                if marker is None:
                    return
                self._open()
            elif state == BODY:
                if not self._body(final):
                    return
            elif state == RAW:
                self.out.text(self.buf)
                self.buf = ""
                return
            elif state == BROKEN:
                # The raw body up to the end marker, trailing whitespace held (vLLM strips it).
                n, marker = self._end.cut(self.buf)
                body = self.buf[:n]
                keep = len(body.rstrip())
                self.out.args(self.index, body[:keep])
                if marker is None:
                    self.buf = self.buf[keep:]
                    return
                self.buf = self.buf[n + len(marker):]
                self.state = SKIP
            elif state == AFTER:  # the call's JSON ended: drop text up to its end marker
                n, marker = self._end.cut(self.buf)
                if marker is None:
                    self.buf = self.buf[n:]
                    return
                self.buf = self.buf[n + len(marker):]
                self.state = SKIP
            else:  # SKIP: text between calls is dropped
                n, marker = self._start.cut(self.buf)
                self.buf = self.buf[n:]
                if marker is None:
                    return
                self._open()

    def _open(self) -> None:
        """``buf`` starts with a start marker: a call's body follows it."""
        self.state = BODY
        self.scan = JsonScan()
        self.scan.pos = len(self.start)
        self.index = -1
        self.sent = 0

    def _body(self, final: bool) -> bool:
        """Scan the call's JSON; True when the state changed."""
        scan = self.scan
        scan.feed(self.buf, scan.pos, final)
        if self.index < 0:
            self._announce()
        if scan.error or (scan.done and self.index < 0) or (final and not scan.done):
            if self.index < 0:
                self._as_text()
            else:
                # Broken after it was announced: the raw rest of the body is its arguments.
                cut = forward_broken(self.out, self.index, self.buf, self._args_field(),
                                     self.sent, scan)
                self.buf = self.buf[cut:]
                self.state = BROKEN
            return True
        if self.index >= 0:
            self._forward()
        if scan.done:
            assert scan.end is not None
            self.buf = self.buf[scan.end:]
            self.state = AFTER
            return True
        return False

    def _announce(self) -> None:
        name = None
        args = False
        for f in self.scan.fields:
            if f.key == "name" and name is None and isinstance(f.text, str):
                name = f.text
            elif f.key in self.args_keys:
                args = True
        if name is not None and args:
            self.index = self.out.call(name)
            self.lead.drop()

    def _args_field(self) -> Field | None:
        return next((f for f in self.scan.fields if f.key in self.args_keys), None)

    def _forward(self) -> None:
        self.sent = forward_args(self.out, self.index, self.buf, self._args_field(), self.sent,
                                 self.scan.open_end)

    def _as_text(self) -> None:
        """A call that is not one. vLLM then answers the whole output as content, which the
        stream can still do while no call was announced."""
        if self.out.ncalls == 0:
            self.lead.release()
            self.state = RAW
        else:
            self.buf = self.buf[self.scan.pos:]
            self.state = AFTER


def hermes(out: Out) -> JsonCalls:
    return JsonCalls(out)

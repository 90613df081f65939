"""Calls forced by ``tool_choice``: a named function, or ``required`` (one or more calls).

The engine decodes these under a JSON-schema constraint (render/tool_choice.py), so the content
IS the call: for a named function, its arguments object; for ``required``, a JSON array of
``{"name": ..., "parameters": ...}``. As in vLLM no tool parser reads them: the named call is
announced at the first non-blank text and every byte after the leading whitespace is its
arguments; the array's calls are announced once an element's name is complete and its
``parameters`` value has begun, whose bytes then stream.
"""

from __future__ import annotations

from output.parsers.emit import Out
from output.parsers.json_args import forward_args
from output.parsers.jsonscan import JsonScan


class Named:
    __slots__ = ("out", "name", "index", "held")

    def __init__(self, out: Out, name: str) -> None:
        self.out = out
        self.name = name
        self.index = -1
        self.held = ""

    def feed(self, text: str) -> None:
        if self.index >= 0:
            self.out.args(self.index, text)
        elif text.strip():
            self.index = self.out.call(self.name)
            self.out.args(self.index, self.held + text)
            self.held = ""
        else:
            self.held += text

    def finish(self) -> None:
        pass  # blank output: no call (vLLM answers content "")


class Required:
    __slots__ = ("out", "buf", "scan", "calls", "sent")

    def __init__(self, out: Out) -> None:
        self.out = out
        self.buf = ""
        self.scan = JsonScan(depth=2)
        self.calls: dict[int, int] = {}  # array element -> call index
        self.sent: dict[int, int] = {}  # call index -> how far its arguments were forwarded

    def feed(self, text: str) -> None:
        if self.scan.done or self.scan.error:
            return
        self.buf += text
        self.scan.feed(self.buf, self.scan.pos)
        self._emit()

    def finish(self) -> None:
        if not (self.scan.done or self.scan.error):
            self.scan.feed(self.buf, self.scan.pos, final=True)
            self._emit()

    def _emit(self) -> None:
        scan = self.scan
        if scan.root != "[":
            return
        names: dict[int, str] = {}
        for f in scan.fields:
            if f.key == "name" and isinstance(f.text, str):
                names.setdefault(f.element, f.text)
        for f in scan.fields:
            if f.key == "parameters" and f.start is not None:
                call = self.calls.get(f.element)
                if call is None:
                    name = names.get(f.element)
                    if name is None:
                        continue
                    call = self.calls[f.element] = self.out.call(name)
                    self.sent[call] = f.start
                self.sent[call] = forward_args(self.out, call, self.buf, f, self.sent[call],
                                               scan.open_end)

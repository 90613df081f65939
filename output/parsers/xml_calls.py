"""Calls written as tags with one text value per parameter: Qwen3-Coder and GLM-4.5/4.7.

``qwen3_coder`` / ``qwen3_xml``::

    <tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>

(a value loses one leading and one trailing newline; the next ``<parameter=`` also ends one).
``glm45`` / ``glm47``: ``<tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>
</tool_call>`` (names and keys stripped, names checked against the request's tools).

The arguments are JSON written here, as vLLM writes them (``json.dumps`` of the values typed by
the tool's schema, render/parsers/schema.py): a value the schema leaves a string streams as it
is generated, JSON-escaped; a typed one is written once it ends. As in vLLM's engine parsers,
content loses its surrounding whitespace when calls follow, and text after a call is dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from output.holdback import Cutter
from output.parsers.base import TrailingSpace
from output.parsers.emit import Out
from output.parsers.schema import coerce, dumps, is_text, properties

TEXT, PREAMBLE, NAME, ARGS, KEY, GAP, VALUE, BETWEEN, AFTER = range(9)


@dataclass(frozen=True, slots=True)
class TagFormat:
    call_start: str  # opens a call region
    func_start: str | None  # Qwen3: "<function=" opens the call proper (also without call_start)
    name_end: str  # what ends the name (Qwen3 ">"; GLM: the first key, or the call's end)
    func_end: str  # ends the call's arguments
    call_end: str  # closes the call region
    key_start: str
    key_end: str
    value_start: str | None  # GLM: "<arg_value>" after the key
    value_end: str
    trim_newlines: bool  # Qwen3: one leading and one trailing newline are markup
    strip: bool  # GLM: names and keys are stripped
    check_names: bool  # vLLM's validate_tool_names: a call to an unknown tool is dropped


QWEN3_XML = TagFormat("<tool_call>", "<function=", ">", "</function>", "</tool_call>",
                      "<parameter=", ">", None, "</parameter>", True, False, False)
GLM = TagFormat("<tool_call>", None, "<arg_key>", "</tool_call>", "</tool_call>", "<arg_key>",
                "</arg_key>", "<arg_value>", "</arg_value>", False, True, True)


class TagCalls:
    __slots__ = ("fmt", "out", "tools", "state", "buf", "lead", "name", "index", "props",
                 "params", "key", "value", "streaming", "first", "nl", "_cut")

    def __init__(self, fmt: TagFormat, out: Out, tools: Sequence[dict[str, Any]]) -> None:
        self.fmt = fmt
        self.out = out
        self.tools = tools
        self.state = TEXT
        self.buf = ""
        self.lead = TrailingSpace(out)
        self.name = ""
        self.index = -1  # the call being written, once announced
        self.props: dict[str, Any] = {}
        self.params = 0  # parameters written into the current call's arguments
        self.key = ""
        self.value = ""  # a typed value's text, written when it ends
        self.streaming = False  # the current value is a string being streamed
        self.first = False  # no text of the current value seen yet
        self.nl = ""  # a held newline that may be the value's last (Qwen3 markup)
        f = fmt
        starts = (f.call_start,) + ((f.func_start,) if f.func_start else ())
        value_ends = (f.value_end, f.func_end) + ((f.key_start,) if f.trim_newlines else ())
        self._cut = {
            TEXT: Cutter(starts), AFTER: Cutter(starts),
            PREAMBLE: Cutter(((f.func_start,) if f.func_start else ()) + (f.call_end,)),
            NAME: Cutter((f.name_end, f.func_end)),
            ARGS: Cutter((f.key_start, f.func_end)),
            KEY: Cutter((f.key_end,)),
            GAP: Cutter((f.value_start or f.key_end,)),
            VALUE: Cutter(value_ends),
            BETWEEN: Cutter(starts + (f.call_end,)),
        }

    def feed(self, text: str) -> None:
        self.buf += text
        while self._step():
            pass

    def finish(self) -> None:
        while self._step():
            pass
        if self.state == TEXT:
            self.lead.text(self.buf)
            self.lead.release()
        elif self.state in (NAME, ARGS, KEY, GAP, VALUE):
            self._cut_short()
        self.buf = ""

    def _step(self) -> bool:
        """Up to the next marker; False when the buffer needs more text."""
        state = self.state
        n, marker = self._cut[state].cut(self.buf)
        text, self.buf = self.buf[:n], self.buf[n:]
        if state == TEXT:
            self.lead.text(text)
        elif state == NAME:
            self.name += text
        elif state == KEY:
            self.key += text
        elif state == VALUE:
            self._value_text(text)
        if marker is None:
            return False
        self.buf = self.buf[len(marker):]
        self._marker(state, marker)
        return True

    def _marker(self, state: int, marker: str) -> None:
        f = self.fmt
        if state in (TEXT, AFTER, BETWEEN):
            if marker == f.call_start:
                self.lead.drop()
                self.name = ""
                self.state = PREAMBLE if f.func_start else NAME
            elif marker == f.func_start:
                self._open_name()
            else:  # BETWEEN: the call region's end
                self.state = AFTER
        elif state == PREAMBLE:
            if marker == f.func_start:
                self._open_name()
            else:
                self.state = AFTER
        elif state == NAME:
            self._named()
            if marker == f.key_start:
                self._open_key()
            elif marker == f.name_end:
                self.state = ARGS
            else:
                self._close_call()
        elif state == ARGS:
            if marker == f.key_start:
                self._open_key()
            else:
                self._close_call()
        elif state == KEY:
            self.key = self.key.strip() if f.strip else self.key.lstrip()
            if f.value_start:
                self.state = GAP
            else:
                self._open_value()
        elif state == GAP:
            self._open_value()
        elif marker == f.value_end:  # VALUE
            self._end_value()
            self.state = ARGS
        elif marker == f.key_start:  # Qwen3: the next parameter ends this one
            self._end_value()
            self._open_key()
        else:  # the call ends inside a value: vLLM drops it (a string streamed is closed)
            if self.streaming:
                self.out.args(self.index, '"')
            self._close_call()

    def _open_name(self) -> None:
        self.lead.drop()
        self.state = NAME
        self.name = ""

    def _named(self) -> None:
        """The name is complete: announce the call, unless vLLM would not make it."""
        name = self.name.strip() if self.fmt.strip else self.name
        known = any(isinstance(t.get("function"), dict) and t["function"].get("name") == name
                    for t in self.tools)
        self.index = -1
        if name.strip() and (known or not self.fmt.check_names):
            self.index = self.out.call(name)
            self.props = properties(self.tools, name)
            self.params = 0

    def _open_key(self) -> None:
        self.key = ""
        self.state = KEY

    def _open_value(self) -> None:
        self.state = VALUE
        self.value = ""
        self.nl = ""
        self.first = True
        schema = self.props.get(self.key)
        self.streaming = self.index >= 0 and (self.key not in self.props or is_text(schema))
        if self.streaming:
            self._write(dumps(self.key) + ': "')

    def _value_text(self, text: str) -> None:
        if self.fmt.trim_newlines and self.first and text:
            self.first = False
            text = text[1:] if text.startswith("\n") else text
        if not text:
            return
        if not self.streaming:
            self.value += text
            return
        text = self.nl + text
        self.nl = ""
        if self.fmt.trim_newlines and text.endswith("\n"):
            text, self.nl = text[:-1], "\n"
        if text:
            self.out.args(self.index, dumps(text)[1:-1])

    def _end_value(self) -> None:
        if self.index < 0:
            return
        if self.streaming:
            self.out.args(self.index, '"')  # a held newline was the value's markup
            return
        value = self.value
        if self.fmt.trim_newlines and value.endswith("\n"):
            value = value[:-1]
        typed = coerce(value, self.props[self.key]) if self.key in self.props else value
        self._write(dumps(self.key) + ": " + dumps(typed))

    def _write(self, member: str) -> None:
        self.out.args(self.index, ("{" if self.params == 0 else ", ") + member)
        self.params += 1

    def _close_call(self) -> None:
        if self.index >= 0:
            self.out.args(self.index, "{}" if self.params == 0 else "}")
        self.index = -1
        self.state = BETWEEN if self.fmt.func_start else AFTER

    def _cut_short(self) -> None:
        """The output ended inside a call. Its arguments end with the parameters that ended;
        a string value cut short stays as it streamed (vLLM's answer drops it)."""
        if self.state == NAME:
            self._named()
        if self.index < 0 or (self.state == VALUE and self.streaming):
            return
        self.out.args(self.index, "{}" if self.params == 0 else "}")


def qwen3_xml(out: Out, tools: Sequence[dict[str, Any]]) -> TagCalls:
    return TagCalls(QWEN3_XML, out, tools)


def glm(out: Out, tools: Sequence[dict[str, Any]]) -> TagCalls:
    return TagCalls(GLM, out, tools)

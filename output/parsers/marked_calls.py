"""Calls framed by special markers with the model's own JSON arguments: DeepSeek V3 / V3.1, Kimi K2.

``deepseek_v3``: ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
\\n```json\\nARGS\\n```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>``;
``deepseek_v31``: ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>``;
``kimi_k2``: ``<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
<|tool_call_argument_begin|>ARGS<|tool_call_end|><|tool_calls_section_end|>`` (the header is
the call's id).

The content is the text before the calls' section (whitespace alone is no content); text after
it is dropped. Arguments are the model's bytes between the markers, forwarded as they come (as
vLLM answers them: not parsed; Kimi's stripped, empty ones ``{}``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from output.holdback import Cutter
from output.parsers.base import LeadingSpace
from output.parsers.emit import Out

TEXT, SECTION, KIND, NAME, ARGS, AFTER = range(6)


@dataclass(frozen=True, slots=True)
class MarkFormat:
    section_start: str
    section_end: str
    call_start: str
    name_start: str | None  # DeepSeek V3: the call kind ("function") comes first, up to this
    name_end: str  # the header (name, or Kimi's id) ends here
    args_end: tuple[str, ...]  # the arguments end at the first of these
    header: Callable[[str], tuple[str | None, str | None]]  # header -> (name, id)
    strip_args: bool = False  # Kimi: surrounding whitespace is not arguments, none is {}


def _plain(header: str) -> tuple[str | None, str | None]:
    return header, None


def _kimi(header: str) -> tuple[str | None, str | None]:
    """``functions.NAME:IDX`` -> (NAME, the header as the call's id); None unless it fits."""
    head = header.strip()
    name, sep, idx = head.rpartition(":")
    if not sep or not name or not idx.isdigit():
        return None, None
    return name.split(":")[0].removeprefix("functions."), head


DEEPSEEK_V3 = MarkFormat("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
                         "<｜tool▁sep｜>", "\n```json\n", ("\n```<｜tool▁call▁end｜>",), _plain)
DEEPSEEK_V31 = MarkFormat("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
                          "<｜tool▁call▁begin｜>", None, "<｜tool▁sep｜>",
                          ("<｜tool▁call▁end｜>",), _plain)
KIMI_K2 = MarkFormat("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                     "<|tool_call_begin|>", None, "<|tool_call_argument_begin|>",
                     ("<|tool_call_end|>", "<|tool_calls_section_end|>"), _kimi, strip_args=True)


class MarkedCalls:
    __slots__ = ("fmt", "out", "state", "buf", "lead", "header", "index", "args", "held", "_cut")

    def __init__(self, fmt: MarkFormat, out: Out) -> None:
        self.fmt = fmt
        self.out = out
        self.state = TEXT
        self.buf = ""
        self.lead = LeadingSpace(out)
        self.header = ""
        self.index = -1
        self.args = False  # the current call's arguments have begun (Kimi: past leading space)
        self.held = ""  # Kimi: trailing whitespace of the arguments, dropped at their end
        f = fmt
        self._cut = {
            TEXT: Cutter((f.section_start,)),
            SECTION: Cutter((f.call_start, f.section_end)),
            KIND: Cutter((f.name_start or f.name_end,)),
            NAME: Cutter((f.name_end,)),
            ARGS: Cutter(f.args_end),
            AFTER: Cutter(()),
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
        elif self.state == ARGS:
            self._end_args()
        self.buf = ""

    def _step(self) -> bool:
        state = self.state
        if state == AFTER:
            self.buf = ""
            return False
        n, marker = self._cut[state].cut(self.buf)
        text, self.buf = self.buf[:n], self.buf[n:]
        if state == TEXT:
            self.lead.text(text)
        elif state == NAME:
            self.header += text
        elif state == ARGS:
            self._args_text(text)
        if marker is None:
            return False
        self.buf = self.buf[len(marker):]
        f = self.fmt
        if state == TEXT:
            self.lead.drop()
            self.out.region = True
            self.state = SECTION
        elif state == SECTION:
            if marker == f.call_start:
                self.header = ""
                self.state = KIND if f.name_start else NAME
            else:
                self.state = AFTER
        elif state == KIND:
            self.state = NAME
        elif state == NAME:
            name, call_id = f.header(self.header)
            self.index = self.out.call(name, call_id) if name else -1
            self.args = False
            self.held = ""
            self.state = ARGS
        else:  # ARGS
            self._end_args()
            self.state = AFTER if marker == f.section_end else SECTION
        return True

    def _args_text(self, text: str) -> None:
        if self.index < 0 or not text:
            return
        if not self.fmt.strip_args:
            self.out.args(self.index, text)
            return
        if not self.args:
            text = text.lstrip()
            if not text:
                return
            self.args = True
        text = self.held + text
        body = text.rstrip()
        self.held = text[len(body):]
        self.out.args(self.index, body)

    def _end_args(self) -> None:
        if self.index >= 0 and self.fmt.strip_args and not self.args:
            self.out.args(self.index, "{}")
        self.index = -1


def deepseek_v3(out: Out, tools: Sequence[dict[str, Any]]) -> MarkedCalls:
    return MarkedCalls(DEEPSEEK_V3, out)


def deepseek_v31(out: Out, tools: Sequence[dict[str, Any]]) -> MarkedCalls:
    return MarkedCalls(DEEPSEEK_V31, out)


def kimi_k2(out: Out, tools: Sequence[dict[str, Any]]) -> MarkedCalls:
    return MarkedCalls(KIMI_K2, out)

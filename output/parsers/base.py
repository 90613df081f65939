"""The parser stage contract: text in (in the order the model wrote it), recognised parts out.

A choice's parsers form a chain: a reasoning stage hands the text after its reasoning to a
tool-call stage, which writes content and calls into the choice's ``Out``. Every stage is
streaming only: ``feed`` takes each new piece of text (any length, cut anywhere, even inside a
marker or a multi-byte character's text), ``finish`` ends the output. What a stage has written
once is final: the collected answer is the stream folded, so a stage never takes text back; it
holds back only what it cannot classify yet.
"""

from __future__ import annotations

from typing import Protocol

from output.parsers.emit import Out


class Stage(Protocol):
    def feed(self, text: str) -> None: ...

    def finish(self) -> None: ...


class Plain:
    """The last stage when no tool-call parser applies: all text is content."""

    __slots__ = ("out",)

    def __init__(self, out: Out) -> None:
        self.out = out

    def feed(self, text: str) -> None:
        self.out.text(text)

    def finish(self) -> None:
        pass


class LeadingSpace:
    """Content that is only whitespace so far, held until it is known to be kept.

    vLLM drops whitespace-only content when the turn makes tool calls (``content.strip() == ""``
    becomes None); whitespace followed by text, or a turn without calls, keeps it.
    """

    __slots__ = ("out", "held", "seen_text")

    def __init__(self, out: Out) -> None:
        self.out = out
        self.held = ""
        self.seen_text = False

    def text(self, s: str) -> None:
        if self.seen_text:
            self.out.text(s)
        elif s.strip():
            self.seen_text = True
            self.out.text(self.held + s)
            self.held = ""
        else:
            self.held += s

    def release(self) -> None:
        """No call follows: the held whitespace is content after all."""
        self.out.text(self.held)
        self.held = ""

    def drop(self) -> None:
        """A call follows: whitespace-only content is no content."""
        self.held = ""


class TrailingSpace:
    """Content for vLLM's engine-based parsers, which strip it when the turn makes tool calls:
    trailing whitespace is held until more text follows (kept), a call starts (dropped) or the
    output ends (kept); text after the first call is no content. Leading whitespace before text
    cannot wait for a call that may never come: it streams (docs/parsers.md)."""

    __slots__ = ("out", "held", "called")

    def __init__(self, out: Out) -> None:
        self.out = out
        self.held = ""
        self.called = False

    def text(self, s: str) -> None:
        if self.called or not s:
            return
        body = s.rstrip()
        if body:
            self.out.text(self.held + body)
            self.held = s[len(body):]
        else:
            self.held += s

    def release(self) -> None:
        """The output ended: held whitespace without a call is content."""
        if not self.called:
            self.out.text(self.held)
        self.held = ""

    def drop(self) -> None:
        """A call starts: from here on the text is not content."""
        self.called = True
        self.held = ""

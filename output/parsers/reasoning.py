"""Reasoning between think markers: the text before the end marker is reasoning, after it content.

One stage serves every ``<think>``-style family; a ``ThinkFormat`` says which markers it uses and
how vLLM's parser of that name treats the corner cases. Where the reasoning starts is decided by
the rendered PROMPT (``starts_reasoning``): a template that opened the think block, or closed it
for ``enable_thinking=false``, says so in its last turn; a prompt that says nothing leaves the
family's default (Qwen3 and DeepSeek-R1 models open it themselves).
"""

from __future__ import annotations

from dataclasses import dataclass

from output.holdback import Cutter
from output.parsers.base import Stage
from output.parsers.emit import Out


@dataclass(frozen=True, slots=True)
class ThinkFormat:
    name: str
    start: str = "<think>"
    end: str = "</think>"
    # Markers that end reasoning and begin the content (kept for the next stage), e.g. a tool
    # call the model starts without closing its reasoning.
    implicit_ends: tuple[str, ...] = ()
    default_reasoning: bool = True  # the start state when the prompt says nothing
    drop_stray_end: bool = False  # an end marker in the content is dropped, not content
    # Turn boundaries of the prompt: markers before the last one belong to earlier turns.
    boundaries: tuple[str, ...] = ()
    # A prompt that closed the think block (enable_thinking=false), or left it unopened where
    # that is the default, turns the parser off: the output is plain content, markers and all
    # (Qwen3's parser reads nothing then).
    off_when_closed: bool = False
    reenter: bool = False  # a start marker in the content opens reasoning again (GLM)
    rstrip: bool = False  # whitespace ending the reasoning is dropped (vLLM's engine parsers)
    # vLLM's engine-based parser: special tokens other than its markers are not text.
    engine: bool = False

    def starts_reasoning(self, prompt_tail: str) -> bool:
        """Whether generation starts inside reasoning, from the prompt's last text."""
        floor = max((prompt_tail.rfind(b) for b in self.boundaries), default=-1)
        start = prompt_tail.rfind(self.start)
        end = prompt_tail.rfind(self.end)
        if max(start, end) <= floor:
            return self.default_reasoning
        return start > end

    @property
    def markers(self) -> tuple[str, ...]:
        return (self.start, self.end, *self.implicit_ends)


class Thinking:
    """The reasoning stage: reasoning to ``out``, the rest to the next stage."""

    __slots__ = ("fmt", "out", "next", "reasoning", "buf", "space", "_in_reasoning",
                 "_in_content")

    def __init__(self, fmt: ThinkFormat, out: Out, nxt: Stage, reasoning: bool) -> None:
        self.fmt = fmt
        self.out = out
        self.next = nxt
        self.reasoning = reasoning
        self.buf = ""
        self.space = ""  # trailing reasoning whitespace held back (rstrip)
        self._in_reasoning = Cutter(fmt.markers)
        # Stray end markers are dropped after the output's own reasoning ended, not when the
        # prompt had already ended it.
        watch = (((fmt.end,) if fmt.drop_stray_end and reasoning else ())
                 + ((fmt.start,) if fmt.reenter else ()))
        self._in_content = Cutter(watch) if watch else None

    def feed(self, text: str) -> None:
        if not self.reasoning and self._in_content is None:
            if self.buf:
                text, self.buf = self.buf + text, ""
            self.next.feed(text)
            return
        buf = self.buf + text
        fmt = self.fmt
        while buf:
            if self.reasoning:
                n, marker = self._in_reasoning.cut(buf)
                self._think(buf[:n])
                buf = buf[n:]
                if marker is None:
                    break
                if marker == fmt.start:
                    buf = buf[len(marker):]
                    continue
                self.reasoning = False
                self.space = ""
                if marker == fmt.end:
                    buf = buf[len(marker):]
            elif self._in_content is None:
                self.next.feed(buf)
                buf = ""
            else:
                n, marker = self._in_content.cut(buf)
                self.next.feed(buf[:n])
                buf = buf[n:]
                if marker is None:
                    break
                buf = buf[len(marker):]
                self.reasoning = marker == fmt.start
        self.buf = buf

    def _think(self, text: str) -> None:
        if not self.fmt.rstrip:
            self.out.think(text)
            return
        body = text.rstrip()
        if body:
            self.out.think(self.space + body)
            self.space = text[len(body):]
        else:
            self.space += text

    def finish(self) -> None:
        buf, self.buf = self.buf, ""
        if self.reasoning:
            self._think(buf)
        elif buf:
            self.next.feed(buf)
        self.next.finish()


QWEN3 = ThinkFormat("qwen3", implicit_ends=("<tool_call>",), drop_stray_end=True,
                    boundaries=("<|im_start|>", "<|im_end|>"), off_when_closed=True,
                    engine=True)
DEEPSEEK_R1 = ThinkFormat("deepseek_r1")
GLM45 = ThinkFormat("glm45", implicit_ends=("<tool_call>",), drop_stray_end=True,
                    boundaries=("<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"),
                    off_when_closed=True, reenter=True, rstrip=True, engine=True)
KIMI_K2 = ThinkFormat("kimi_k2", implicit_ends=("<|tool_calls_section_begin|>",),
                      drop_stray_end=True, off_when_closed=True, rstrip=True, engine=True)
# DeepSeek V3.1: R1's parser when the request turns thinking on, else none (vLLM's
# deepseek_v3 reasoning parser); the prompt says which.
DEEPSEEK_V3 = ThinkFormat("deepseek_v3", default_reasoning=False, off_when_closed=True)
MISTRAL = ThinkFormat("mistral", start="[THINK]", end="[/THINK]", implicit_ends=("[TOOL_CALLS]",),
                      default_reasoning=False, drop_stray_end=True, reenter=True, rstrip=True,
                      engine=True)

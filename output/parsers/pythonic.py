"""Calls as a Python list of keyword calls (``pythonic``, ``llama4_pythonic``).

``[get_weather(city='Paris'), get_time()]``, for Llama 4 maybe inside ``<|python_start|>`` ...
``<|python_end|>``. As vLLM decides it, an output is calls when it begins with ``[``; each call's
arguments are Python literals (``null``/``true``/``false`` too, tuples and sets as lists, signed
numbers) written as JSON (``json.dumps``), so a call is announced with all its arguments once its
closing parenthesis arrives: Python text is not JSON, and a call's name only counts once it is
known to be a call. A first call that does not parse makes the whole output content, as vLLM
answers it.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from typing import Any

from output.parsers.emit import Out

START, LLAMA4, TEXT, LIST, AFTER = range(5)
PYTHON_START, PYTHON_END = "<|python_start|>", "<|python_end|>"
_NAMES = {"null": None, "true": True, "false": False}
_QUOTES = ("'''", '"""', "'", '"')


class NotACall(ValueError):
    pass


def _value(node: ast.expr) -> Any:
    if isinstance(node, ast.Constant):
        if node.value is None or isinstance(node.value, str | int | float):
            return node.value
        raise NotACall("not a JSON value")
    if isinstance(node, ast.Dict):
        if not all(isinstance(k, ast.Constant) for k in node.keys):
            raise NotACall("dict keys must be literals")
        return {k.value: _value(v) for k, v in zip(node.keys, node.values, strict=True)
                if isinstance(k, ast.Constant)}
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return [_value(v) for v in node.elts]
    if isinstance(node, ast.JoinedStr) and all(isinstance(p, ast.Constant)
                                               for p in node.values):
        return "".join(str(p.value) for p in node.values if isinstance(p, ast.Constant))
    if isinstance(node, ast.Name) and node.id in _NAMES:
        return _NAMES[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        operand = _value(node.operand)
        if isinstance(operand, int | float) and not isinstance(operand, bool):
            return -operand if isinstance(node.op, ast.USub) else operand
    raise NotACall("arguments must be literals")


def _name(node: ast.expr) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        raise NotACall("not a function name")
    parts.append(node.id)
    return ".".join(reversed(parts))


# vLLM's pattern for a whole output of calls: a plain name, keyword arguments only, and the
# first call right after the opening bracket.
_SHAPE = re.compile(r"[a-zA-Z]+\w*\(\s*(?:[a-zA-Z]+\w*=.*)?\)\s*", re.DOTALL)


def parse_call(text: str, first: bool) -> tuple[str, str]:
    """One call's text -> (name, arguments JSON as vLLM writes them)."""
    if _SHAPE.fullmatch(text if first else text.lstrip()) is None:
        raise NotACall("not a call of vLLM's pattern")
    try:
        expr = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise NotACall(str(exc)) from None
    if not isinstance(expr, ast.Call) or expr.args:
        raise NotACall("not a keyword call")
    args = {kw.arg: _value(kw.value) for kw in expr.keywords if kw.arg is not None}
    return _name(expr.func), json.dumps(args, ensure_ascii=False)


class PythonicCalls:
    __slots__ = ("out", "llama4", "state", "buf", "raw", "pos", "depth", "quote")

    def __init__(self, out: Out, llama4: bool) -> None:
        self.out = out
        self.llama4 = llama4
        self.state = START
        self.buf = ""  # the list's text not yet read as calls
        self.raw = ""  # the output so far, while it may still be text
        self.pos = 0  # scan position in buf
        self.depth = 0  # brackets open inside the list
        self.quote: str | None = None  # the string literal being scanned

    def feed(self, text: str) -> None:
        if self.state == TEXT:
            self.out.text(text)
            return
        if self.state == AFTER:
            return
        self.raw += text
        self.buf += text
        self._run(False)

    def finish(self) -> None:
        self._run(True)
        if self.state == LIST and self.pos < len(self.buf):
            self.pos = len(self.buf)  # a quote left waiting at the end
        if self.state in (START, LIST) and self.out.ncalls == 0:
            self.out.text(self.raw)  # never a call: the output is text
        self.buf = self.raw = ""

    def _run(self, final: bool) -> None:
        if self.state == START:
            if self.llama4 and self.buf.startswith(PYTHON_START):
                self.buf = self.buf[len(PYTHON_START):]
            elif self.llama4 and PYTHON_START.startswith(self.buf) and not final:
                return
            if not self.buf:
                return
            if not self.buf.startswith("["):
                self.state = TEXT
                self.out.text(self.raw)
                self.raw = self.buf = ""
                return
            self.buf = self.buf[1:]
            self.state = LIST
        if self.state == LIST:
            self._calls()

    def _calls(self) -> None:
        """Read each call of the list once its text is complete."""
        buf = self.buf
        i = self.pos
        while i < len(buf):
            c = buf[i]
            quote = self.quote
            if quote is not None:
                if c == "\\":
                    i += 2
                    continue
                if len(quote) == 3 and len(buf) - i < 3 and quote.startswith(buf[i:]):
                    break  # may be the closing quotes: wait for more
                if buf.startswith(quote, i):
                    i += len(quote)
                    self.quote = None
                    continue
                i += 1
                continue
            if c in "'\"" and len(buf) - i < 3 and (c * 3).startswith(buf[i:]):
                break  # may still open a triple-quoted string: wait for more
            q = next((q for q in _QUOTES if buf.startswith(q, i)), None)
            if q is not None:
                self.quote = q
                i += len(q)
                continue
            if c in "([{":
                self.depth += 1
            elif c in ")}]" and self.depth > 0:
                self.depth -= 1
                if self.depth == 0 and c == ")":
                    if not self._call(buf[:i + 1]):
                        return
                    buf = self.buf
                    i = 0
                    continue
            elif c == "]" and self.depth == 0:
                if self.out.ncalls == 0:  # a list of no calls is text
                    self.state = TEXT
                    self.out.text(self.raw)
                    self.raw = self.buf = ""
                    return
                self.state = AFTER  # the list ends: what follows is no content
                self.buf = ""
                return
            elif c == "," and self.depth == 0:
                buf = self.buf = buf[i + 1:]
                i = 0
                continue
            i += 1
        self.pos = i

    def _call(self, text: str) -> bool:
        """A call's complete text; False when it is not one."""
        try:
            name, args = parse_call(text.replace(PYTHON_END, ""), self.out.ncalls == 0)
        except NotACall:
            if self.out.ncalls == 0:
                self.state = TEXT  # vLLM: the whole output is content
                self.out.text(self.raw)
                self.raw = self.buf = ""
            else:
                self.state = AFTER
            return False
        index = self.out.call(name)
        self.out.region = True
        self.out.args(index, args)
        self.buf = self.buf[len(text):]
        self.pos = 0
        return True


def pythonic(out: Out, tools: Sequence[dict[str, Any]]) -> PythonicCalls:
    return PythonicCalls(out, False)


def llama4_pythonic(out: Out, tools: Sequence[dict[str, Any]]) -> PythonicCalls:
    return PythonicCalls(out, True)

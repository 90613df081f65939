"""An incremental lexical scan of one JSON value: where it ends, whether it is valid so far.

Parsers forward a tool call's argument bytes exactly as the model wrote them (never parsed and
re-serialized, so no ``\\uXXXX`` escaping and nothing said twice); this scan tells them how far
those bytes are known to be a valid JSON prefix, where the value ends, and the keys and value
spans of a top-level object (``{"name": ..., "arguments": ...}``). The grammar is Python's
``json.loads`` (whitespace `` \\t\\n\\r``, ``NaN`` and ``Infinity`` allowed, control characters
inside strings refused), because vLLM's non-streaming parsers decide validity with it.

The scan works on a caller's growing buffer: ``feed(buf, pos)`` consumes the complete tokens of
``buf[pos:]`` (a regex per token, not a loop per character) and returns where it stopped; a token
cut by the end of the buffer waits for more text (``final=True`` says no more will come).
"""

from __future__ import annotations

import json
import re

_TOKEN = re.compile(
    r"""(?P<ws>[ \t\n\r]+)
    |(?P<punct>[{}\[\],:])
    |(?P<str>"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*")
    |(?P<num>-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)(?![0-9A-Za-z.+\-])
    |(?P<lit>true|false|null|NaN|Infinity|-Infinity)(?![0-9A-Za-z])
    """,
    re.X,
)
# An escape cut short by the end of the buffer.
_OPEN_ESC = re.compile(r"\\(?:u[0-9a-fA-F]{0,3})?\Z")
# A string's body: whole characters and escapes (the scan resumes an open string after them).
_STR_BODY = re.compile(r'(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*')
_SCALAR_START = re.compile(r"[-0-9tfnNI]")
_LITERALS = ("true", "false", "null", "NaN", "Infinity", "-Infinity")

# What the scan expects next.
VALUE, KEY_OR_CLOSE, KEY, COLON, NEXT, VALUE_OR_CLOSE = range(6)


class Field:
    """One key of a watched object and where its value lies in the buffer."""

    __slots__ = ("key", "element", "start", "end", "text")

    def __init__(self, key: str, element: int) -> None:
        self.key = key
        self.element = element  # which object at the watched depth (0 for a top-level object)
        self.start: int | None = None  # the value's first character
        self.end: int | None = None  # just past its last character, once complete
        self.text: str | None = None  # a string value, decoded


class JsonScan:
    """One JSON value, scanned as its text arrives.

    ``done``: the value is complete (``end`` is just past it); ``error``: the text is not a
    JSON prefix (``pos`` is where it went wrong). ``fields`` lists the keys of the objects at
    ``depth`` (1: the value itself; 2: the elements of a top-level array) in order, and
    ``elements`` counts the objects opened there. ``open_end`` is how far the buffer is a valid
    prefix including a string still open at its end, for forwarding bytes as they come.
    """

    __slots__ = ("pos", "open_end", "done", "error", "end", "fields", "elements", "root", "_at",
                 "_stack", "_expect", "_open_at", "_resume")

    def __init__(self, depth: int = 1) -> None:
        self._at = depth
        self.root: str | None = None  # "{" or "[" once the value is known to be a container
        self.elements = 0
        self.pos = 0
        self.open_end = 0
        self.done = False
        self.error = False
        self.end: int | None = None
        self.fields: list[Field] = []
        self._stack: list[str] = []
        self._expect = VALUE
        # A string left open at the buffer's end: where it starts and how far its body is
        # scanned, so a long string value costs each token only its new text.
        self._open_at = -1
        self._resume = 0

    @property
    def depth(self) -> int:
        return len(self._stack)

    def feed(self, buf: str, pos: int, final: bool = False) -> int:
        """Scan ``buf`` from ``pos`` until the value ends, an error, or a token cut short."""
        match = _TOKEN.match
        n = len(buf)
        stack = self._stack
        while pos < n and not self.done and not self.error:
            if buf[pos] == '"':
                body = self._resume if self._open_at == pos and self._resume <= n else pos + 1
                j = _STR_BODY.match(buf, body).end()  # type: ignore[union-attr]
                if j == n or buf[j] != '"':
                    if final or (j < n and _OPEN_ESC.match(buf, j) is None):
                        self.error = True
                    else:
                        self._open_at, self._resume = pos, j
                    break
                kind: str | None = "str"
                end = j + 1
            else:
                m = match(buf, pos)
                kind = m.lastgroup if m is not None else None
                if m is None or (kind == "num" and m.end() == n and not final):
                    if not self._partial(buf, pos, final):
                        self.error = True
                    break
                end = m.end()
            if kind == "ws":
                pos = end
                continue
            expect = self._expect
            if kind == "punct":
                c = buf[pos]
                if c in "{[":
                    if expect not in (VALUE, VALUE_OR_CLOSE):
                        self.error = True
                        break
                    self._value_start(pos)
                    if not stack:
                        self.root = c
                    stack.append(c)
                    if c == "{" and len(stack) == self._at:
                        self.elements += 1
                    self._expect = KEY_OR_CLOSE if c == "{" else VALUE_OR_CLOSE
                elif c in "}]":
                    want = "{" if c == "}" else "["
                    ok = expect == NEXT or (expect == KEY_OR_CLOSE and want == "{") or (
                        expect == VALUE_OR_CLOSE and want == "[")
                    if not ok or not stack or stack[-1] != want:
                        self.error = True
                        break
                    stack.pop()
                    self._value_end(end, None)
                elif c == ",":
                    if expect != NEXT or not stack:
                        self.error = True
                        break
                    self._expect = KEY if stack[-1] == "{" else VALUE
                else:  # ":"
                    if expect != COLON:
                        self.error = True
                        break
                    self._expect = VALUE
            elif kind == "str" and expect in (KEY_OR_CLOSE, KEY):
                if len(stack) == self._at:
                    self.fields.append(Field(json.loads(buf[pos:end]), self.elements - 1))
                self._expect = COLON
            elif expect in (VALUE, VALUE_OR_CLOSE):
                self._value_start(pos)
                self._value_end(end, buf[pos:end] if kind == "str" else None)
            else:
                self.error = True
                break
            pos = end
        self.pos = pos
        self.open_end = pos
        if not self.done and not self.error and pos < n and self._open_at == pos:
            self.open_end = self._resume
        return pos

    def _partial(self, buf: str, pos: int, final: bool) -> bool:
        """Whether ``buf[pos:]`` (no whole token there) may still become one."""
        if final:
            return False
        rest = buf[pos:]  # a scalar's start: strings are scanned in ``feed``
        if not _SCALAR_START.match(rest):
            return False
        if any(lit.startswith(rest) for lit in _LITERALS):
            return True
        return re.fullmatch(r"-?(?:0|[1-9][0-9]*)?(?:\.[0-9]*)?(?:[eE][+-]?[0-9]*)?", rest) \
            is not None and rest not in ("", ".")

    def _value_start(self, pos: int) -> None:
        if len(self._stack) == self._at and self._stack[-1] == "{" and self.fields:
            self.fields[-1].start = pos

    def _value_end(self, end: int, text: str | None) -> None:
        stack = self._stack
        if not stack:
            self.done = True
            self.end = end
            return
        if len(stack) == self._at and stack[-1] == "{" and self.fields:
            field = self.fields[-1]
            field.end = end
            if text is not None:
                field.text = json.loads(text)
        self._expect = NEXT

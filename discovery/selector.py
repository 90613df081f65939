"""Kubernetes label selectors (``app=vllm,tier in (a,b),!canary``): parsed once, matched, encoded.

The grammar is the API server's (k8s.io/apimachinery labels.Parse) for label selectors:
comma-separated requirements, each ``key``, ``!key``, ``key=value``, ``key==value``,
``key!=value``, ``key in (v1,v2)`` or ``key notin (v1,v2)``, with optional whitespace. Keys are
``[prefix/]name`` (a DNS subdomain prefix, a name of at most 63 characters of alphanumerics,
``-``, ``_``, ``.``, starting and ending alphanumeric); values are empty or such a name.

One requirement per key (``a!=x,a!=y`` is ``a notin (x,y)``): lightkube takes a selector as a
mapping from key to requirement.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass

NAME = r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?"
PREFIX = r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*"
KEY = re.compile(rf"({PREFIX}/)?{NAME}")
VALUE = re.compile(rf"({NAME})?")
TOKEN = re.compile(r"\s*(!=|==|=|!|\(|\)|,|[^\s!=(),]+)")


class Op(enum.Enum):
    EXISTS = ""
    NOT_EXISTS = "!"
    EQUAL = "="
    NOT_EQUAL = "!="
    IN = "in"
    NOT_IN = "notin"


class SelectorError(ValueError):
    """A selector the API server would refuse; the message points at the offending part."""


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    op: Op
    values: tuple[str, ...] = ()  # sorted, unique; one for = and !=, none for (not) exists

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        if self.op is Op.EXISTS:
            return value is not None
        if self.op is Op.NOT_EXISTS:
            return value is None
        if self.op in (Op.EQUAL, Op.IN):
            return value is not None and value in self.values
        return value is None or value not in self.values  # != and notin match a missing key

    def encode(self) -> str:
        if self.op in (Op.EXISTS, Op.NOT_EXISTS):
            return f"{self.op.value}{self.key}"
        if self.op in (Op.EQUAL, Op.NOT_EQUAL):
            return f"{self.key}{self.op.value}{self.values[0]}"
        return f"{self.key} {self.op.value} ({','.join(self.values)})"


@dataclass(frozen=True, slots=True)
class Selector:
    requirements: tuple[Requirement, ...] = ()  # all must hold; none: every object

    @classmethod
    def parse(cls, text: str) -> Selector:
        requirements = _Parser(text).requirements()
        keys = [r.key for r in requirements]
        repeated = sorted({k for k in keys if keys.count(k) > 1})
        if repeated:
            raise SelectorError(f"label selector {text!r}: one requirement per key (repeated: "
                                f"{', '.join(repeated)}); use in/notin for several values")
        return cls(tuple(requirements))

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)

    def encode(self) -> str:
        """The selector as the API server's ``labelSelector`` parameter takes it."""
        return ",".join(r.encode() for r in self.requirements)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = [m.group(1) for m in TOKEN.finditer(text)]
        if "".join(self.tokens) != re.sub(r"\s+", "", text):
            raise SelectorError(f"label selector {text!r}: unexpected characters")
        self.pos = 0

    def _next(self) -> str | None:
        token = self.tokens[self.pos] if self.pos < len(self.tokens) else None
        self.pos += 1
        return token

    def _peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def _fail(self, what: str) -> SelectorError:
        return SelectorError(f"label selector {self.text!r}: {what}")

    def requirements(self) -> list[Requirement]:
        out: list[Requirement] = []
        if not self.tokens:
            return out
        while True:
            out.append(self._requirement())
            token = self._next()
            if token is None:
                return out
            if token != ",":
                raise self._fail(f"expected ',' before {token!r}")

    def _key(self, token: str | None) -> str:
        if token is None or not KEY.fullmatch(token) or len(token.split("/")[0]) > 253:
            raise self._fail(f"invalid key {token!r}")
        return token

    def _value(self, token: str | None) -> str:
        if token is None or token in {",", "(", ")", "=", "==", "!=", "!"} \
                or not VALUE.fullmatch(token):
            raise self._fail(f"invalid value {token!r}")
        return token

    def _requirement(self) -> Requirement:
        token = self._next()
        if token == "!":
            return Requirement(self._key(self._next()), Op.NOT_EXISTS)
        key = self._key(token)
        op = self._peek()
        if op is None or op == ",":
            return Requirement(key, Op.EXISTS)
        self.pos += 1
        if op in ("=", "=="):
            return Requirement(key, Op.EQUAL, (self._value_or_empty(),))
        if op == "!=":
            return Requirement(key, Op.NOT_EQUAL, (self._value_or_empty(),))
        if op in ("in", "notin"):
            return Requirement(key, Op.IN if op == "in" else Op.NOT_IN, self._set())
        raise self._fail(f"expected an operator after {key!r}, got {op!r}")

    def _value_or_empty(self) -> str:
        # ``key=`` (an empty value) is valid: the label is present and empty.
        nxt = self._peek()
        if nxt is None or nxt == ",":
            return ""
        self.pos += 1
        return self._value(nxt)

    def _set(self) -> tuple[str, ...]:
        """``(v1, v2)``: one or more values (stricter than the API server, which also takes an
        empty member)."""
        if self._next() != "(":
            raise self._fail("expected '(' after in/notin")
        values = {self._value(self._next())}
        while True:
            token = self._next()
            if token == ")":
                return tuple(sorted(values))
            if token != ",":
                raise self._fail(f"expected ',' or ')' in a value set, got {token!r}")
            values.add(self._value(self._next()))

"""Whether a chat template reads message content as a string or as OpenAI parts (vLLM's rule).

vLLM 0.32 (``renderers/hf.py``) walks the template's Jinja AST: if some loop iterates over a
message's ``content`` (directly, through a variable assigned from it, or through a macro parameter
bound to it), the template gets content as a list of ``{"type": "text", "text": ...}`` parts
("openai"); otherwise text parts are joined with "\\n" into one string ("string"). We apply the
same rule so the template sees what it sees under vLLM.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Literal

import jinja2
import jinja2.nodes as n

ContentFormat = Literal["string", "openai"]


def _is_name(node: n.Node, name: str) -> bool:
    return isinstance(node, n.Name) and node.ctx == "load" and node.name == name


def _is_key(node: n.Node, name: str, key: str) -> bool:
    if isinstance(node, n.Getitem):
        return _is_name(node.node, name) and isinstance(node.arg, n.Const) and node.arg.value == key
    if isinstance(node, n.Getattr):
        return _is_name(node.node, name) and node.attr == key
    return False


def _reads(node: n.Node, name: str, key: str | None = None) -> bool:
    """`name` (or `name.key`), possibly filtered, tested or sliced."""
    if isinstance(node, n.Filter):
        return node.node is not None and _reads(node.node, name, key)
    if isinstance(node, n.Test):
        return _reads(node.node, name, key)
    if isinstance(node, n.Getitem) and isinstance(node.arg, n.Slice):
        return _reads(node.node, name, key)
    return _is_key(node, name, key) if key else _is_name(node, name)


def _aliases(root: n.Template, name: str) -> Iterator[str]:
    """`name` and every variable assigned (transitively) from it or a slice of it."""
    yield name
    queue = deque([name])
    while queue:
        current = queue.popleft()
        for assign in root.find_all(n.Assign):
            if _reads(assign.node, current) and isinstance(assign.target, n.Name):
                yield assign.target.name
                if assign.target.name != current:
                    queue.append(assign.target.name)


def _message_vars(root: n.Template) -> list[str]:
    names = list(_aliases(root, "messages"))
    out = []
    for loop in root.find_all(n.For):
        for name in names:
            if _reads(loop.iter, name) and isinstance(loop.target, n.Name):
                out.append(loop.target.name)
                break
    return out


def _iterates_content(root: n.Template) -> bool:
    msg_vars = _message_vars(root)
    # Macro parameters bound to `message.content` at some call site.
    params_by_loop: dict[int, set[str]] = {}
    loops_in_macros: set[int] = set()
    for macro in root.find_all(n.Macro):
        arg_names = {a.name for a in macro.args}
        bound: set[str] = set()
        for call in root.find_all(n.Call):
            if not (isinstance(call.node, n.Name) and call.node.name == macro.name):
                continue
            for i, arg in enumerate(call.args):
                if i < len(macro.args) and any(_reads(arg, v, "content") for v in msg_vars):
                    bound.add(macro.args[i].name)
            for kw in call.kwargs:
                if kw.key in arg_names and any(_reads(kw.value, v, "content") for v in msg_vars):
                    bound.add(kw.key)
        for loop in macro.find_all(n.For):
            loops_in_macros.add(id(loop))
            if bound:
                params_by_loop[id(loop)] = bound
    for loop in root.find_all(n.For):
        if any(_reads(loop.iter, v, "content") for v in msg_vars):
            return True
        bound_here = params_by_loop.get(id(loop))
        if isinstance(loop.iter, n.Name):
            if bound_here is not None and loop.iter.name in bound_here:
                return True
            if id(loop) not in loops_in_macros and loop.iter.name == "content":
                return True
    return False


def detect_content_format(env: jinja2.Environment, source: str) -> ContentFormat:
    """ "openai" if the template loops over message content, else "string" (vLLM's default)."""
    try:
        root = env.parse(source)
    except jinja2.TemplateError:
        return "string"
    return "openai" if _iterates_content(root) else "string"

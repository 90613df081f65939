"""Chat templates: a sandboxed Jinja environment mirroring transformers', compiled once per source.

transformers 5 renders with ``ImmutableSandboxedEnvironment(trim_blocks=True,
lstrip_blocks=True)``, the ``loopcontrols`` extension and a ``{% generation %}`` tag, its own
``tojson`` (no HTML escaping, ``ensure_ascii=False``), ``raise_exception``, ``strftime_now``, a
restricted ``dict`` and a namespace refusing underscore names. It passes the tokenizer's special
tokens as variables, drops ``None`` message keys, aliases reasoning fields, and implements
``continue_final_message`` by tagging the last message and cutting the rendered text at the tag. We
do the same so the text, and so the token ids, are identical.
"""

from __future__ import annotations

import json
import types
from collections import OrderedDict
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.runtime
import jinja2.utils
from jinja2 import meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

from render.content_format import ContentFormat, detect_content_format
from render.errors import BadRequestError

_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_DICT_ATTRS = frozenset(dir(dict))
_PLAIN_STR_METHODS = frozenset(
    a for a in dir(str) if not a.startswith("_") and a not in ("format", "format_map")
)


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` renders its body (no assistant masks needed)."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        node = jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body)
        return node.set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return str(caller())


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _TemplateDict:
    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    """A namespace that refuses underscore-prefixed names (CPython internals), as transformers'."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"Chat templates cannot store underscore-prefixed attributes on a namespace, "
                f"but got {name!r}. Please rename the attribute."
            )


_PLAIN_HOLDERS = (jinja2.runtime.LoopContext, _Namespace)
_METHOD_TYPES = (types.MethodType, types.BuiltinMethodType)


class _Sandbox(ImmutableSandboxedEnvironment):
    """transformers' sandbox, with its attribute verdicts memoised.

    Jinja's verdict for ``obj.attr`` depends only on ``type(obj)`` and ``attr`` (internal
    attributes of functions/types/frames, mutating methods of lists/dicts/sets), so caching it
    by that pair changes nothing but the cost (the check runs on every attribute access of a
    render).
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._verdicts: dict[tuple[type, str], bool] = {}

    def getattr(self, obj: Any, attribute: str) -> Any:
        # ``message.role`` on a plain dict: Jinja tries getattr first, which raises (and builds)
        # an AttributeError for every name that is not a dict method, then falls back to
        # ``obj[attribute]``. A dict has no instance attributes, so asking the key first for
        # such names returns exactly what Jinja would, without the exception.
        if type(obj) is dict and attribute not in _DICT_ATTRS:
            try:
                return obj[attribute]
            except KeyError:
                return self.undefined(obj=obj, name=attribute)
        # ``content.startswith`` etc.: the sandbox allows every public str method and wraps only
        # format/format_map, so for the others its verdict is always the plain bound method.
        if type(obj) is str and attribute in _PLAIN_STR_METHODS:
            return getattr(obj, attribute)
        # ``loop.index0``, ``ns.last_query_index``: the sandbox's verdict on a public attribute of
        # these two types is always "safe", and it rewrites only bound ``str.format`` methods; for
        # any other value it returns the value itself.
        if type(obj) in _PLAIN_HOLDERS and attribute[:1] != "_":
            try:
                value = getattr(obj, attribute)
            except AttributeError:
                return super().getattr(obj, attribute)
            if type(value) not in _METHOD_TYPES:
                return value
        return super().getattr(obj, attribute)

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        key = (type(obj), attr)
        verdict = self._verdicts.get(key)
        if verdict is None:
            verdict = self._verdicts[key] = super().is_safe_attribute(obj, attr, value)
        return verdict


def make_environment() -> ImmutableSandboxedEnvironment:
    env = _Sandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _Namespace
    return env


def _alias_reasoning(message: dict[str, Any]) -> dict[str, Any]:
    for field in _REASONING_FIELDS:
        reasoning = message.get(field)
        if reasoning is not None:
            return {"thinking": reasoning, **message, "reasoning_content": reasoning}
    return message


def _template_message(message: dict[str, Any]) -> dict[str, Any]:
    """A message as transformers hands it to the template: None keys dropped, reasoning aliased.
    Without None values the message itself (the template cannot change it; no copy per turn)."""
    if None in message.values():
        message = {k: v for k, v in message.items() if v is not None}
    return _alias_reasoning(message)


class ChatTemplate:
    """One compiled chat template, with what vLLM derives from its source."""

    def __init__(self, source: str, env: ImmutableSandboxedEnvironment) -> None:
        self.source = source
        try:
            self._template = env.from_string(source)
            self.variables = frozenset(meta.find_undeclared_variables(env.parse(source)))
        except jinja2.TemplateSyntaxError as e:
            raise BadRequestError(f"Invalid chat template: {e}", "chat_template") from e
        self.content_format: ContentFormat = detect_content_format(env, source)
        self.supports_developer = '"developer"' in source or "'developer'" in source

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None,
        documents: list[dict[str, str]] | None,
        add_generation_prompt: bool,
        continue_final_message: bool,
        variables: Mapping[str, Any],
    ) -> str:
        """The prompt text, exactly as transformers' ``apply_chat_template(tokenize=False)``."""
        chat = list(map(_template_message, messages))
        final: str | None = None
        if continue_final_message:
            final = self._tag_final(chat)
        try:
            text = self._template.render(
                messages=chat,
                tools=tools,
                documents=documents,
                add_generation_prompt=add_generation_prompt,
                **variables,
            )
        except jinja2.TemplateError as e:
            # The template's own refusal (raise_exception) is the client's problem: report it.
            raise BadRequestError(str(e)) from e
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
            raise BadRequestError(f"The chat template failed on this request: {e}") from e
        if final is None:
            return text
        tag = _CONTINUE_TAG.strip()
        if final.strip() not in text or tag not in text:
            raise BadRequestError(
                "continue_final_message is set but the final message does not appear in the "
                "chat after applying the chat template."
            )
        loc = text.rindex(tag)
        if text[loc : loc + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
            return text[:loc]
        return text[:loc].rstrip()

    def _tag_final(self, chat: list[dict[str, Any]]) -> str:
        last = chat[-1] = dict(chat[-1])
        final = last.get("content")
        if final is None:
            raise BadRequestError(
                'continue_final_message is set but the final message has no "content" to continue!'
            )
        if "content" not in self.source:
            raise BadRequestError(
                'continue_final_message is set to "content" but this is not an accepted field '
                "in the chat_template"
            )
        if isinstance(final, list):
            parts = last["content"] = [dict(p) if isinstance(p, dict) else p for p in final]
            for part in reversed(parts):
                if isinstance(part, dict) and "text" in part:
                    final = part["text"]
                    part["text"] = part["text"] + _CONTINUE_TAG
                    break
            else:
                raise BadRequestError(
                    "continue_final_message is set but we could not find any text to continue "
                    "in the final message!"
                )
            assert isinstance(final, str)
            return final
        last["content"] = str(final) + _CONTINUE_TAG
        return str(final)


class TemplateCache:
    """Compiled templates by source, bounded (requests may bring their own)."""

    def __init__(self, max_entries: int = 32) -> None:
        self._env = make_environment()
        self._max = max_entries
        self._compiled: OrderedDict[str, ChatTemplate] = OrderedDict()

    def __contains__(self, source: object) -> bool:
        return source in self._compiled

    def get(self, source: str) -> ChatTemplate:
        hit = self._compiled.get(source)
        if hit is not None:
            self._compiled.move_to_end(source)
            return hit
        compiled = ChatTemplate(source, self._env)
        self._compiled[source] = compiled
        if len(self._compiled) > self._max:
            self._compiled.popitem(last=False)
        return compiled

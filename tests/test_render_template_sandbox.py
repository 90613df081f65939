"""render's sandbox shortcuts answer exactly what transformers' stock sandbox answers."""

from __future__ import annotations

from typing import Any

import jinja2
import jinja2.ext
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jinja2.sandbox import ImmutableSandboxedEnvironment

from render.template import make_environment

# Attribute access on dicts, strings, loop contexts and namespaces (the shortcut paths), and on
# what they must leave to the sandbox: methods, underscore names, mutating calls, str.format.
SNIPPETS = [
    "{% for m in messages %}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}"
    "{{ loop.revindex }}{{ loop.previtem }}|{{ m.role }}:{{ m.content }}{% endfor %}",
    "{% for m in messages %}{{ loop.cycle('a', 'b') }}{{ loop.nosuch is defined }}"
    "{{ loop._after is defined }}{% endfor %}",
    "{% set ns = namespace(n=0, last=-1, f='x{}y'.format) %}{% for m in messages[::-1] %}"
    "{% if ns.n == 0 and m.role == 'user' %}{% set ns.n = 1 %}{% set ns.last = loop.index0 %}"
    "{% endif %}{% endfor %}{{ ns.n }}/{{ ns.last }}/{{ ns.missing is defined }}/{{ ns.f(3) }}",
    "{% set ns = namespace(a=1) %}{{ ns.__class__ is defined }}{{ ns.items is defined }}",
    "{% for m in messages %}{{ m.content.startswith('a') }}{{ m.content.split(' ')[0] }}"
    "{{ m.get('name', '-') }}{{ m.items() | list | length }}{{ m.nosuch is defined }}{% endfor %}",
    "{{ messages[0].content.format(1) if messages else '' }}",
    "{{ messages.pop() }}",
    "{{ messages[0].update({'role': 'x'}) if messages else messages.append(1) }}",
]

_messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant", "tool"]),
         "content": st.text(alphabet="ab {}<>|x", max_size=12)},
        optional={"name": st.text(alphabet="nm", max_size=3)},
    ),
    max_size=5,
)


def stock_environment() -> ImmutableSandboxedEnvironment:
    return ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )


def outcome(env: jinja2.Environment, source: str, messages: list[dict[str, Any]]) -> tuple[
        str, str]:
    try:
        return "ok", env.from_string(source).render(messages=messages)
    except Exception as e:  # the error class is the contract (SecurityError, UndefinedError ...)
        return "error", type(e).__name__


@pytest.mark.parametrize("source", SNIPPETS)
@settings(max_examples=60, deadline=None)
@given(messages=_messages)
def test_shortcuts_render_what_the_stock_sandbox_renders(
    source: str, messages: list[dict[str, Any]]
) -> None:
    ours, stock = make_environment(), stock_environment()
    # Each render gets its own copy: a refused mutation must not leak into the other's input.
    assert outcome(ours, source, [dict(m) for m in messages]) == outcome(
        stock, source, [dict(m) for m in messages]
    )


def test_the_refusals_are_the_sandbox_s() -> None:
    env = make_environment()
    for source in ("{{ messages.pop() }}", "{% set ns = namespace(a=1) %}{{ ns.__class__() }}"):
        with pytest.raises(jinja2.exceptions.SecurityError):
            env.from_string(source).render(messages=[{"role": "user", "content": "x"}])


def test_messages_reach_the_template_as_transformers_hands_them() -> None:
    """None keys are dropped (``is defined`` is false, not ``is none``), reasoning is aliased to
    ``thinking`` and ``reasoning_content``, and the caller's messages are left unchanged."""
    from render.template import ChatTemplate

    source = ("{% for m in messages %}{{ m.role }}:{{ m.content is defined }}"
              "{{ m.tools is defined }}:{{ m.thinking | default('-') }}"
              "{{ m.reasoning_content | default('-') }};{% endfor %}")
    template = ChatTemplate(source, make_environment())
    messages: list[dict[str, Any]] = [
        {"role": "developer", "content": "d", "tools": None},
        {"role": "assistant", "content": None, "reasoning": "r"},
        {"role": "assistant", "content": "a", "thinking": "t"},
        {"role": "user", "content": "u"},
    ]
    before = [dict(m) for m in messages]
    text = template.render(messages, tools=None, documents=None, add_generation_prompt=False,
                           continue_final_message=False, variables={})
    assert text == ("developer:TrueFalse:--;assistant:FalseFalse:rr;"
                    "assistant:TrueFalse:tt;user:TrueFalse:--;")
    assert messages == before

"""Parsers by vLLM's names (``--tool-call-parser``, ``--reasoning-parser``), ``auto`` by model.

``ModelParsers`` is built once per served model from the operator's flags: it resolves the
names (``auto`` picks from the model's chat template and ``model_type`` where that is
unambiguous), knows which special tokens carry the parsers' markers, and per request builds the
per-choice parsers the output pipeline runs (``RequestParsers``). As in vLLM, a tool-call parser
only runs with ``--enable-auto-tool-choice``; ``tool_choice`` ``none`` leaves calls as text, a
named function or ``required`` is read as the JSON the constraint produced (render/tool_choice.py)
when the family's calls are JSON, else by the family's parser.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec
from tokenizers import Tokenizer

from output.parsers.base import Plain, Stage
from output.parsers.chat import ChatParser
from output.parsers.emit import Out, kimi_call_id, random_call_id
from output.parsers.forced import Named, Required
from output.parsers.harmony import MARKERS as HARMONY_MARKERS
from output.parsers.harmony import Harmony
from output.parsers.hermes import hermes
from output.parsers.llama_calls import llama3_json
from output.parsers.marked_calls import deepseek_v3, deepseek_v31, kimi_k2
from output.parsers.mistral_calls import mistral, mistral_call_id
from output.parsers.pythonic import llama4_pythonic, pythonic
from output.parsers.reasoning import (
    DEEPSEEK_R1,
    DEEPSEEK_V3,
    GLM45,
    KIMI_K2,
    MISTRAL,
    QWEN3,
    ThinkFormat,
    Thinking,
)
from output.parsers.xml_calls import glm, qwen3_xml
from render.protocol import ChatCompletionRequest, NamedToolChoice
from render.tool_choice import effective

# How much of the prompt's end decides where reasoning starts (its last turn's markers).
PROMPT_TAIL_TOKENS = 64

Tools = Sequence[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class ToolFamily:
    name: str
    build: Callable[[Out, Tools], Stage]
    markers: tuple[str, ...]  # texts the parser must see, special tokens or not
    forced_json: bool = True  # vLLM's supports_required_and_named
    call_id: Callable[[str, int], str] = random_call_id
    # vLLM's engine-based parsers: empty content is None, and with no tools or tool_choice
    # "none" the calls' markup is still taken out of the content (the calls are not made)...
    engine: bool = False
    # ... except Mistral's under tool_choice "none" with tools, which leaves it as content.
    none_keeps_markup: bool = False


def _hermes(out: Out, tools: Tools) -> Stage:
    return hermes(out)


_HERMES = ToolFamily("hermes", _hermes, ("<tool_call>", "</tool_call>"))
_QWEN3_XML = ToolFamily("qwen3_coder", qwen3_xml, ("<tool_call>", "</tool_call>"), engine=True)
# vLLM reads GLM's forced calls with its own parser (supports_required_and_named = False).
_GLM = ToolFamily("glm47", glm, ("<tool_call>", "</tool_call>"), forced_json=False,
                  engine=True)

_DEEPSEEK_V3 = ToolFamily("deepseek_v3", deepseek_v3, (
    "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>",
    "<｜tool▁call▁end｜>"))
_DEEPSEEK_V31 = ToolFamily("deepseek_v31", deepseek_v31, _DEEPSEEK_V3.markers)
_KIMI_K2 = ToolFamily("kimi_k2", kimi_k2, (
    "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>", "<|tool_call_end|>"), call_id=kimi_call_id, engine=True)

_LLAMA = ToolFamily("llama3_json", llama3_json, ("<|python_tag|>",))
# gpt-oss: Harmony messages carry reasoning and calls alike (output/parsers/harmony.py); vLLM
# reads forced calls with it too.
_OPENAI = ToolFamily("openai", lambda out, tools: Plain(out), HARMONY_MARKERS,
                     forced_json=False)

_MISTRAL = ToolFamily("mistral", lambda out, tools: mistral(out, False), ("[TOOL_CALLS]", "[ARGS]"),
                      forced_json=False, call_id=mistral_call_id, engine=True,
                      none_keeps_markup=True)

_PYTHONIC = ToolFamily("pythonic", pythonic, ())
_LLAMA4_PYTHONIC = ToolFamily("llama4_pythonic", llama4_pythonic,
                              ("<|python_start|>", "<|python_end|>"))

TOOL_PARSERS: dict[str, ToolFamily] = {
    "hermes": _HERMES,
    "qwen3_json": _HERMES,
    "qwen3_coder": _QWEN3_XML,
    "qwen3_xml": _QWEN3_XML,
    "glm45": _GLM,
    "glm47": _GLM,
    "deepseek_v3": _DEEPSEEK_V3,
    "deepseek_v31": _DEEPSEEK_V31,
    "kimi_k2": _KIMI_K2,
    "llama3_json": _LLAMA,
    "llama4_json": _LLAMA,
    "openai": _OPENAI,
    "mistral": _MISTRAL,
    "pythonic": _PYTHONIC,
    "llama4_pythonic": _LLAMA4_PYTHONIC,
}
REASONING_PARSERS: dict[str, ThinkFormat] = {
    "qwen3": QWEN3,
    "deepseek_r1": DEEPSEEK_R1,
    "glm45": GLM45,
    "glm47": GLM45,
    "kimi_k2": KIMI_K2,
    "deepseek_v3": DEEPSEEK_V3,
    "openai_gptoss": ThinkFormat("openai_gptoss"),  # read by the Harmony stage
    "mistral": MISTRAL,
}


class ParserConfigError(ValueError):
    """An unknown parser name or an ``auto`` that cannot tell; the message lists the names."""


def check_names(tool_parser: str | None, reasoning_parser: str | None) -> None:
    """Refuse unknown parser names when the configuration is read (``auto`` resolves later)."""
    for name, table, flag in ((tool_parser, TOOL_PARSERS, "--tool-call-parser"),
                              (reasoning_parser, REASONING_PARSERS, "--reasoning-parser")):
        if name is not None and name != "auto" and name not in table:
            raise ParserConfigError(
                f"{flag} {name!r} is not a known parser; known: auto, {', '.join(sorted(table))}")


def auto_tool_parser(model_type: str, template: str) -> str | None:
    """The tool-call parser a model's chat template implies, if it implies one."""
    if "<arg_key>" in template:
        return "glm47"
    if "<|tool_calls_section_begin|>" in template:
        return "kimi_k2"
    if "<｜tool▁calls▁begin｜>" in template:
        return "deepseek_v3" if "```json" in template else "deepseek_v31"
    if "<function=" in template and "<parameter=" in template:
        return "qwen3_coder"
    if "<tool_call>" in template:
        return "hermes"
    if model_type == "llama" and "<|python_tag|>" in template:
        return "llama3_json"
    if model_type == "gpt_oss":
        return "openai"
    if "[TOOL_CALLS]" in template or model_type in ("mistral", "mistral3"):
        return "mistral"
    return None


def auto_reasoning_parser(model_type: str, template: str) -> str | None:
    if "<think>" in template and model_type.startswith("qwen3"):
        return "qwen3"
    if "<think>" in template and model_type.startswith("deepseek"):
        return "deepseek_r1"
    if "<think>" in template and model_type.startswith("glm"):
        return "glm45"
    if "<think>" in template and model_type.startswith("kimi"):
        return "kimi_k2"
    if model_type == "gpt_oss":
        return "openai_gptoss"
    return None


def _resolve(name: str | None, table: dict[str, Any], auto: Callable[[str, str], str | None],
             model_type: str, template: str, flag: str) -> str | None:
    if name is None:
        return None
    if name == "auto":
        found = auto(model_type, template)
        if found is None:
            raise ParserConfigError(
                f"{flag} auto: cannot tell the parser of this model (model_type "
                f"{model_type!r}) from its chat template; name one of {sorted(table)}")
        return found
    if name not in table:
        raise ParserConfigError(f"{flag} {name!r} is not a known parser; known: {sorted(table)}")
    return name


@dataclass(frozen=True, slots=True)
class RequestOptions:
    """What one chat request says about its parsing."""

    tools: Tools | None = None
    tool_choice: str | dict[str, Any] | None = "none"  # "none" | "auto" | "required" | named
    include_reasoning: bool = True
    parallel_tool_calls: bool | None = True
    history_calls: int = 0  # tool calls of earlier assistant turns (Kimi's ids count on)


def options_of(req: ChatCompletionRequest) -> RequestOptions:
    """A chat request's parsing options (tool_choice with vLLM's default: auto with tools)."""
    choice = effective(req)
    tool_choice: str | dict[str, Any] | None = (
        {"type": "function", "function": {"name": choice.function.name}}
        if isinstance(choice, NamedToolChoice) else choice)
    tools = [msgspec.to_builtins(t) for t in req.tools] if req.tools else None
    history = sum(len(m.tool_calls) for m in req.messages
                  if m.role == "assistant" and isinstance(m.tool_calls, list))
    return RequestOptions(tools=tools, tool_choice=tool_choice,
                          include_reasoning=req.include_reasoning,
                          parallel_tool_calls=req.parallel_tool_calls, history_calls=history)


class ModelParsers:
    """One served model's parsers, resolved from the operator's flags."""

    def __init__(self, tool_parser: str | None, reasoning_parser: str | None,
                 enable_auto_tools: bool, *, tokenizer: Tokenizer, model_type: str = "",
                 template: str | None = None) -> None:
        template = template or ""
        # gpt-oss always reads Harmony; vLLM gives it the openai_gptoss reasoning parser.
        self.harmony = model_type == "gpt_oss"
        if self.harmony and reasoning_parser is None:
            reasoning_parser = "openai_gptoss"
        tool = _resolve(tool_parser, TOOL_PARSERS, auto_tool_parser, model_type, template,
                        "--tool-call-parser")
        reasoning = _resolve(reasoning_parser, REASONING_PARSERS, auto_reasoning_parser,
                             model_type, template, "--reasoning-parser")
        self.tool_name = tool
        self.reasoning_name = reasoning
        # As vLLM: the tool-call parser exists only with --enable-auto-tool-choice.
        self.tool = TOOL_PARSERS[tool] if tool is not None and enable_auto_tools else None
        self.reasoning = REASONING_PARSERS[reasoning] if reasoning is not None else None
        if (self.tool is not None and self.tool.name == "mistral"
                and tokenizer.token_to_id("[ARGS]") is not None):
            self.tool = replace(self.tool, build=lambda out, tools: mistral(out, True))
        if reasoning == "mistral" and tokenizer.token_to_id("[THINK]") is None:
            self.reasoning = None  # as vLLM: a Mistral tokenizer without [THINK] has none
        self.enable_auto_tools = enable_auto_tools
        self.tokenizer = tokenizer
        markers = set(self.tool.markers if self.tool else ())
        if self.harmony:
            markers.update(HARMONY_MARKERS)
        if self.reasoning is not None:
            markers.update(self.reasoning.markers)
        added = tokenizer.get_added_tokens_decoder()
        self.keep_special = frozenset(i for i, t in added.items()
                                      if t.special and t.content in markers)

    @property
    def active(self) -> bool:
        return self.tool is not None or self.reasoning is not None

    def for_request(self, opts: RequestOptions, prompt_ids: Sequence[int]
                    ) -> RequestParsers | None:
        if not self.active:
            return None
        reasoning = None
        if self.reasoning is not None and not self.harmony:
            tail = self.tokenizer.decode(list(prompt_ids[-PROMPT_TAIL_TOKENS:]),
                                         skip_special_tokens=False)
            starts = self.reasoning.starts_reasoning(tail)
            if starts or not self.reasoning.off_when_closed:
                reasoning = (self.reasoning, starts)
        return RequestParsers(self, opts, reasoning)


@dataclass(slots=True)
class RequestParsers:
    """The pipeline's parser factory for one request: one ``ChatParser`` per choice."""

    model: ModelParsers
    opts: RequestOptions
    reasoning: tuple[ThinkFormat, bool] | None
    failures: list[int] = field(default_factory=lambda: [0])

    @property
    def keep_special(self) -> frozenset[int]:
        return self.model.keep_special

    @property
    def forced(self) -> bool:
        """A named or required tool_choice: the message content is "" when nothing else."""
        choice = self.opts.tool_choice
        return choice == "required" or isinstance(choice, dict)

    @property
    def empty_content(self) -> str | None:
        """The message content when no text was content: vLLM's parsers answer None after a
        reasoning parser (or a call), "" otherwise; a forced call's message has ""."""
        if self.forced:
            return ""
        family = self.model.tool
        return None if self.reasoning is not None or (family and family.engine) else ""

    @property
    def drops_specials(self) -> bool:
        """Whether vLLM's parser here is engine-based, whose text has no special tokens but its
        markers (the derender decodes every token otherwise, as vLLM's does)."""
        family = self.model.tool
        fmt = self.reasoning[0] if self.reasoning is not None else None
        return bool((family is not None and family.engine and self.opts.tools)
                    or (fmt is not None and fmt.engine))

    @property
    def named(self) -> bool:
        """A named tool_choice: its call ends the turn with finish_reason "stop" (OpenAI's)."""
        return isinstance(self.opts.tool_choice, dict)

    @property
    def include_reasoning(self) -> bool:
        return self.opts.include_reasoning

    def __call__(self, index: int) -> ChatParser:
        opts = self.opts
        family = self.model.tool
        mute = family is not None and family.engine and (not opts.tools
                                                          or opts.tool_choice == "none")
        if mute and family is not None and family.none_keeps_markup and opts.tools:
            mute = False  # a plain stage: no calls are read
        out = Out(family.call_id if family else random_call_id, opts.history_calls, mute)
        if self.model.harmony:
            out.mute = family is None or not opts.tools or opts.tool_choice == "none"
            shows = self.model.reasoning_name == "openai_gptoss"
            return ChatParser(out, Harmony(out, shows), include_reasoning=opts.include_reasoning,
                              single_call=opts.parallel_tool_calls is False,
                              on_failure=self._failed, empty_content=None)
        tail: Stage = self._tool_stage(out)
        if self.reasoning is not None:
            fmt, starts = self.reasoning
            tail = Thinking(fmt, out, tail, starts)
        return ChatParser(out, tail, include_reasoning=opts.include_reasoning,
                          single_call=opts.parallel_tool_calls is False,
                          on_failure=self._failed, empty_content=self.empty_content)

    def _tool_stage(self, out: Out) -> Stage:
        opts = self.opts
        family = self.model.tool
        choice = opts.tool_choice
        if family is None:
            return Plain(out)
        if not opts.tools or choice == "none":
            engine = family.engine and not (family.none_keeps_markup and opts.tools)
            return family.build(out, opts.tools or ()) if engine else Plain(out)
        if family.forced_json and isinstance(choice, dict):
            return Named(out, choice["function"]["name"])
        if family.forced_json and choice == "required":
            return Required(out)
        return family.build(out, opts.tools)

    def _failed(self) -> None:
        self.failures[0] += 1

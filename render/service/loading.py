"""What a render process holds: its models, found by served name, and its codecs."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from output.parsers.registry import ModelParsers
from render.errors import ModelNotFoundError
from render.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from render.registry import ModelRegistry
from render.renderer import Renderer
from render.sampling_checks import DEFAULT_LIMITS, RequestLimits
from render.service.config import ModelSpec
from render.service.lora_modules import LoRAModule
from render.structured_config import StructuredOutputsConfig
from render.token_json import json_encoder
from render.tool_choice import ToolCalling


class Codecs:
    """One typed decoder per request type and one encoder, built once per process."""

    def __init__(self) -> None:
        self.chat = msgspec.json.Decoder(ChatCompletionRequest)
        self.completion = msgspec.json.Decoder(CompletionRequest)
        self.tokenize = msgspec.json.Decoder(TokenizeRequest)
        self.detokenize = msgspec.json.Decoder(DetokenizeRequest)
        # Writes token ids held as numpy arrays too (render.token_json), as lists are written.
        self.encoder = json_encoder()


def load_models(specs: Iterable[ModelSpec], *, allow_request_chat_template: bool = False,
                limits: RequestLimits = DEFAULT_LIMITS,
                lora_modules: Iterable[LoRAModule] = (),
                structured_outputs: StructuredOutputsConfig | None = None) -> ModelRegistry:
    """The renderers of ``specs`` (``load_served`` without the parsers)."""
    return load_served(specs, allow_request_chat_template=allow_request_chat_template,
                       limits=limits, lora_modules=lora_modules,
                       structured_outputs=structured_outputs)[0]


def load_served(specs: Iterable[ModelSpec], *, allow_request_chat_template: bool = False,
                limits: RequestLimits = DEFAULT_LIMITS,
                lora_modules: Iterable[LoRAModule] = (),
                structured_outputs: StructuredOutputsConfig | None = None,
                ) -> tuple[ModelRegistry, dict[str, ModelParsers]]:
    """The renderers of ``specs``, in order (the first is the default model), each told the
    server's tool-call flags (``Renderer.tool_calling``), and each model's output parsers by
    served name; each LoRA module's name is an alias of its base model (``base_model_name``
    when that is served, else the first model, as vLLM parents an adapter)."""
    specs = list(specs)
    registry = ModelRegistry([
        Renderer.load(
            spec.model,
            tokenizer=spec.tokenizer,
            chat_template=str(spec.chat_template) if spec.chat_template else None,
            served_model_name=spec.served_model_name,
            max_model_len=spec.max_model_len,
            allow_request_chat_template=allow_request_chat_template,
            limits=limits,
            structured_outputs=structured_outputs,
        )
        for spec in specs
    ])
    parsers = load_parsers(registry, specs)
    served = set(registry.names())
    for module in lora_modules:
        base = module.base_model_name if module.base_model_name in served else None
        registry.add_alias(module.name, base)
    return registry, parsers


def model_parsers(renderer: Renderer, spec: ModelSpec) -> ModelParsers:
    """The model's output parsers from its flags (a bad name raises ParserConfigError); tells
    its renderer which tool_choice the server can honour."""
    parsers = ModelParsers(spec.tool_call_parser, spec.reasoning_parser,
                           spec.enable_auto_tool_choice, tokenizer=renderer.tokenizer,
                           model_type=renderer.files.model_type,
                           template=renderer.files.chat_template(True))
    tool = parsers.tool
    renderer.tool_calling = ToolCalling(
        tool.name if tool is not None else None, spec.enable_auto_tool_choice,
        tool.forced_json if tool is not None else True, renderer.native_tool_calls)
    return parsers


def load_parsers(registry: ModelRegistry, specs: Iterable[ModelSpec]) -> dict[str, ModelParsers]:
    """Every model's parsers by served name."""
    return {r.served_model_name: model_parsers(r, spec)
            for r, spec in zip(registry, specs, strict=True)}


def find_model(registry: ModelRegistry, name: str | None) -> Renderer:
    """The renderer a request names (None: the first); an unknown name is vLLM's 404."""
    try:
        return registry.get(name)
    except ModelNotFoundError:
        raise ModelNotFoundError(str(name), ", ".join(registry.names())) from None

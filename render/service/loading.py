"""What a render process holds: its models, found by served name, and its codecs."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

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
    """The renderers of ``specs``, in order (the first is the default model); each LoRA
    module's name is an alias of its base model (``base_model_name`` when that is served, else
    the first model, as vLLM parents an adapter)."""
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
    served = set(registry.names())
    for module in lora_modules:
        base = module.base_model_name if module.base_model_name in served else None
        registry.add_alias(module.name, base)
    return registry


def find_model(registry: ModelRegistry, name: str | None) -> Renderer:
    """The renderer a request names (None: the first); an unknown name is vLLM's 404."""
    try:
        return registry.get(name)
    except ModelNotFoundError:
        raise ModelNotFoundError(str(name), ", ".join(registry.names())) from None

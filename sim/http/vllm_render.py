"""The CPU a `vllm serve` pod spends rendering a text request, spent by the simulated pod.

The face renders with kvroute's own renderer (the token ids vLLM computes, at a fraction of
vLLM's CPU). A fleet of simulated pods then under-bills every router that makes its engines
render: one that forwards OpenAI text pays one cheap render per request where real pods pay
vLLM's; vllm-router's cache_aware asks EVERY pod's ``/v1/chat/completions/render`` per request.
With ``--render-work vllm`` the face also does the work vLLM's frontend does for such a request:
the chat template rendered into the prompt string, then Hugging Face ``tokenizers``' encode of
all of it (vLLM 0.32's path for HF models: transformers' ``apply_chat_template``, then the fast
tokenizer, which is this Rust tokenizer; the encode is most of the cost). The ids it gets are the
same ids (``tests/test_sim_vllm_render.py``); they are dropped: this is a cost model, like the
step time standing in for the GPU. ``bench/sim_render_cost.py`` sets it beside vLLM's own render
server on bench/compare.py's chats.
"""

from __future__ import annotations

from pathlib import Path

import tokenizers

from render.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
    TokenizeRequest,
)
from render.renderer import Renderer


class VllmRenderWork:
    """vLLM's text-request render work on one model: a tokenizer of its own (no cache shared
    with the renderer's), and the renderer's chat template."""

    def __init__(self, renderer: Renderer, model_dir: Path) -> None:
        self.renderer = renderer
        self.tokenizer = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))

    def chat(self, req: ChatCompletionRequest, rendered: GenerateRequest) -> list[int]:
        """The chat's prompt ids as vLLM computes them: the template's text (the rendered ids
        decoded for the families vLLM renders straight to tokens), then one encode of it."""
        prompt = self.renderer.prompt_text(req, rendered.token_ids)
        ids: list[int] = self.tokenizer.encode(prompt, add_special_tokens=False).ids
        return ids

    def completion(self, req: CompletionRequest) -> list[list[int]]:
        """Each text prompt's ids (token-id prompts cost vLLM no encode)."""
        prompts = req.prompt if isinstance(req.prompt, list) else [req.prompt]
        return [self.tokenizer.encode(p, add_special_tokens=req.add_special_tokens).ids
                for p in prompts if isinstance(p, str)]

    def tokenize(self, req: TokenizeRequest, tokens: list[int]) -> list[int]:
        """``/tokenize``: a chat's prompt (its ids decoded: the template's text, special tokens
        and all) or the prompt string, encoded once, as vLLM's /tokenize renders either."""
        text = (self.renderer.decode(tokens) if req.messages is not None
                else req.prompt if isinstance(req.prompt, str) else None)
        if text is None:
            return []
        ids: list[int] = self.tokenizer.encode(
            text, add_special_tokens=req.messages is None and bool(req.add_special_tokens)).ids
        return ids

"""``Renderer``: one model's OpenAI request -> GenerateRequest (exact token ids + SamplingParams).

Chat goes through the model's family path: Harmony for gpt-oss, mistral-common for tekken models,
otherwise the Jinja chat template after vLLM's message normalisation; the text is tokenized through
the exact piece cache. Synchronous and CPU-bound: callers run it off their event loop.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast, overload

import msgspec
import tokenizers
from msgspec import UNSET

from render.bad_words import bad_words_token_ids
from render.errors import BadRequestError, InputProcessorError, TemplateUnavailableError
from render.fast_tokens import FastTokens
from render.fast_tokens import build as build_fast_tokens
from render.memory import release_freed_heap
from render.messages import normalize_messages, tool_dicts
from render.model_files import ModelFiles, derive_max_model_len, load_model_files
from render.models import EMBEDDED_MODEL
from render.params import (
    build_sampling_params,
    check_context,
    check_prompt_len,
    default_sampling_params,
    max_tokens_for,
)
from render.piece_cache import PieceCache
from render.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    GenerateRequest,
    NamedToolChoice,
    TokenizeRequest,
    TokenizeResponse,
)
from render.request_checks import check_chat, check_completion, refuse
from render.sampling_checks import DEFAULT_LIMITS, RequestLimits, check_engine_input
from render.structured import StructuredOutputs
from render.structured_config import StructuredOutputsConfig
from render.template import ChatTemplate, TemplateCache
from render.token_json import TokenArray, TokenIds, join
from render.tool_choice import ToolCalling, forced_schema
from render.tool_choice import check as check_tool_calling
from wire.sampling import SamplingParams, StructuredOutputsParams

if TYPE_CHECKING:
    from render.harmony import HarmonyRenderer
    from render.mistral import MistralRenderer

# apply_chat_template's own parameters: never passed to the template as variables.
_APPLY_PARAMS = frozenset(
    {
        "conversation",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "sanitize_control_tokens",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
        "messages",
    }
)


class Renderer:
    """Renders requests for one model; thread-compatible but not thread-safe (one per worker)."""

    def __init__(
        self,
        files: ModelFiles,
        *,
        served_model_name: str,
        max_model_len: int,
        allow_request_chat_template: bool,
        cache_bytes: int,
        harmony_start_date: str | None,
        fast_tokenizer: bool = True,
        limits: RequestLimits = DEFAULT_LIMITS,
        structured_outputs: StructuredOutputsConfig | None = None,
    ) -> None:
        self.files = files
        self.limits = limits
        self.served_model_name = served_model_name
        self.max_model_len = max_model_len
        self.allow_request_chat_template = allow_request_chat_template
        self.tokenizer: tokenizers.Tokenizer = files.tokenizer
        # fastokens encodes when it provably equals the HF tokenizer, for the families whose
        # chats it tokenizes. Harmony (gpt-oss) and mistral-common (tekken) encode their chats
        # with their own copy of the vocabulary: a third one (~100 MB) would break the 300 MB
        # budget for the odd completion prompt, which the piece cache serves.
        self.fast: FastTokens | None = None
        own_chat_encoder = files.tekken_path is not None or files.model_type == "gpt_oss"
        if fast_tokenizer and not own_chat_encoder and files.tokenizer_file is not None:
            self.fast = build_fast_tokens(files.tokenizer_file, files.tokenizer, cache_bytes)
        self.pieces = PieceCache(
            files.tokenizer, cache_bytes, files.tokenizer_spec, tiktoken=self.fast is None
        )
        self.templates = TemplateCache()  # compiled chat templates (the model's own, requests')
        self.generation_config = files.generation_config
        self.default_sampling = default_sampling_params(files.generation_config)
        self.eos_token_id = files.eos_token_id
        self.vocab_size = files.vocab_size
        self._harmony: HarmonyRenderer | None = None
        if files.model_type == "gpt_oss":
            from render.harmony import HarmonyRenderer  # openai_harmony only for gpt-oss

            self._harmony = HarmonyRenderer(harmony_start_date)
        self._mistral: MistralRenderer | None = None
        if files.tekken_path is not None:
            from render.mistral import MistralRenderer  # mistral-common only for tekken models

            self._mistral = MistralRenderer(files.tekken_path)
        # vLLM checks grammars for tekken models against their llguidance tokenizer.
        self.structured = StructuredOutputs(
            structured_outputs,
            llg_tokenizer=self._mistral.llg_tokenizer if self._mistral is not None else None)
        self._affixes = self._special_affixes()
        # The server's tool-call flags (render/tool_choice.py); None: a library render that
        # checks tool_choice only against the request itself.
        self.tool_calling: ToolCalling | None = None

    @property
    def native_tool_calls(self) -> bool:
        """Harmony and Mistral tokenizers: vLLM reads their calls whatever the flags."""
        return self._harmony is not None or self._mistral is not None

    @classmethod
    def load(
        cls,
        model_dir: str | Path | None = None,
        *,
        tokenizer: str | Path | None = None,
        chat_template: str | None = None,
        served_model_name: str | None = None,
        max_model_len: int | None = None,
        allow_request_chat_template: bool = False,
        cache_bytes: int = 64 << 20,
        harmony_start_date: str | None = None,
        fast_tokenizer: bool = True,
        limits: RequestLimits = DEFAULT_LIMITS,
        structured_outputs: StructuredOutputsConfig | None = None,
    ) -> Renderer:
        """Load a local HF model directory (default: the embedded Qwen3). ``chat_template`` is
        the template text or a path to a file holding it. ``fast_tokenizer=False`` keeps
        encoding on the piece cache (HF tokenizers / tiktoken) even where fastokens verifies."""
        path = Path(model_dir) if model_dir is not None else EMBEDDED_MODEL
        if chat_template is not None and Path(chat_template).is_file():
            chat_template = Path(chat_template).read_text(encoding="utf-8")
        files = load_model_files(path, tokenizer, chat_template)
        derived = derive_max_model_len(files.config, files.tokenizer_config)
        if max_model_len is not None and max_model_len > derived:
            raise ValueError(
                f"max_model_len {max_model_len} is larger than the model's context length {derived}"
            )
        renderer = cls(
            files,
            served_model_name=served_model_name or str(model_dir or "Qwen/Qwen3-0.6B"),
            max_model_len=max_model_len or derived,
            allow_request_chat_template=allow_request_chat_template,
            cache_bytes=cache_bytes,
            harmony_start_date=harmony_start_date,
            fast_tokenizer=fast_tokenizer,
            limits=limits,
            structured_outputs=structured_outputs,
        )
        # Loading peaks well above what the tokenizers keep: give the difference back.
        release_freed_heap()
        return renderer

    @property
    def eos_token_ids(self) -> list[int]:
        """Every id that ends generation: the tokenizer's EOS and generation_config's."""
        ids = [] if self.eos_token_id is None else [self.eos_token_id]
        gen = self.generation_config.get("eos_token_id")
        ids += [gen] if isinstance(gen, int) else list(gen or [])
        return list(dict.fromkeys(ids))

    # -- tokenization -------------------------------------------------------------------------

    def _special_affixes(self) -> tuple[list[int], list[int]]:
        """What the post-processor adds around one sequence when add_special_tokens=True."""
        probe = "a"
        plain = self.tokenizer.encode(probe, add_special_tokens=False).ids
        full = self.tokenizer.encode(probe, add_special_tokens=True).ids
        for start in range(len(full) - len(plain) + 1):
            if full[start : start + len(plain)] == plain:
                return full[:start], full[start + len(plain) :]
        raise ValueError("post-processor does not keep the sequence contiguous")

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        """Exactly the engine frontend's ``tokenizer.encode(text, add_special_tokens=...)``."""
        if self._mistral is not None:
            return self._mistral.encode(text, add_special_tokens)
        ids = self.fast.encode(text) if self.fast is not None else self.pieces.encode(text)
        if add_special_tokens:
            before, after = self._affixes
            return before + ids + after
        return ids

    def encode_array(self, text: str, add_special_tokens: bool) -> TokenIds:
        """``encode``, as a uint32 array where fastokens encodes (no Python int per token, for a
        JSON answer through render.token_json); elsewhere the same list ``encode`` gives."""
        if self.fast is None or self._mistral is not None:
            return self.encode(text, add_special_tokens)
        ids = self.fast.encode_array(text)
        if add_special_tokens:
            before, after = self._affixes
            return join(before, ids, after)
        return ids

    def warm_up(self) -> None:
        """What a process's first render would pay, paid before serving: the tokenizer's first
        encode in this thread and the compile of the model's own chat templates (~100 ms for
        Qwen3's: the first chat of a fresh router or render server paid it)."""
        self.encode("warm-up: render thread", add_special_tokens=False)
        for source in dict.fromkeys(self.files.chat_templates.values()):
            # One that does not compile is reported to the first chat that needs it, as vLLM does.
            with contextlib.suppress(BadRequestError):
                self.templates.get(source)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    # -- chat ---------------------------------------------------------------------------------

    def _template_for(self, req: ChatCompletionRequest) -> ChatTemplate:
        source = self.files.chat_template(req.tools is not None)
        if req.chat_template is not None:
            if not self.allow_request_chat_template:
                raise TemplateUnavailableError(  # vLLM's words, and no param (as vLLM's)
                    "Chat template is passed with request, but --trust-request-chat-template "
                    "is not set. Refused request with untrusted chat template."
                )
            source = req.chat_template
        if source is None:
            raise TemplateUnavailableError(
                "This model has no chat template: pass one with --chat-template.", "chat_template"
            )
        return self.templates.get(source)

    def chat_prompt(self, req: ChatCompletionRequest) -> str:
        """The templated prompt text (Jinja families only)."""
        template = self._template_for(req)
        kwargs = dict(req.chat_template_kwargs or {})
        for bad in ("chat_template", "tokenize"):
            if bad in kwargs:
                raise BadRequestError(
                    f"Found unexpected chat template kwargs from request: {{'{bad}'}}",
                    "chat_template_kwargs",
                )
        # Request fields win over chat_template_kwargs (vLLM's merge order); None means unset.
        extra: dict[str, Any] = {"reasoning_effort": req.reasoning_effort}
        if req.reasoning_effort is not None and "enable_thinking" not in kwargs:
            extra["enable_thinking"] = req.reasoning_effort != "none"
        kwargs.update({k: v for k, v in extra.items() if v is not None})
        tools = kwargs.pop("tools", tool_dicts(req.tools))
        documents = kwargs.pop("documents", None) if req.documents is None else req.documents
        variables: dict[str, Any] = dict(self.files.special_tokens)
        variables.update(
            {k: v for k, v in kwargs.items() if k in template.variables and k not in _APPLY_PARAMS}
        )
        conversation = normalize_messages(
            req.messages, template.content_format, template.supports_developer
        )
        return template.render(
            conversation,
            tools=tools,
            documents=documents,
            add_generation_prompt=req.add_generation_prompt,
            continue_final_message=req.continue_final_message,
            variables=variables,
        )

    def prompt_text(self, req: ChatCompletionRequest, ids: TokenIds) -> str:
        """The chat's prompt as text (vLLM's ``return_prompt_text``): the template's output, or
        for the families rendered to tokens directly (Harmony, mistral-common) the ids decoded."""
        if self._harmony is None and self._mistral is None:
            return self.chat_prompt(req)
        return self.decode(list(ids))

    def chat_token_ids(self, req: ChatCompletionRequest) -> list[int]:
        """The chat's prompt token ids."""
        return cast(list[int], self._chat_ids(req, array=False))

    def _chat_ids(self, req: ChatCompletionRequest, *, array: bool) -> TokenIds:
        """``chat_token_ids``; ``array``: as a uint32 array where the tokenizer gives one (the
        Jinja families on fastokens), for a JSON answer (render.token_json)."""
        if req.add_generation_prompt and req.continue_final_message:
            raise BadRequestError(
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
            )
        # vLLM renders gpt-oss with Harmony and tekken models with mistral-common whatever
        # chat_template the request carries; so do we.
        ids: TokenIds
        if self._harmony is not None:
            ids = self._harmony.render(req)
        elif self._mistral is not None:
            if req.chat_template is not None:
                self._template_for(req)  # vLLM still refuses an untrusted request template here
            ids = self._mistral.render(req)
        else:
            encode = self.encode_array if array else self.encode
            ids = encode(self.chat_prompt(req), req.add_special_tokens)
        return self._truncate(ids, self._keep(req), req.truncation_side)

    def render_chat(self, req: ChatCompletionRequest, *, array: bool = False) -> GenerateRequest:
        """The GenerateRequest for a chat. ``array``: its token_ids may be a uint32 numpy array,
        for a JSON answer written by ``render.token_json.json_encoder`` (identical bytes); the
        default is a list (the router's in-process use)."""
        check_chat(req)
        if req.use_beam_search:
            raise BadRequestError("Beam search is not supported by the render endpoint")
        _check_tool_choice(req)
        if self.tool_calling is not None:
            req = _with_tool_calling(req, self.tool_calling)
        param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        requested = (
            req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        )
        check_context(self.max_model_len, requested, param, req.truncate_prompt_tokens)
        # Offsets are checked against the ids as a list: an answer with them takes the list.
        ids = self._chat_ids(req, array=array and not req.return_token_offsets)
        if len(ids) == 0:
            raise BadRequestError("No token_ids rendered")
        check_prompt_len(self.max_model_len, len(ids), from_text=True)
        offsets = None
        if req.return_token_offsets and self._harmony is None and self._mistral is None:
            offsets = self._offsets(self.chat_prompt(req), req, cast(list[int], ids))
        return self._generate(
            req, ids, requested, param, f"chatcmpl-{req.request_id or uuid.uuid4().hex}", offsets
        )

    def _offsets(
        self, text: str, req: ChatCompletionRequest | CompletionRequest, ids: list[int]
    ) -> list[tuple[int, int]]:
        """Char (start, end) per token of ``text``, as vLLM's ``return_token_offsets`` gives."""
        enc = self.tokenizer.encode(text, add_special_tokens=req.add_special_tokens)
        offsets = [(int(a), int(b)) for a, b in enc.offsets]
        kept = self._truncate(enc.ids, self._keep(req), req.truncation_side)
        assert kept == ids, "offsets tokenization disagrees with the rendered ids"
        n = len(kept)
        if len(offsets) == n:
            return offsets
        return offsets[:n] if req.truncation_side == "right" else offsets[len(offsets) - n :]

    # -- completions --------------------------------------------------------------------------

    def completion_token_ids(self, req: CompletionRequest) -> list[list[int]]:
        prompt = req.prompt
        if prompt is None or prompt == "":
            # vLLM's CompletionRequest validator, before tokenizing: a BOS-adding tokenizer
            # (Gemma 3) would otherwise render [BOS].
            raise refuse("Either prompt or prompt_embeds must be provided and non-empty.",
                         "prompt")
        if isinstance(prompt, str):
            prompts: list[str | list[int]] = [prompt]
        elif all(isinstance(p, int) for p in prompt):
            prompts = [[p for p in prompt if isinstance(p, int)]]
        elif all(isinstance(p, str) for p in prompt):
            prompts = [p for p in prompt if isinstance(p, str)]
        elif all(isinstance(p, list) for p in prompt):
            prompts = [p for p in prompt if isinstance(p, list)]
        else:
            raise BadRequestError(
                "prompt must be a string, a list of strings, a list of token ids or a list of "
                "token-id lists (not a mix)",
                "prompt",
            )
        out = []
        for p in prompts:
            # Token ids are checked against the vocabulary as the engine takes them
            # (render.sampling_checks.check_engine_input), as in vLLM.
            ids = self.encode(p, req.add_special_tokens) if isinstance(p, str) else list(p)
            ids = self._truncate(ids, self._keep(req), req.truncation_side)
            check_prompt_len(self.max_model_len, len(ids), from_text=isinstance(p, str))
            out.append(ids)
        return out

    def render_completion(self, req: CompletionRequest) -> list[GenerateRequest]:
        check_completion(req)
        if req.use_beam_search:
            raise BadRequestError("Beam search is not supported by the render endpoint")
        check_context(self.max_model_len, req.max_tokens or 0, "max_tokens",
                      req.truncate_prompt_tokens)
        all_ids = self.completion_token_ids(req)
        base = f"cmpl-{req.request_id or uuid.uuid4().hex}"
        out = []
        prompt = req.prompt or ""
        texts: list[str | None] = (
            [prompt]
            if isinstance(prompt, str)
            else [p if isinstance(p, str) else None for p in prompt]
        )
        if len(texts) != len(all_ids):  # one prompt of token ids
            texts = [None] * len(all_ids)
        for i, ids in enumerate(all_ids):
            if not ids:  # vLLM's input processor refuses it (a stream's in-band error)
                raise InputProcessorError("The decoder prompt cannot be empty")
            rid = base if len(all_ids) == 1 else f"{base}-{i}"
            text = texts[i]
            offsets = None
            if req.return_token_offsets and text is not None and self._mistral is None:
                offsets = self._offsets(text, req, ids)
            out.append(self._generate(req, ids, req.max_tokens, "max_tokens", rid, offsets,
                                      () if text is not None else ids))
        return out

    # -- tokenize / detokenize ----------------------------------------------------------------

    def tokenize(self, req: TokenizeRequest) -> TokenizeResponse:
        if req.messages is not None:
            chat = ChatCompletionRequest(
                messages=req.messages,
                add_generation_prompt=req.add_generation_prompt,
                continue_final_message=req.continue_final_message,
                chat_template=req.chat_template,
                chat_template_kwargs=req.chat_template_kwargs,
                tools=req.tools,
                add_special_tokens=bool(req.add_special_tokens),
            )
            ids = self.chat_token_ids(chat)
        elif req.prompt is not None:
            add = True if req.add_special_tokens is None else req.add_special_tokens
            ids = self.encode(req.prompt, add)
        else:
            raise BadRequestError("Either `prompt` or `messages` must be given.", "prompt")
        strs = None
        if req.return_token_strs:
            strs = [self.tokenizer.id_to_token(i) or "" for i in ids]
        return TokenizeResponse(
            count=len(ids), max_model_len=self.max_model_len, tokens=ids, token_strs=strs
        )

    def detokenize(self, req: DetokenizeRequest) -> DetokenizeResponse:
        self._check_ids(req.tokens, "tokens")
        return DetokenizeResponse(prompt=self.decode(req.tokens))

    # -- shared -------------------------------------------------------------------------------

    def _keep(self, req: ChatCompletionRequest | CompletionRequest) -> int | None:
        """The prompt tokens ``truncate_prompt_tokens`` keeps: -1 is the context, less one
        token of room when the request names an output budget (vLLM's max_truncation_tokens)."""
        keep = req.truncate_prompt_tokens
        if keep is None or keep >= 0:
            return keep
        if isinstance(req, ChatCompletionRequest):
            wanted = req.max_completion_tokens if req.max_completion_tokens is not None else (
                req.max_tokens)
        else:
            wanted = req.max_tokens
        return self.max_model_len - 1 if wanted else self.max_model_len

    def engine_params(self, sp: SamplingParams) -> None:
        """The steps of vLLM's input processor that need the model's tokenizer, on checked
        params (render's own and the router's token-in ones): the structured-output constraint
        checked and its backend resolved (render/structured.py), and ``bad_words`` turned into
        the token ids the engine bans (render/bad_words.py)."""
        try:
            sp.structured_outputs = self.structured.resolve(sp.structured_outputs)
            sp._bad_words_token_ids = bad_words_token_ids(
                sp.bad_words, lambda text: self.encode(text, False))
        except InputProcessorError:
            raise
        except BadRequestError as exc:  # vLLM's input processor's: a stream's in-band error
            raise InputProcessorError(exc.message, exc.param) from None

    def _check_ids(self, ids: list[int], param: str) -> None:
        limit = max(self.vocab_size, self.tokenizer.get_vocab_size(True))
        bad = [t for t in ids if t >= limit]
        if bad:
            raise BadRequestError(
                f"Token id {bad[0]} is out of vocabulary (vocab size {limit}).", param
            )

    @overload
    def _truncate(self, ids: list[int], keep: int | None, side: str | None) -> list[int]: ...

    @overload
    def _truncate(self, ids: TokenArray, keep: int | None, side: str | None) -> TokenArray: ...

    def _truncate(self, ids: TokenIds, keep: int | None, side: str | None) -> TokenIds:
        if keep is None:
            return ids
        n = self.max_model_len if keep == -1 else keep
        if len(ids) <= n:
            return ids
        return ids[:n] if side == "right" else ids[len(ids) - n :]

    def _generate(
        self,
        req: ChatCompletionRequest | CompletionRequest,
        ids: TokenIds,
        requested: int | None,
        param: str,
        request_id: str,
        offsets: list[tuple[int, int]] | None = None,
        prompt_ids: Sequence[int] = (),
    ) -> GenerateRequest:
        """The GenerateRequest of a rendered prompt (``prompt_ids``: a prompt the client gave as
        token ids, checked against the vocabulary)."""
        max_tokens = max_tokens_for(self.max_model_len, requested, len(ids),
                                    self.default_sampling)
        named_tool = isinstance(req, ChatCompletionRequest) and isinstance(
            req.tool_choice, NamedToolChoice)
        structured = self.structured.from_request(
            req.structured_outputs, req.response_format,
            chat=isinstance(req, ChatCompletionRequest), named_tool=named_tool)
        if isinstance(req, ChatCompletionRequest) and self.tool_calling is not None:
            # A forced call's constraint replaces the request's own (vLLM's tool parser
            # adjust_request), unless that is a structural tag.
            schema = (None if structured is not None and structured.structural_tag
                      else forced_schema(req, self.tool_calling))
            if schema is not None:
                structured = StructuredOutputsParams(json=schema)
        params = build_sampling_params(
            req,
            max_tokens=max_tokens,
            defaults=self.default_sampling,
            generation_config=self.generation_config,
            eos_token_id=self.eos_token_id,
            limits=self.limits,
            structured_outputs=structured,
        )
        check_engine_input(params, len(ids), vocab_size=self.vocab_size,
                           max_model_len=self.max_model_len, prompt_ids=prompt_ids,
                           limits=self.limits)
        self.engine_params(params)
        return GenerateRequest(
            request_id=request_id,
            # A uint32 array only on the JSON-answer path (render_chat(array=True)).
            token_ids=ids,  # type: ignore[arg-type]
            token_offsets=offsets,
            sampling_params=params,
            model=req.model,
            stream=bool(req.stream),
            stream_options=req.stream_options if req.stream else None,
            cache_salt=req.cache_salt,
            priority=req.priority,
            kv_transfer_params=req.kv_transfer_params,
            ec_transfer_params=req.ec_transfer_params,
        )


def _with_tool_calling(req: ChatCompletionRequest, calling: ToolCalling) -> ChatCompletionRequest:
    """The request checked against the server's tool-call flags, with the markers' special
    tokens kept while tools may be called (as vLLM's parsers' ``adjust_request`` leave it)."""
    check_tool_calling(req, calling)
    if calling.tool_parser is not None and req.tools and req.tool_choice != "none":
        return msgspec.structs.replace(req, skip_special_tokens=False)
    return req


def _check_tool_choice(req: ChatCompletionRequest) -> None:
    """vLLM's request validation of ``tool_choice`` against ``tools``."""
    choice = req.tool_choice
    if choice is UNSET or choice is None or choice == "none":
        return
    if req.tools is None:
        raise refuse("When using `tool_choice`, `tools` must be set.", "tool_choice")
    if isinstance(choice, NamedToolChoice) and choice.function.name not in {
        t.function.name for t in req.tools
    }:
        raise refuse(
            "The tool specified in `tool_choice` does not match any of the specified `tools`",
            "tool_choice",
        )

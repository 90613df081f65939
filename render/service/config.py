"""The render service's configuration: `kvroute render` flags parsed once into frozen objects."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TextIO

from output.parsers.registry import check_names
from render.hub import resolve_model
from render.models import EMBEDDED_MODEL, EMBEDDED_SERVED_NAME, served_name
from render.sampling_checks import DEFAULT_LIMITS, RequestLimits
from render.service.lora_modules import LoRAModule, lora_modules
from render.structured_config import (
    StructuredOutputsConfig,
    add_structured_outputs_arguments,
    structured_outputs_config,
)
from serving.server import RENDER_SERVER, SERVERS, TAKES_SOCKET

DEFAULT_PORT = 8100
# Bodies up to this many bytes always render on the event loop (~2k tokens). Bigger ones render
# there too while the model's observed cost predicts at most the inline budget below, else on a
# thread: a thread handoff (executor queue, GIL switch, loop wake-up) can cost more CPU than a
# whole 10k-token render on the fast path.
DEFAULT_OFFLOAD_BYTES = 8192
DEFAULT_INLINE_BUDGET_MS = 2.0
# Above this a body always renders on a thread, whatever the estimate says (~16k tokens).
DEFAULT_INLINE_MAX_BYTES = 65536
DEFAULT_RENDER_THREADS = 2
# A request's own chat template (--allow-request-chat-template) renders in a helper process under
# these limits: wall-clock seconds per render, and MiB of address space over the loaded process.
DEFAULT_TEMPLATE_SECONDS = 5.0
DEFAULT_TEMPLATE_MEMORY_MIB = 1024
# Chosen by measurement (bench/servers.py; docs/operations.md, "HTTP server").
DEFAULT_HTTP_SERVER = RENDER_SERVER


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One model the service renders for; ``served_model_name`` is what requests select it by."""

    model: Path
    served_model_name: str
    tokenizer: Path | None = None
    chat_template: Path | None = None
    max_model_len: int | None = None
    # The Hub revision (branch, tag or commit) when ``model`` is a Hugging Face id (render/hub.py).
    revision: str | None = None
    # vLLM's parser flags (output/parsers/registry.py; "auto" picks by model): they decide which
    # tool_choice a request may send, and how derender reads the output.
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    enable_auto_tool_choice: bool = False

    def __post_init__(self) -> None:
        if self.enable_auto_tool_choice and not self.tool_call_parser:
            raise ValueError("--enable-auto-tool-choice requires --tool-call-parser")
        check_names(self.tool_call_parser, self.reasoning_parser)


@dataclass(frozen=True, slots=True)
class ServerConfig:
    models: tuple[ModelSpec, ...]
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    workers: int = 1
    max_body_bytes: int = 32 * 1024 * 1024
    allow_request_chat_template: bool = False
    request_template_seconds: float = DEFAULT_TEMPLATE_SECONDS
    request_template_memory_mib: int = DEFAULT_TEMPLATE_MEMORY_MIB
    request_template_processes: int = 1
    offload_bytes: int = DEFAULT_OFFLOAD_BYTES
    inline_budget_ms: float = DEFAULT_INLINE_BUDGET_MS
    inline_max_bytes: int = DEFAULT_INLINE_MAX_BYTES
    render_threads: int = DEFAULT_RENDER_THREADS
    render_processes: int = 1
    access_log: bool = False
    http_server: str = DEFAULT_HTTP_SERVER
    switch_interval: float = 0.0005
    # Work one request may ask for (render.sampling_checks.RequestLimits; docs/operations.md).
    max_n: int = DEFAULT_LIMITS.max_n
    max_logprobs: int = DEFAULT_LIMITS.max_logprobs
    max_stop_strings: int = DEFAULT_LIMITS.max_stop_strings
    max_stop_bytes: int = DEFAULT_LIMITS.max_stop_bytes
    max_output_entries: int = DEFAULT_LIMITS.max_output_entries
    # LoRA adapters whose model names render with their base model (--lora-modules).
    lora_modules: tuple[LoRAModule, ...] = ()
    # vLLM's --structured-outputs-config: keep it equal to the engines' (render/structured.py).
    structured_outputs: StructuredOutputsConfig = StructuredOutputsConfig()

    @property
    def request_limits(self) -> RequestLimits:
        return RequestLimits(self.max_n, self.max_logprobs, self.max_stop_strings,
                             self.max_stop_bytes, self.max_output_entries)

    @property
    def template_limits(self) -> TemplateLimits:
        return TemplateLimits(self.request_template_seconds, self.request_template_memory_mib)

    @property
    def limits(self) -> RenderLimits:
        return RenderLimits(self.max_body_bytes, self.offload_bytes, self.inline_budget_ms,
                            self.inline_max_bytes)


@dataclass(frozen=True, slots=True)
class RenderLimits:
    """How big a body may be, and where a body of a given size renders (render_in)."""

    max_body_bytes: int = 32 * 1024 * 1024
    offload_bytes: int = DEFAULT_OFFLOAD_BYTES
    inline_budget_ms: float = DEFAULT_INLINE_BUDGET_MS
    inline_max_bytes: int = DEFAULT_INLINE_MAX_BYTES


@dataclass(frozen=True, slots=True)
class TemplateLimits:
    """What one render of a request-supplied chat template may take (render/service/sandbox.py)."""

    seconds: float = DEFAULT_TEMPLATE_SECONDS
    memory_mib: int = DEFAULT_TEMPLATE_MEMORY_MIB


def model_spec(model: Path, served_model_name: str | None = None, *, tokenizer: Path | None = None,
               chat_template: Path | None = None, max_model_len: int | None = None,
               revision: str | None = None, tool_call_parser: str | None = None,
               reasoning_parser: str | None = None,
               enable_auto_tool_choice: bool = False) -> ModelSpec:
    """A model to serve; unnamed, it is served by its directory (the embedded one by its id)."""
    if served_model_name is None:
        served_model_name = served_name(model)
    return ModelSpec(model, served_model_name, tokenizer, chat_template, max_model_len, revision,
                     tool_call_parser, reasoning_parser, enable_auto_tool_choice)


SPEC_KEYS = {"model", "served_model_name", "tokenizer", "chat_template", "max_model_len",
             "revision", "tool_call_parser", "reasoning_parser", "enable_auto_tool_choice"}
_TRUE = {"1", "true", "yes", "on"}


def parse_model_spec(text: str) -> ModelSpec:
    """``DIR|ORG/NAME[,served_model_name=N][,tokenizer=DIR][,chat_template=FILE]
    [,max_model_len=N][,revision=REV][,tool_call_parser=P][,reasoning_parser=P]
    [,enable_auto_tool_choice=true]``."""
    head, *pairs = text.split(",")
    fields: dict[str, str] = {"model": head}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in SPEC_KEYS:
            raise argparse.ArgumentTypeError(
                f"bad model spec part {pair!r}: "
                f"expected one of {sorted(SPEC_KEYS - {'model'})}=VALUE"
            )
        fields[key] = value
    if not fields["model"]:
        raise argparse.ArgumentTypeError(f"model spec {text!r} has no model directory")
    return _spec(
        Path(fields["model"]),
        fields.get("served_model_name"),
        fields.get("tokenizer"),
        fields.get("chat_template"),
        fields.get("max_model_len"),
        fields.get("revision"),
        fields.get("tool_call_parser"),
        fields.get("reasoning_parser"),
        fields.get("enable_auto_tool_choice", "").lower() in _TRUE,
    )


def _spec(
    model: Path, name: str | None, tokenizer: str | None, template: str | None,
    max_len: str | None, revision: str | None = None, tool_call_parser: str | None = None,
    reasoning_parser: str | None = None, enable_auto_tool_choice: bool = False,
) -> ModelSpec:
    if max_len is not None and (not max_len.isdigit() or int(max_len) < 1):
        raise argparse.ArgumentTypeError(
            f"max_model_len must be a positive integer, not {max_len!r}"
        )
    try:
        return model_spec(
            model,
            name,
            tokenizer=Path(tokenizer) if tokenizer else None,
            chat_template=Path(template) if template else None,
            max_model_len=int(max_len) if max_len is not None else None,
            revision=revision,
            tool_call_parser=tool_call_parser,
            reasoning_parser=reasoning_parser,
            enable_auto_tool_choice=enable_auto_tool_choice,
        )
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvroute render",
        description="GPU-less render service: OpenAI requests -> vLLM GenerateRequests.",
    )
    m = p.add_argument_group("model")
    m.add_argument("--model", type=Path, default=EMBEDDED_MODEL,
                   help="model directory, or a Hugging Face id ORG/NAME whose tokenizer and "
                        "config files (never weights) are fetched into the Hugging Face cache "
                        "(HF_HOME, HF_TOKEN, HF_HUB_OFFLINE apply; default: the embedded Qwen3 "
                        "tokenizer)")
    m.add_argument("--revision", help="Hub branch, tag or commit of an ORG/NAME --model")
    m.add_argument("--tokenizer", help="tokenizer directory or Hub id, if not the model's")
    m.add_argument("--chat-template", help="Jinja chat template file overriding the model's")
    m.add_argument("--served-model-name",
                   help=f"name requests select the model by (embedded: {EMBEDDED_SERVED_NAME})")
    m.add_argument("--max-model-len", help="context length (default: the model's config.json)")
    m.add_argument("--add-model", action="append", default=[], type=parse_model_spec,
                   metavar="SPEC", help="another model: DIR|ORG/NAME[,served_model_name=N]"
                   "[,tokenizer=DIR][,chat_template=FILE][,max_model_len=N][,revision=REV]; "
                   "repeatable")
    m.add_argument("--tool-call-parser", metavar="NAME",
                   help="vLLM's tool-call parser of --model (hermes, qwen3_coder, llama3_json, "
                        "mistral, openai, ...; auto: from the model); reads calls only with "
                        "--enable-auto-tool-choice")
    m.add_argument("--reasoning-parser", metavar="NAME",
                   help="vLLM's reasoning parser of --model (qwen3, deepseek_r1, ...; auto)")
    m.add_argument("--enable-auto-tool-choice", action="store_true",
                   help="read the model's tool calls (tool_choice auto, required, named); "
                        "without it tool_choice auto is a 400, as in vLLM")
    m.add_argument("--lora-modules", nargs="+", action="extend", default=[], metavar="MODULE",
                   help="LoRA adapters whose model names render with their base model, as in "
                        "vllm serve: name=path, or JSON {\"name\": .., \"path\": .., "
                        "\"base_model_name\": ..}")
    m.add_argument("--allow-request-chat-template", action="store_true",
                   help="accept a request's own `chat_template` (off: 400); it renders in a "
                        "helper process under the two limits below (over either: 400)")
    m.add_argument("--request-template-seconds", type=float, default=DEFAULT_TEMPLATE_SECONDS,
                   help="wall-clock seconds one render of a request's chat template may take")
    m.add_argument("--request-template-memory-mib", type=int,
                   default=DEFAULT_TEMPLATE_MEMORY_MIB,
                   help="MiB of memory one render of a request's chat template may add to its "
                        "helper process")
    m.add_argument("--request-template-processes", type=int, default=1,
                   help="helper processes per worker rendering requests' chat templates (only "
                        "with --allow-request-chat-template)")
    s = p.add_argument_group("serving")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=DEFAULT_PORT, help="0 picks a free port")
    s.add_argument("--workers", type=int, default=1, help="worker processes sharing the socket")
    s.add_argument("--max-n", type=int, default=DEFAULT_LIMITS.max_n,
                   help="most choices per request")
    s.add_argument("--max-logprobs", type=int, default=DEFAULT_LIMITS.max_logprobs,
                   help="most logprobs/top_logprobs/prompt_logprobs, as vLLM's --max-logprobs "
                        "(-1: no limit)")
    s.add_argument("--max-stop-strings", type=int, default=DEFAULT_LIMITS.max_stop_strings,
                   help="most stop strings per request")
    s.add_argument("--max-stop-bytes", type=int, default=DEFAULT_LIMITS.max_stop_bytes,
                   help="most UTF-8 bytes of all stop strings together")
    s.add_argument("--max-output-entries", type=int, default=DEFAULT_LIMITS.max_output_entries,
                   help="most n x max_tokens x (logprobs + 1) per request (0: no limit)")
    s.add_argument("--max-body-bytes", type=int, default=32 * 1024 * 1024,
                   help="larger request bodies are refused with 413")
    add_structured_outputs_arguments(p)
    r = p.add_argument_group("where renders run")
    r.add_argument("--offload-bytes", type=int, default=DEFAULT_OFFLOAD_BYTES,
                   help="bodies up to this size always render on the event loop")
    r.add_argument("--inline-budget-ms", type=float, default=DEFAULT_INLINE_BUDGET_MS,
                   help="bigger bodies render on a thread unless the model's measured cost "
                        "predicts at most this many ms (0: always on a thread)")
    r.add_argument("--inline-max-bytes", type=int, default=DEFAULT_INLINE_MAX_BYTES,
                   help="bodies above this size always render on a thread")
    r.add_argument("--render-threads", type=int, default=DEFAULT_RENDER_THREADS,
                   help="threads for big renders")
    r.add_argument("--render-processes", type=int, default=1,
                   help="helper processes per worker rendering bodies over --inline-max-bytes "
                        "(each loads its own copy of the models; 0: render them on a thread)")
    o = p.add_argument_group("observability")
    o.add_argument("--access-log", action="store_true", help="log every request to stderr")
    s.add_argument("--http-server", choices=SERVERS, default=DEFAULT_HTTP_SERVER,
                   help=f"HTTP server, run stock (default {DEFAULT_HTTP_SERVER}; granian needs "
                        "--workers 1: it binds its own listener)")
    return p


def parse_args(argv: list[str]) -> ServerConfig:
    """Parses `kvroute render` flags; argparse exits with a usage message on bad input."""
    p = build_parser()
    a = p.parse_args(argv)
    try:
        primary = _spec(a.model, a.served_model_name, a.tokenizer, a.chat_template,
                        a.max_model_len, a.revision, a.tool_call_parser, a.reasoning_parser,
                        a.enable_auto_tool_choice)
    except argparse.ArgumentTypeError as e:
        p.error(str(e))
    models = (primary, *a.add_model)
    names = [m.served_model_name for m in models]
    if len(set(names)) != len(names):
        p.error(f"served model names must be unique, got {names}")
    try:
        adapters = lora_modules(a.lora_modules)
    except ValueError as e:
        p.error(str(e))
    for module in adapters:
        if module.name in names:
            p.error(f"LoRA module {module.name!r} conflicts with a served base model")
    for name, value, low in (("--workers", a.workers, 1), ("--max-body-bytes", a.max_body_bytes, 1),
                             ("--offload-bytes", a.offload_bytes, 0),
                             ("--inline-budget-ms", a.inline_budget_ms, 0),
                             ("--inline-max-bytes", a.inline_max_bytes, 0),
                             ("--render-threads", a.render_threads, 1),
                             ("--render-processes", a.render_processes, 0), ("--port", a.port, 0),
                             ("--max-n", a.max_n, 1), ("--max-logprobs", a.max_logprobs, -1),
                             ("--max-stop-strings", a.max_stop_strings, 1),
                             ("--max-stop-bytes", a.max_stop_bytes, 1),
                             ("--max-output-entries", a.max_output_entries, 0),
                             ("--request-template-memory-mib", a.request_template_memory_mib, 1),
                             ("--request-template-processes", a.request_template_processes, 1)):
        if value < low:
            p.error(f"{name} must be >= {low}, got {value}")
    try:
        structured = structured_outputs_config(a.structured_outputs_json,
                                               a.structured_outputs_backend)
    except ValueError as e:
        p.error(str(e))
    if not a.request_template_seconds > 0:
        p.error(f"--request-template-seconds must be > 0, got {a.request_template_seconds}")
    if a.http_server not in TAKES_SOCKET and a.workers > 1:
        # It binds from an address: worker processes cannot share the parent's socket.
        p.error(f"--http-server {a.http_server} serves one process: use --workers 1")
    # Every other field has a flag of its name (switch_interval has none: it keeps its default).
    flags = {f.name: getattr(a, f.name) for f in fields(ServerConfig) if hasattr(a, f.name)}
    return ServerConfig(**{**flags, "models": models, "lora_modules": adapters,
                           "structured_outputs": structured})


def resolve_spec(spec: ModelSpec, progress: TextIO | None = sys.stderr) -> ModelSpec:
    """``spec`` with its model (and tokenizer) as local directories, fetched when they are Hub
    ids; the served name stays what the user typed."""
    model = resolve_model(spec.model, spec.revision, progress)
    tokenizer = (resolve_model(spec.tokenizer, spec.revision, progress)
                 if spec.tokenizer is not None else None)
    return replace(spec, model=model, tokenizer=tokenizer)

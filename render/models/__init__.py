"""The model files shipped in the package: the Qwen3 tokenizer, chat template and configs."""

from pathlib import Path

# What render, the router and the simulated engine serve when no model is named.
EMBEDDED_MODEL = Path(__file__).resolve().parent / "qwen3"
EMBEDDED_SERVED_NAME = "Qwen/Qwen3-0.6B"


def served_name(model: Path) -> str:
    """The name requests select ``model`` by when none is given: the embedded model's hub id,
    any other model's path."""
    return EMBEDDED_SERVED_NAME if model.resolve() == EMBEDDED_MODEL else str(model)

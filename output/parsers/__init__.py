"""Streaming tool-call and reasoning parsers of the output pipeline (vLLM's names, one hold-back cutter)."""

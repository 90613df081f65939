"""Streaming tool-call and reasoning parsers of the output pipeline, by vLLM's names."""

"""The output pipeline: engine tokens -> text, stop strings, logprobs, parsers -> SSE or a body."""

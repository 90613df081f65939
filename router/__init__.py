"""router: OpenAI-compatible cache-aware router speaking vLLM's EngineCore protocol."""

"""vLLM's wire types as msgspec Structs: engine messages, KV events, sampling, logprob arrays."""

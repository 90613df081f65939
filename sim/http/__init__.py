"""The simulated engine's HTTP face: `vllm serve`'s endpoints in front of the same engine."""

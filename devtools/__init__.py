"""Development tooling: a local cluster of router + simulated engines, and the demo."""

"""sim: `kvroute sim-engine`, a simulated vLLM engine speaking the real engine protocol."""

"""The engine link: EngineCore over ZMQ (handshake, requests, demultiplexed outputs, health)."""

"""The KV-event feed: per-engine subscriptions and replay feeding the radix index."""

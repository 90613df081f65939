"""radix: per-engine prefix index over token blocks, fed by engines' KV-cache events."""

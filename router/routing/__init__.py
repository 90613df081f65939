"""Routing: the cache-aware policy, admission, the dispatcher and the fleet of engines."""

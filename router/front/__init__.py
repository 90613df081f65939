"""The router's HTTP front: the app, its handlers, the token-in fast path and the responders."""

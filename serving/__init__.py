"""HTTP serving shared by render and router: server startup, bodies, errors, metrics, probes."""

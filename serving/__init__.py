"""HTTP serving shared by the render service and the router: server startup, bodies, errors, metrics, probes."""

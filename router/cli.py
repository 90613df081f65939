"""Entry point of the `kvroute` command: subcommands render, router, sim-engine."""

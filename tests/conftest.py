"""Shared pytest configuration: fixtures live in their own modules, registered here."""

pytest_plugins = ["tests.engines"]

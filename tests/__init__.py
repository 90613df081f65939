"""tests package marker (shared helpers live in conftest.py)."""

"""Render's HTTP service: the Starlette app, its fast route, helper processes and model loading."""

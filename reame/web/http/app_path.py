"""A request's path as the app sees its routes."""

from __future__ import annotations


def app_path(path: str, root_path: str = "") -> str:
    """path without root_path ([server] public_root), which the ASGI server may put in front
    of it."""
    return path[len(root_path):] if root_path and path.startswith(root_path) else path

"""Reame's benchmark: see bench/__main__.py (run with `python -m bench`)."""

"""The engine in a process of its own (parent.py), and that process (child.py)."""

"""Accounts: the users file and its passwords and keys (users), and `app.py users` (cli)."""

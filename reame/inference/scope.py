"""Scope: whose KV may be reused by whom.

A scope names whose tokens made a KV: a slot's live KV (KVCache.serve clears it before a turn
of another scope), a KV file (its header says, and the block hashes that find it are salted
with it), a snapshot of a prompt's opening. A turn reuses only KV of its own scope, so that
nothing a user can observe (tokens reused, their source, the time to the first token) depends
on what another user wrote (cache.py). What else is kept per scope, for the same reason:
tokenized message text (prompt.py), the exact tokens of replies to stateless clients
(reame.chats.conversation) and the cache's lookup counts.

The scopes: one per user (user_scope), one for everyone on a server without accounts
(NO_ACCOUNTS), and SHARED: the snapshot of the configured default system prompt's opening,
which every scope may reuse (the administrator's text: it says nothing about any user). The
warm-up at start runs in a scope of its own (warmup.WARM_SCOPE), which no turn has.
"""

from typing import NewType

Scope = NewType("Scope", str)

NO_ACCOUNTS = Scope("")  # a server without accounts: every request is the same person's
SHARED = Scope("shared")  # the default system prompt's opening, reusable by every scope


def user_scope(user: str | None) -> Scope:
    """The scope of a user's chats and requests (NO_ACCOUNTS: a server without accounts)."""
    return NO_ACCOUNTS if user is None else Scope(f"user:{user}")

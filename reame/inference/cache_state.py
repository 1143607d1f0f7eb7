"""What the KV cache (cache.py) says of a turn and of a slot: where a prompt's KV came from
(Restored), what is live in each engine sequence (Live), work done ahead of a chat's turn
(Ahead), messages dropped from a window (Drop) and the lookup counts (Counts)."""

from __future__ import annotations

from dataclasses import dataclass

from reame.inference.scope import Scope

# Where restored history comes from when it is read from a file: the chat's own, the chat it
# was branched from, a prefix shared with other chats.
FROM_FILES = ("disk", "branch", "prefix")


@dataclass
class Counts:
    lookups: int = 0
    hits: int = 0
    tokens_saved: int = 0  # history tokens not recomputed: from a file, or another chat's live KV
    # Their recomputation time, each hit's at the prefill rate measured then: a total that
    # only grows (tokens_saved / today's rate would move as the rate's estimate moves).
    seconds_saved: float = 0.0


@dataclass
class Restored:
    reused: int  # prompt tokens whose KV is live after prepare()
    source: str  # live / disk / branch / prefix / none
    restore_ms: float = 0.0
    shifted: int = 0  # tokens dropped from the KV by a context shift (nothing recomputed)
    recomputed: bool = False  # a drop the KV could not follow: the kept window is re-evaluated
    typed: tuple[int, int] | None = None  # prompt tokens [start, end) evaluated while typed
    # Prompt tokens the KV it came from held (the live KV, or the file restored), from the
    # start: more than reused where that memory could only go back to a checkpoint.
    shared: int = 0

    def typed_ahead(self, reused: int) -> int:
        """How many of the reused tokens were evaluated while the message was typed."""
        return max(0, min(reused, self.typed[1]) - self.typed[0]) if self.typed else 0


@dataclass(frozen=True)
class Ahead:
    """Work done for a chat before its turn, which the turn reports as its own: its KV file
    restored when the chat was opened (restore_ahead), its next message evaluated while typed."""

    chat_id: int
    source: str  # where the history came from: disk / prefix, else live
    restore_ms: float
    counted: bool  # its restore is in the lookup counts already (done by a prepare)
    typed: tuple[int, int] | None = None  # Restored.typed


@dataclass
class Live:
    """What the cache knows of one engine sequence's live KV, beyond its tokens: whose it is,
    the chat it was last made for, what was done ahead of that chat's next turn, and a chat
    whose own file restore_ahead() found unusable."""

    scope: Scope | None = None  # None: nobody's yet
    chat: int | None = None
    ahead: Ahead | None = None
    missed: int | None = None
    # The chat whose file holds what this KV holds: saved at the end of its turn, and not
    # changed since (a draft typed ahead, another turn's prompt change it).
    kept: int | None = None


@dataclass(frozen=True)
class Drop:
    """Messages just dropped from the front of a chat's window: the prompt they would have
    made (old_prompt) loses old_prompt[at:at + n], and the rest is the new prompt."""

    old_prompt: list[int]
    at: int
    n: int

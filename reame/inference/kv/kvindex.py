"""Which KV files may hold the beginning of a prompt: the candidates a lookup peeks at.

A file is found by the chained hashes of its tokens' blocks (kvstore.block_hashes, salted with
the file's scope: another user's file never matches) and by the key of each prompt it holds
whole (prompt_key). The index is built from the files' heads on first use, then kept up to
date by every save. Files are named by their keys (kvstore.py), never by paths.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterator

from reame.inference.batches import Batch
from reame.inference.kv.kvstore import BLOCK, KVStore, block_hashes
from reame.inference.scope import SHARED, Scope

PER_BLOCK = 4  # files the index keeps per block hash (the newest)
CANDIDATES = 16  # files a lookup peeks at, at most


def prompt_key(tokens: list[int], scope: Scope) -> str:
    """The index key of a whole prompt's tokens (a file whose KV holds them before a reply)."""
    data = (f"{scope}\0".encode() if scope else b"") + array("i", tokens).tobytes()
    return "prompt:" + hashlib.blake2b(data, digest_size=12).hexdigest()


class FileIndex:
    """Block hash or prompt key -> the newest files (up to PER_BLOCK, newest last) holding it."""

    def __init__(self, files: KVStore):
        self.files = files
        self._index: dict[str, list[str]] | None = None  # built on first use

    def candidates(self, chat_id: int | None, prompt: list[int], scope: Scope, *,
                   own: bool = True, parent: int | None = None
                   ) -> Iterator[tuple[str, str, int]]:
        """The chat's own file (own=True), the file of the chat it was branched from (parent),
        then files whose tokens start like prompt, longest shared block first: snapshots by
        name, other files through the index, at most CANDIDATES in all. Each comes as
        (source, key, bound): no file from it on can give more than bound of prompt's
        tokens."""
        whole = len(prompt) - 1  # the prompt's last token is always evaluated again
        own_key = self.files.chat_key(chat_id) if chat_id is not None else None
        if own_key is not None and own:
            yield "disk", own_key, whole
        parent_key = self.files.chat_key(parent) if parent is not None else None
        if parent_key is not None and self.files.exists(parent_key):
            yield "branch", parent_key, whole
        index = self.build()
        seen = {own_key, parent_key}
        # Files whose KV holds this very prompt before a reply (the same request again).
        for key in reversed(index.get(prompt_key(prompt, scope), ())):
            if key not in seen and self.files.exists(key):
                seen.add(key)
                yield "prefix", key, whole
        levels = zip(block_hashes(prompt, scope), block_hashes(prompt, SHARED))
        for n, hashes in reversed(list(enumerate(levels, 1))):
            # Files first found at n blocks do not hold block n + 1 (they would be listed
            # there: the index keeps the newest holders of each block, and every holder of
            # a block holds the ones before it); snapshots end before the next block too.
            bound = min(whole, (n + 1) * BLOCK - 1)
            keys = [key for block_hash in hashes
                    for key in [*reversed(index.get(block_hash, ())),
                                self.files.prefix_key(block_hash)]]
            for key in keys:
                if key not in seen and self.files.exists(key):
                    seen.add(key)
                    yield "prefix", key, bound
                    if len(seen) > CANDIDATES:
                        return

    def add(self, name: str, tokens: list[int], batches: list[Batch], scope: Scope) -> None:
        """The file named name just saved (or found at start-up) with these tokens, made by
        these batches."""
        if self._index is None:
            return  # built from the files' heads when first needed
        # Where a prompt of it ended: a fresh batch followed by a generated token.
        ends = [prompt_key(tokens[:b.end], scope) for b, after in zip(batches, batches[1:])
                if not b.kept and after.kept]
        for key in block_hashes(tokens, scope) + ends:
            holders = self._index.setdefault(key, [])
            if name in holders:
                holders.remove(name)
            holders.append(name)
            del holders[:-PER_BLOCK]

    def build(self) -> dict[str, list[str]]:
        """The index, built from every file's head if it is not yet (once per process)."""
        if self._index is None:
            self._index = {}
            own = f"-{self.files.tag}.kv"
            for blob in sorted((b for b in self.files.listing() if b.key.endswith(own)),
                               key=lambda b: b.used_ns):
                head = self.files.head(blob.key, report=False)
                if head and head.tokens:
                    self.add(blob.key, head.tokens, head.batches, head.scope)
        return self._index

"""Which KV files may hold the beginning of a prompt: the candidates a lookup peeks at.

A file is found by the chained hashes of its tokens' blocks (kvstore.block_hashes, salted with
the file's scope: another user's file never matches) and by the key of each prompt it holds
whole (prompt_key). The index is built from the files' heads on first use, then kept up to
date by every save.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterator
from pathlib import Path

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
        self._index: dict[str, list[Path]] | None = None  # built on first use

    def candidates(self, chat_id: int | None, prompt: list[int], scope: Scope, *,
                   own: bool = True, parent: int | None = None
                   ) -> Iterator[tuple[str, Path, int]]:
        """The chat's own file (own=True), the file of the chat it was branched from (parent),
        then files whose tokens start like prompt, longest shared block first: snapshots by
        name, other files through the index, at most CANDIDATES in all. Each comes as
        (source, path, bound): no file from it on can give more than bound of prompt's
        tokens."""
        whole = len(prompt) - 1  # the prompt's last token is always evaluated again
        own_path = self.files.chat_path(chat_id) if chat_id is not None else None
        if own_path is not None and own:
            yield "disk", own_path, whole
        parent_path = self.files.chat_path(parent) if parent is not None else None
        if parent_path is not None and parent_path.exists():
            yield "branch", parent_path, whole
        index = self.build()
        seen = {own_path, parent_path}
        # Files whose KV holds this very prompt before a reply (the same request again).
        for path in reversed(index.get(prompt_key(prompt, scope), ())):
            if path not in seen and path.exists():
                seen.add(path)
                yield "prefix", path, whole
        levels = zip(block_hashes(prompt, scope), block_hashes(prompt, SHARED))
        for n, hashes in reversed(list(enumerate(levels, 1))):
            # Files first found at n blocks do not hold block n + 1 (they would be listed
            # there: the index keeps the newest holders of each block, and every holder of
            # a block holds the ones before it); snapshots end before the next block too.
            bound = min(whole, (n + 1) * BLOCK - 1)
            paths = [path for block_hash in hashes
                     for path in [*reversed(index.get(block_hash, ())),
                                  self.files.prefix_path(block_hash)]]
            for path in paths:
                if path not in seen and path.exists():
                    seen.add(path)
                    yield "prefix", path, bound
                    if len(seen) > CANDIDATES:
                        return

    def add(self, path: Path, tokens: list[int], batches: list[Batch], scope: Scope) -> None:
        """A file just saved (or found at start-up) with these tokens, made by these batches."""
        if self._index is None:
            return  # built from the files' heads when first needed
        # Where a prompt of it ended: a fresh batch followed by a generated token.
        ends = [prompt_key(tokens[:b.end], scope) for b, after in zip(batches, batches[1:])
                if not b.kept and after.kept]
        for key in block_hashes(tokens, scope) + ends:
            holders = self._index.setdefault(key, [])
            if path in holders:
                holders.remove(path)
            holders.append(path)
            del holders[:-PER_BLOCK]

    def build(self) -> dict[str, list[Path]]:
        """The index, built from every file's head if it is not yet (once per process)."""
        if self._index is None:
            self._index = {}
            for path in sorted(self.files.own_files(), key=_mtime):
                head = self.files.head(path, report=False)
                if head and head.tokens:
                    self.add(path, head.tokens, head.batches, head.scope)
        return self._index


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0

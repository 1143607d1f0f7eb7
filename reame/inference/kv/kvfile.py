"""One KV file: its format, reading it back (its head only, or mapped whole), writing it.

File layout (little-endian):
    magic b"REAMEKV\\0" | u32 format version | u32 header length | header (JSON, utf-8)
    | tokens (int32 x n_tokens) | state (state_bytes) | each mark's state, then its logits
    | u64 xxh3-64 of everything before it

Marks (kv_memory.py) are the positions before the end where the KV can resume exactly: the
header lists each as [at, state bytes, logits bytes] (0: none). A mark's state is the part
of the sequence's memory that cannot be cut back, copied out at that position
(llama_state_seq_get_data_ext with LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY: a hybrid's recurrent
state, a sliding window's layers): it is put back over the end's state, whose other layers
(attention that keeps every position) are cut at the mark. Its logits, float32 x the
vocabulary, are the ones the prompt that ends there made (a regenerate after a restart
evaluates nothing).

The header holds the fingerprint (model file, KV type, flash attention, llama-cpp-python
version): a file whose fingerprint differs is not restored. It holds the decodes that made
the KV (batches.py): a restored KV is reused only where it gives the same reply. And it holds
the file's scope, whose tokens made it (cache.py: a user's KV serves only that user). Writes
go through Blobs.put (blobs.py: in the folder, a temp file, fsync, os.replace): a reader sees
the old file or the new one, never a partial one. A file that cannot be read back exactly
raises Unusable, saying why; the store of files (kvstore.py) counts it as a miss, never an
error.

Speed (see bench/restore_profile.py): a file is mapped, not copied, and its checksum (xxh3-64,
three times as fast as zlib's crc32, so it ends before llama.cpp's copy does) runs in a
second thread while llama.cpp loads the state (both release the GIL); the caller checks it with
`KVEntry.verified()` before trusting the KV.
"""

from __future__ import annotations

import json
import mmap
import struct
import threading
from array import array
from collections.abc import Sequence
from typing import NamedTuple

import xxhash

import reame.inference.batches as batch_plan
from reame.inference.batches import Batch
from reame.inference.kv.blobs import Blobs
from reame.inference.scope import NO_ACCOUNTS, Scope

MAGIC = b"REAMEKV\0"
FORMAT_VERSION = 5  # 1: crc32 checksum; 2: no batches; 3: no marks; 4: marks hold whole states
_PREAMBLE = struct.Struct("<8sII")
_SUM = struct.Struct("<Q")


class Unusable(Exception):
    """A KV file that cannot be used (truncated, corrupt, another format or model); says why."""


class FileMark(NamedTuple):
    """A mark as the header lists it: its position and the bytes of its state and logits."""

    at: int
    state_bytes: int
    logits_bytes: int


class Head(NamedTuple):
    """What a file holds, from its head only."""

    tokens: list[int]
    batches: list[Batch]
    scope: Scope
    marks: tuple[FileMark, ...] = ()

    def resume_marks(self) -> list[int]:
        """The positions of the marks that hold a state."""
        return [m.at for m in self.marks if m.state_bytes]

    def logits_at(self, at: int) -> bool:
        return any(m.at == at and m.logits_bytes for m in self.marks)


def checksum(data) -> int:
    """The file's checksum: xxh3-64 (releases the GIL on large buffers)."""
    return xxhash.xxh3_64_intdigest(data)


class KVEntry:
    """A mapped KV file: its tokens, its state, and its checksum being verified meanwhile.

    Use it as a context manager (the mapping is closed on exit) and call verified() before
    trusting anything loaded from `state`."""

    def __init__(self, data: mmap.mmap, tokens: list[int], batches: list[Batch], scope: Scope,
                 body: memoryview, state: memoryview, stored_sum: int,
                 marks: list[tuple[int, memoryview | None, memoryview | None]] = ()):
        self.tokens = tokens
        self.batches = batches
        self.scope = scope
        self.state = state  # writable (a private mapping), so ctypes takes it without a copy
        self.marks = list(marks)  # (at, its state or None, its logits or None), in order
        self._data, self._body, self._stored_sum = data, body, stored_sum
        self._sum: list[int] = []
        self._checker = threading.Thread(target=lambda: self._sum.append(checksum(body)),
                                         name="kv-checksum", daemon=True)
        self._checker.start()

    def verified(self) -> bool:
        """Whether the file's checksum matches (waits for the check to finish)."""
        self._checker.join()
        return self._sum == [self._stored_sum]

    def close(self) -> None:
        self._checker.join()
        for view in (self.state, *(v for _, *views in self.marks for v in views if v),
                     self._body):
            view.release()
        self._data.close()

    def __enter__(self) -> "KVEntry":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_head(blobs: Blobs, key: str, fingerprint: str) -> Head | None:
    """The tokens the file holds, the batches that made their KV and its scope, from its head
    only; None if there is no file, Unusable if it is not one of fingerprint's."""
    try:
        f = blobs.open(key)
        if f is None:
            return None
        with f:
            header_len = _header_length(f.read(_PREAMBLE.size))
            header = _header(f.read(header_len), fingerprint)
            raw = f.read(4 * header["n_tokens"])
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise Unusable(f"cannot read: {exc.strerror}") from None
    if len(raw) != 4 * header["n_tokens"]:
        raise Unusable("truncated")
    tokens = array("i")
    tokens.frombytes(raw)
    return Head(tokens.tolist(), header["batches"], header["scope"], header["marks"])


def fingerprint_of(blobs: Blobs, key: str) -> str:
    """The fingerprint the file says it was made with (a backup takes every model's files);
    Unusable if its head is unreadable."""
    try:
        f = blobs.open(key)
        if f is None:
            raise Unusable("cannot read: No such file or directory")
        with f:
            length = _header_length(f.read(_PREAMBLE.size))
            return str(json.loads(f.read(length))["fingerprint"])
    except OSError as exc:
        raise Unusable(f"cannot read: {exc.strerror}") from None
    except (ValueError, KeyError, TypeError):
        raise Unusable("unreadable header") from None


def problem(blobs: Blobs, key: str) -> str | None:
    """Why the file could not be restored by the model that made it (its head, sizes and
    checksum checked); None: it is whole."""
    try:
        entry = load(blobs, key, fingerprint_of(blobs, key))
    except Unusable as exc:
        return str(exc)
    if entry is None:
        return "missing"
    with entry:
        return None if entry.verified() else "checksum mismatch"


def load(blobs: Blobs, key: str, fingerprint: str) -> KVEntry | None:
    """The file mapped (Blobs.get: private and writable, so llama.cpp gets the bytes without a
    copy), its header checked and its checksum started; None if there is no file, Unusable if
    it is not one of fingerprint's. The caller closes the entry and must check
    entry.verified()."""
    try:
        data = blobs.get(key)
    except FileNotFoundError:
        return None
    except ValueError:  # an empty file cannot be mapped
        raise Unusable("truncated") from None
    except OSError as exc:
        raise Unusable(f"cannot read: {exc.strerror or exc}") from None
    if data is None:
        return None
    try:
        if len(data) < _PREAMBLE.size + _SUM.size:
            raise Unusable("truncated")
        return _parse(data, fingerprint)
    except Unusable:
        data.close()
        raise


def _parse(data: mmap.mmap, fingerprint: str) -> KVEntry:
    header_len = _header_length(data)
    end = len(data) - _SUM.size
    if _PREAMBLE.size + header_len > end:
        raise Unusable("truncated")
    header = _header(data[_PREAMBLE.size:_PREAMBLE.size + header_len], fingerprint)
    n_tokens, state_bytes = header["n_tokens"], header["state_bytes"]
    start = _PREAMBLE.size + header_len
    at = start + 4 * n_tokens + state_bytes
    if at + sum(m.state_bytes + m.logits_bytes for m in header["marks"]) != end:
        raise Unusable("sizes do not add up (truncated?)")
    tokens = array("i")
    tokens.frombytes(data[start:start + 4 * n_tokens])
    (stored,) = _SUM.unpack_from(data, end)
    body = memoryview(data)
    marks = []
    for mark in header["marks"]:
        views = []
        for size in (mark.state_bytes, mark.logits_bytes):
            views.append(body[at:at + size] if size else None)
            at += size
        marks.append((mark.at, *views))
    return KVEntry(data, tokens.tolist(), header["batches"], header["scope"], body[:end],
                   body[start + 4 * n_tokens:start + 4 * n_tokens + state_bytes], stored,
                   marks)


def _header_length(raw: bytes | mmap.mmap) -> int:
    """The header's length, if raw starts a file of this format."""
    if len(raw) < _PREAMBLE.size:
        raise Unusable("truncated")
    magic, version, header_len = _PREAMBLE.unpack_from(raw)
    if magic != MAGIC:
        raise Unusable("not a Reame KV file")
    if version != FORMAT_VERSION:
        raise Unusable(f"format version {version}, expected {FORMAT_VERSION}")
    return header_len


def _header(raw: bytes, fingerprint: str) -> dict:
    try:
        header = json.loads(raw)
        for key in ("n_tokens", "state_bytes"):
            header[key] = int(header[key])
        made_with = header["fingerprint"]
        header["batches"] = batch_plan.decode(header["batches"])
        header["scope"] = header.get("scope", NO_ACCOUNTS)  # a file from before scopes
        if not isinstance(header["scope"], str):
            raise TypeError("scope")
        header["marks"] = tuple(FileMark(*map(int, m)) for m in header.get("marks", ()))
    except (ValueError, KeyError, TypeError):
        raise Unusable("unreadable header") from None
    if header["batches"] is None or not batch_plan.valid(header["batches"],
                                                         header["n_tokens"]):
        raise Unusable("unreadable header")
    ends = {b.end for b in header["batches"]}
    if any(m.at not in ends or min(m) < 0 or m.state_bytes + m.logits_bytes == 0
           for m in header["marks"]):
        raise Unusable("unreadable header")
    if made_with != fingerprint:
        raise Unusable("made with another model or KV settings")
    return header


def write(blobs: Blobs, key: str, fingerprint: str, tokens: Sequence[int],
          state: bytes | memoryview, batches: Sequence[Batch] | None, scope: Scope,
          marks: Sequence = ()) -> int:
    """Atomically replace key's blob by a file of fingerprint holding these; the bytes written
    (but the preamble and checksum). OSError if the storage refused (then no partial blob is
    left). batches: the decodes that made the KV (None: unknown, reusable only as a whole);
    scope: whose; marks: kv_memory.Mark's (at, state, logits) before or at the end, each
    at a batch's end."""
    if batches is None:
        batches = [Batch(0, len(tokens), True)] if tokens else []
    ends = {b.end for b in batches}
    kept = [(m.at, _raw(m.state), _raw(m.logits)) for m in marks
            if m.at in ends and (m.state is not None or m.logits is not None)]
    header = json.dumps({"fingerprint": fingerprint, "n_tokens": len(tokens),
                         "state_bytes": len(state),
                         "batches": batch_plan.encode(batches),
                         "scope": scope,
                         "marks": [[at, len(s), len(lg)] for at, s, lg in kept]}).encode()
    token_bytes = array("i", tokens).tobytes()
    preamble = _PREAMBLE.pack(MAGIC, FORMAT_VERSION, len(header))
    parts = [preamble, header, token_bytes, state, *(p for _, *two in kept for p in two)]
    digest = xxhash.xxh3_64()
    for part in parts:
        digest.update(part)
    blobs.put(key, [*parts, _SUM.pack(digest.intdigest())])
    return sum(len(part) for part in parts) - len(preamble)


def _raw(data) -> memoryview | bytes:
    """data's bytes (a state, or logits: a ctypes array of floats), b"" for None."""
    return b"" if data is None else memoryview(data).cast("B")

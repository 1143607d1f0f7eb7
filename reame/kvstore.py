"""KV files on disk: one per chat and model, plus shared-prefix snapshots.

File layout (little-endian):
    magic b"REAMEKV\\0" | u32 format version | u32 header length | header (JSON, utf-8)
    | tokens (int32 x n_tokens) | state (state_bytes) | u32 crc32 of everything before it

The header holds the fingerprint (model file, KV type, flash attention, llama-cpp-python
version): a file whose fingerprint differs is not restored. Writes go to a temp file, fsync,
os.replace: a reader sees the old file or the new one, never a partial one. Any file that
cannot be read back exactly is a miss, never an error.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import tempfile
import threading
import zlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

MAGIC = b"REAMEKV\0"
FORMAT_VERSION = 1
_PREAMBLE = struct.Struct("<8sII")
_CRC = struct.Struct("<I")
BLOCK = 64  # tokens per block of the shared-prefix chained hash


@dataclass(frozen=True)
class KVEntry:
    tokens: list[int]
    state: memoryview  # writable, over the file's bytes


@dataclass
class CacheCounters:
    rejected: int = 0  # files found but unusable: corrupt, foreign model, old format
    writes: int = 0
    write_errors: int = 0
    bytes_written: int = 0
    evicted: int = 0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def block_hashes(tokens: Sequence[int], block: int = BLOCK) -> list[str]:
    """Chained hash at each block boundary: hashes[i] covers tokens[: (i + 1) * block]."""
    out, chain = [], b""
    for start in range(0, len(tokens) - block + 1, block):
        digest = hashlib.blake2b(chain + array("i", tokens[start:start + block]).tobytes(),
                                 digest_size=12)
        chain = digest.digest()
        out.append(digest.hexdigest())
    return out


class KVStore:
    """KV files under one folder, kept under a disk budget (least recently used go first)."""

    def __init__(self, folder: Path, *, fingerprint: str, max_bytes: int):
        self.folder = folder
        self.fingerprint = fingerprint
        self.tag = fingerprint_tag(fingerprint)
        self.max_bytes = max_bytes
        self.counters = CacheCounters()
        self._lock = threading.Lock()
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob("*.tmp"):
            stale.unlink(missing_ok=True)

    # names

    def chat_path(self, chat_id: int) -> Path:
        return self.folder / f"chat-{chat_id}-{self.tag}.kv"

    def prefix_path(self, block_hash: str) -> Path:
        return self.folder / f"prefix-{block_hash}-{self.tag}.kv"

    # reading

    def peek(self, path: Path) -> list[int] | None:
        """The tokens a file holds, from its head only; None if absent or not for this model."""
        try:
            with path.open("rb") as f:
                header_len = self._preamble(path, f.read(_PREAMBLE.size))
                if header_len is None:
                    return None
                header = self._header(path, f.read(header_len))
                if header is None:
                    return None
                raw = f.read(4 * header["n_tokens"])
        except FileNotFoundError:
            return None
        except OSError as exc:
            return self.reject(path, f"cannot read: {exc.strerror}")
        if len(raw) != 4 * header["n_tokens"]:
            return self.reject(path, "truncated")
        tokens = array("i")
        tokens.frombytes(raw)
        return tokens.tolist()

    def _preamble(self, path: Path, raw: bytes | memoryview) -> int | None:
        """The header's length, if raw starts a file of this format."""
        if len(raw) < _PREAMBLE.size:
            return self.reject(path, "truncated")
        magic, version, header_len = _PREAMBLE.unpack_from(raw)
        if magic != MAGIC:
            return self.reject(path, "not a Reame KV file")
        if version != FORMAT_VERSION:
            return self.reject(path, f"format version {version}, expected {FORMAT_VERSION}")
        return header_len

    def _header(self, path: Path, raw: bytes) -> dict | None:
        try:
            header = json.loads(raw)
            for key in ("n_tokens", "state_bytes"):
                header[key] = int(header[key])
            fingerprint = header["fingerprint"]
        except (ValueError, KeyError, TypeError):
            return self.reject(path, "unreadable header")
        if fingerprint != self.fingerprint:
            return self.reject(path, "made with another model or KV settings")
        return header

    def read(self, path: Path) -> KVEntry | None:
        """The file's tokens and state, or None (counted, logged) if it is not usable."""
        try:
            with path.open("rb") as f:
                # A bytearray, so that the state reaches llama.cpp without another copy.
                data = bytearray(os.fstat(f.fileno()).st_size)
                f.readinto(data)
        except FileNotFoundError:
            return None
        except OSError as exc:
            return self.reject(path, f"cannot read: {exc.strerror}")
        entry = self._parse(path, data)
        if entry is not None:
            os.utime(path)  # recently used: the last to be evicted
        return entry

    def _parse(self, path: Path, data: bytearray) -> KVEntry | None:
        if len(data) < _PREAMBLE.size + _CRC.size:
            return self.reject(path, "truncated")
        header_len = self._preamble(path, data)
        if header_len is None:
            return None
        body, (crc,) = memoryview(data)[:-_CRC.size], _CRC.unpack_from(data, len(data) - _CRC.size)
        if zlib.crc32(body) != crc:
            return self.reject(path, "checksum mismatch (corrupt or truncated)")
        header = self._header(path, bytes(body[_PREAMBLE.size:_PREAMBLE.size + header_len]))
        if header is None:
            return None
        n_tokens, state_bytes = header["n_tokens"], header["state_bytes"]
        start = _PREAMBLE.size + header_len
        if start + 4 * n_tokens + state_bytes != len(body):
            return self.reject(path, "sizes do not add up")
        tokens = array("i")
        tokens.frombytes(body[start:start + 4 * n_tokens])
        state = body[start + 4 * n_tokens:]
        return KVEntry(tokens.tolist(), state)

    def reject(self, path: Path, why: str) -> None:
        """Count and log an unusable file; it is a miss, and the next save replaces it."""
        self.counters.rejected += 1
        log.warning("KV file %s not used: %s", path.name, why)
        return None

    # writing

    def write(self, path: Path, tokens: Sequence[int], state: bytes | memoryview) -> bool:
        """Atomically replace path; False (logged, counted) if the disk refused."""
        header = json.dumps({"fingerprint": self.fingerprint, "n_tokens": len(tokens),
                             "state_bytes": len(state)}).encode()
        token_bytes = array("i", tokens).tobytes()
        crc = zlib.crc32(_PREAMBLE.pack(MAGIC, FORMAT_VERSION, len(header)))
        crc = zlib.crc32(header, crc)
        crc = zlib.crc32(token_bytes, crc)
        crc = zlib.crc32(state, crc)
        tmp = None
        try:
            with tempfile.NamedTemporaryFile(dir=self.folder, suffix=".tmp", delete=False) as f:
                tmp = Path(f.name)
                f.write(_PREAMBLE.pack(MAGIC, FORMAT_VERSION, len(header)))
                f.write(header)
                f.write(token_bytes)
                f.write(state)
                f.write(_CRC.pack(crc))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            self.counters.write_errors += 1
            log.warning("KV file %s not written: %s", path.name, exc)
            if tmp is not None:
                tmp.unlink(missing_ok=True)
            return False
        self.counters.writes += 1
        self.counters.bytes_written += len(state) + len(token_bytes) + len(header)
        self.evict()
        return True

    # housekeeping

    def files(self) -> list[Path]:
        return [p for p in self.folder.glob("*.kv") if p.is_file()]

    def disk_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.files())

    def evict(self) -> int:
        """Delete least recently used files until the folder fits the budget."""
        with self._lock:
            entries = []
            for p in self.files():
                try:
                    st = p.stat()
                except FileNotFoundError:
                    continue
                entries.append((st.st_mtime, st.st_size, p))
            total = sum(size for _, size, _ in entries)
            removed = 0
            for _, size, p in sorted(entries):
                if total <= self.max_bytes:
                    break
                p.unlink(missing_ok=True)
                total -= size
                removed += 1
            self.counters.evicted += removed
            return removed

    def delete_chat(self, chat_id: int) -> None:
        """Every file of the chat, whatever model made it."""
        for p in self.folder.glob(f"chat-{chat_id}-*.kv"):
            p.unlink(missing_ok=True)

    def sweep(self, live_chat_ids: set[int]) -> int:
        """Delete the files of chats that no longer exist; return how many."""
        removed = 0
        for p in self.folder.glob("chat-*-*.kv"):
            try:
                chat_id = int(p.name.split("-")[1])
            except (IndexError, ValueError):
                continue
            if chat_id not in live_chat_ids:
                p.unlink(missing_ok=True)
                removed += 1
        return removed


def fingerprint_tag(fingerprint: str) -> str:
    """A short, file-name-safe tag of a fingerprint."""
    return hashlib.blake2b(fingerprint.encode(), digest_size=6).hexdigest()

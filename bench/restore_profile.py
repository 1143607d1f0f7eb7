"""Where the time of a KV restore goes: reame's restore path, step by step, against a plain
read of the same file, and against the path before it was reworked (kept here to measure it).

reame's restore (KVStore.read + Engine.restore + KVEntry.verified):
  1. the file is mapped (mmap, private), not read into a fresh zero-filled bytearray;
  2. its checksum runs in a second thread while llama.cpp copies the state in (both release the
     GIL); a mismatch clears the KV and the file is a miss. The checksum is xxh3-64 (format 2),
     which ends within llama.cpp's copy; zlib's crc32 (format 1) took longer than the copy;
  3. the context is emptied by marking its cells free (`llama_memory_clear(mem, False)`), not
     by zeroing all n_ctx cells.
The earlier path did each of these the slow way, one after the other.
"""

from __future__ import annotations

import ctypes
import json
import os
import statistics
import time
import zlib
from array import array
from collections.abc import Callable
from pathlib import Path

import llama_cpp

from reame.inference.kv.kvfile import checksum

MB = 1024 * 1024
REAME_NOW = "reame: KVStore.read + Engine.restore + checksum check"
BEFORE = "before the rework: read into a bytearray, crc32, zeroing clear, set_data"


def _timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def read_file(path: Path) -> bytearray:
    """The whole file into one zero-filled bytearray (the earlier KVStore.read)."""
    with path.open("rb") as f:
        data = bytearray(os.fstat(f.fileno()).st_size)
        f.readinto(data)
    return data


def split(data) -> tuple[list[int], memoryview, memoryview, int]:
    """(tokens, body to checksum, state, stored checksum) of a reame KV file."""
    from reame.inference.kv.kvfile import _PREAMBLE, _SUM

    _magic, _version, header_len = _PREAMBLE.unpack_from(data)
    header = json.loads(bytes(data[_PREAMBLE.size:_PREAMBLE.size + header_len]))
    start = _PREAMBLE.size + header_len
    n = int(header["n_tokens"])
    body = memoryview(data)[:-_SUM.size]
    tokens = array("i")
    tokens.frombytes(body[start:start + 4 * n])
    (stored,) = _SUM.unpack_from(data, len(data) - _SUM.size)
    return tokens.tolist(), body, body[start + 4 * n:], stored


def set_state(engine, tokens: list[int], state: memoryview, *, zero_kv: bool) -> bool:
    """llama_state_seq_set_data into an emptied context, then the position checks."""
    ctx = engine.context
    mem = llama_cpp.llama_get_memory(ctx)
    llama_cpp.llama_memory_clear(mem, zero_kv)
    buf = (ctypes.c_uint8 * len(state)).from_buffer(state)
    read = llama_cpp.llama_state_seq_set_data(ctx, buf, len(state), 0)
    return (read == len(state) and llama_cpp.llama_memory_seq_pos_min(mem, 0) == 0
            and llama_cpp.llama_memory_seq_pos_max(mem, 0) == len(tokens) - 1)


def restore_before(engine, path: Path) -> bool:
    """The earlier restore path, every step in sequence. Its checksum was zlib's crc32; files
    now carry xxh3-64, so the crc32 is computed for its cost and not compared."""
    data = read_file(path)
    tokens, body, state, _stored = split(data)
    zlib.crc32(body)
    return set_state(engine, tokens, state, zero_kv=True)


def restore_now(engine, kv, path: Path) -> bool:
    """reame's restore path, as KVCache uses it (the file by its key, its name)."""
    entry = kv.read(path.name)
    if entry is None:
        return False
    with entry:
        ok = engine.restore(entry.tokens, entry.state, entry.batches)
        return entry.verified() and ok


def profile(engine, kv, path: Path, reps: int) -> dict:
    """Median ms and MB/s of each step of the restore path, and of the path before the rework."""
    size = path.stat().st_size
    path.read_bytes()  # warm: every step below reads from the page cache
    tokens, body, state, _stored = split(read_file(path))
    steps: dict[str, Callable[[], object]] = {
        "plain read (Path.read_bytes)": path.read_bytes,
        "crc32 of the file (zlib; format 1's checksum)": lambda: zlib.crc32(body),
        "xxh3-64 of the file (xxhash; the checksum now)": lambda: checksum(body),
        "llama_memory_clear(data=True): zeroes all n_ctx cells": lambda: llama_cpp.llama_memory_clear(
            llama_cpp.llama_get_memory(engine.context), True),
        "llama_state_seq_set_data (after a metadata-only clear)": lambda: _must(
            set_state(engine, tokens, state, zero_kv=False)),
        BEFORE: lambda: _must(restore_before(engine, path)),
        REAME_NOW: lambda: _must(restore_now(engine, kv, path)),
    }
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(reps):
        for name, fn in steps.items():
            times[name].append(_timed(fn))
            engine.clear()
    rows = []
    for name, ts in times.items():
        median = statistics.median(ts)
        rows.append({"step": name, "ms": median * 1000,
                     "mb_per_s": size / MB / median if median else 0.0})
    plain = statistics.median(times["plain read (Path.read_bytes)"])
    now = statistics.median(times[REAME_NOW])
    before = statistics.median(times[BEFORE])
    return {"rows": rows, "file_bytes": size, "tokens": len(tokens), "reps": reps,
            "n_ctx": engine.n_ctx, "ratio": now / plain if plain else None,
            "before_ratio": before / plain if plain else None}


def first_decode(engine, kv, path: Path, new_tokens: list[int]) -> dict:
    """TTFT's other part: the prefill of the new message right after a restore, twice."""
    out = {}
    for attempt in ("first decode after the restore", "the same decode again"):
        _must(restore_now(engine, kv, path))
        out[attempt] = _timed(lambda: engine.extend(new_tokens)) * 1000
        engine.clear()
    return out


def _must(ok: bool) -> None:
    if not ok:
        raise RuntimeError("the KV state was not restored exactly")

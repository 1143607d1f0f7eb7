"""Where the time of a KV restore goes, and a prototype of a faster restore (read-only helper).

`profile(engine, kv, path)` times each step of reame's restore path on one KV file, warm
(the file is read once before; dropping the page cache needs root), against a plain read of
the same file. `overlapped_restore` is the change proposed for reame (not used by reame):
  1. clear the context's KV metadata only (`llama_memory_clear(mem, False)`): reame's
     `Engine.restore` calls `clear()`, which zeroes the whole KV buffer (all n_ctx cells)
     before every restore, a cost that grows with n_ctx, not with the file;
  2. compute the crc32 in a second thread while llama.cpp copies the state in (both release
     the GIL); on a mismatch the KV is cleared and the file is a miss, as today;
  3. (variant) map the file (mmap, private) instead of reading it into a fresh bytearray:
     `bytearray(size)` zero-fills new memory and `readinto` copies into it, two passes over
     the file's size before llama.cpp even starts; a private mapping costs neither (files are
     replaced with os.replace, never truncated in place, so a mapping stays valid).
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import statistics
import threading
import time
import zlib
from array import array
from collections.abc import Callable
from pathlib import Path

import llama_cpp

MB = 1024 * 1024
PROPOSED = "proposed: read, set_data with crc32 overlapped, metadata-only clear"
PROPOSED_MAPPED = "proposed, file mapped (mmap) instead of read"
PROPOSED_DEFERRED = ("proposed, mapped, crc32 still running when set_data returns "
                     "(checked before the first token)")


def _timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def read_file(path: Path) -> bytearray:
    """The whole file into one bytearray (what KVStore.read does)."""
    with path.open("rb") as f:
        data = bytearray(os.fstat(f.fileno()).st_size)
        f.readinto(data)
    return data


def map_file(path: Path) -> mmap.mmap:
    """A private, writable (copy-on-write) mapping of the file: no copy, no allocation."""
    with path.open("rb") as f:
        return mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE,
                         prot=mmap.PROT_READ | mmap.PROT_WRITE)


def split(data) -> tuple[dict, list[int], memoryview, memoryview, int]:
    """(header, tokens, body to checksum, state, stored crc) of a reame KV file."""
    from reame.kvstore import _CRC, _PREAMBLE

    _magic, _version, header_len = _PREAMBLE.unpack_from(data)
    header = json.loads(bytes(data[_PREAMBLE.size:_PREAMBLE.size + header_len]))
    start = _PREAMBLE.size + header_len
    n = int(header["n_tokens"])
    body = memoryview(data)[:-_CRC.size]
    tokens = array("i")
    tokens.frombytes(body[start:start + 4 * n])
    (crc,) = _CRC.unpack_from(data, len(data) - _CRC.size)
    return header, tokens.tolist(), body, body[start + 4 * n:], crc


def set_state(engine, tokens: list[int], state: memoryview, *, zero_kv: bool) -> bool:
    """llama_state_seq_set_data into an emptied context, then the position checks."""
    ctx = engine.llm._ctx.ctx
    mem = llama_cpp.llama_get_memory(ctx)
    llama_cpp.llama_memory_clear(mem, zero_kv)
    buf = (ctypes.c_uint8 * len(state)).from_buffer(state)
    read = llama_cpp.llama_state_seq_set_data(ctx, buf, len(state), 0)
    return (read == len(state) and llama_cpp.llama_memory_seq_pos_min(mem, 0) == 0
            and llama_cpp.llama_memory_seq_pos_max(mem, 0) == len(tokens) - 1)


def overlapped_restore(engine, path: Path, *, mapped: bool = False) -> list[int] | None:
    """The proposed restore: metadata-only clear, crc32 overlapped with the state copy
    (and, if mapped, the file mapped rather than read)."""
    data = map_file(path) if mapped else read_file(path)
    try:
        return _overlapped(engine, data)
    finally:
        if mapped:
            data.close()


def deferred_restore(engine, path: Path) -> Callable[[], bool]:
    """The file mapped and its state set; the crc32 still running in a thread. Returns the
    check to call later (reame would call it after prefilling the new message, before the
    first token leaves: the prefill takes far longer than the crc)."""
    data = map_file(path)
    _header, tokens, body, state, stored = split(data)
    result = {}
    checker = threading.Thread(target=lambda: result.setdefault("crc", zlib.crc32(body)))
    checker.start()
    ok = set_state(engine, tokens, state, zero_kv=False)

    def check() -> bool:
        checker.join()
        good = ok and result["crc"] == stored
        body.release()
        state.release()
        data.close()
        if not good:
            engine.clear()
        return good

    return check


def _overlapped(engine, data) -> list[int] | None:
    _header, tokens, body, state, stored = split(data)
    result = {}
    checker = threading.Thread(target=lambda: result.setdefault("crc", zlib.crc32(body)))
    checker.start()
    ok = set_state(engine, tokens, state, zero_kv=False)
    checker.join()
    if not ok or result["crc"] != stored:
        engine.clear()
        body.release()
        state.release()
        return None
    engine.tokens = list(tokens)
    engine.llm.n_tokens = len(tokens)
    engine.llm.input_ids[: len(tokens)] = tokens
    body.release()
    state.release()
    return tokens


def profile(engine, kv, path: Path, reps: int) -> dict:
    """Median ms and MB/s of each step of the restore path, and of the proposed one."""
    size = path.stat().st_size
    path.read_bytes()  # warm: every step below reads from the page cache
    data = read_file(path)
    _header, tokens, body, state, _crc = split(data)
    steps: dict[str, Callable[[], object]] = {
        "plain read (Path.read_bytes)": path.read_bytes,
        "plain read (readinto a bytearray, as KVStore.read)": lambda: read_file(path),
        "crc32 of the file (zlib)": lambda: zlib.crc32(body),
        "KVStore.read (read + crc32 + parse)": lambda: kv.read(path),
        "llama_memory_clear(data=True): zeroes all n_ctx cells": lambda: llama_cpp.llama_memory_clear(
            llama_cpp.llama_get_memory(engine.llm._ctx.ctx), True),
        "llama_state_seq_set_data (after a metadata-only clear)": lambda: _must(
            set_state(engine, tokens, state, zero_kv=False)),
        "Engine.restore (clear(data=True) + set_data + checks)": lambda: _must(
            engine.restore(tokens, state)),
        "reame today: KVStore.read + Engine.restore": lambda: _must(
            engine.restore(*_entry(kv.read(path)))),
        PROPOSED: lambda: _must(overlapped_restore(engine, path) is not None),
        PROPOSED_MAPPED: lambda: _must(overlapped_restore(engine, path, mapped=True) is not None),
        PROPOSED_DEFERRED: lambda: deferred_restore(engine, path),
    }
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(reps):
        for name, fn in steps.items():
            started = time.perf_counter()
            later = fn()
            times[name].append(time.perf_counter() - started)
            if callable(later):  # a check left running in the background: finish it untimed
                _must(later())
            engine.clear()
    rows = []
    for name, ts in times.items():
        median = statistics.median(ts)
        rows.append({"step": name, "ms": median * 1000,
                     "mb_per_s": size / MB / median if median else 0.0})
    plain = statistics.median(times["plain read (Path.read_bytes)"])
    today = statistics.median(times["reame today: KVStore.read + Engine.restore"])
    proposed = statistics.median(times[PROPOSED])
    mapped = statistics.median(times[PROPOSED_MAPPED])
    deferred = statistics.median(times[PROPOSED_DEFERRED])
    return {"rows": rows, "file_bytes": size, "tokens": len(tokens), "reps": reps,
            "n_ctx": engine.n_ctx, "ratio": today / plain if plain else None,
            "proposed_ratio": proposed / plain if plain else None,
            "proposed_mapped_ratio": mapped / plain if plain else None,
            "proposed_deferred_ratio": deferred / plain if plain else None}


def first_decode(engine, kv, path: Path, new_tokens: list[int]) -> dict:
    """TTFT's other part: the prefill of the new message right after a restore, twice."""
    out = {}
    for attempt in ("first decode after the restore", "the same decode again"):
        entry = kv.read(path)
        _must(engine.restore(entry.tokens, entry.state))
        out[attempt] = _timed(lambda: engine.evaluate(new_tokens)) * 1000
        engine.clear()
    return out


def _entry(entry) -> tuple[list[int], memoryview]:
    _must(entry is not None)
    return entry.tokens, entry.state


def _must(ok: bool) -> None:
    if not ok:
        raise RuntimeError("the KV state was not restored exactly")

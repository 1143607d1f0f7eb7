"""The three systems under test behind one small interface, and the per-turn meter.

- reame:          ChatService with the KV cache on (KVStore in the system's folder)
- no cache:       the same ChatService path with `KVCache(engine, None)`: only the live
                  context is reused, as a server without persistent KV
- LlamaDiskCache: plain llama-cpp-python, `Llama.set_cache(LlamaDiskCache(...))` and
                  `create_chat_completion`; the chats are kept in a JSON file

Each system lives in one folder. `start()` builds a new "process" over it (engine, database,
cache objects: the in-memory context is empty, the files remain); `restart()` is close + start,
in the same Python process.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

log = logging.getLogger(__name__)

SYSTEM_PROMPT = "You are a helpful assistant."
REAME, NO_CACHE, DISK_CACHE = "reame", "no cache", "LlamaDiskCache"
# reame when the chat is opened (its KV restored) before the message is sent, as the page does
REAME_OPENED = "reame, chat opened first"
# The page's path: the chat is opened (its KV restored), then the message typed (what it fixes
# of the prompt evaluated as it is typed), then sent.
REAME_TYPED = "reame, opened and typed ahead"
PAGE_VARIANTS = (REAME_OPENED, REAME_TYPED)
SYSTEMS = (REAME, NO_CACHE, DISK_CACHE)
MB = 1024 * 1024


# measuring a turn


class PeakRSS:
    """Peak resident memory of this process over a block.

    Linux keeps the high-water mark (VmHWM); writing 5 to /proc/self/clear_refs resets it to the
    current RSS, so the peak of one block can be read exactly. Where that is not allowed, a
    thread samples psutil's RSS every 2 ms instead.
    """

    def __init__(self):
        self.process = psutil.Process()
        self.exact = _reset_hwm()
        self.start = self.process.memory_info().rss
        self.peak = self.start
        self._stop = threading.Event()
        self._thread = None
        if not self.exact:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def stop(self) -> int:
        """The peak RSS in bytes since construction."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        now = self.process.memory_info().rss
        hwm = _read_hwm() if self.exact else None
        self.peak = max(self.peak, now, hwm or 0)
        return self.peak


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _read_hwm() is not None
    except OSError:
        return False


def _read_hwm() -> int | None:
    try:
        with open("/proc/self/status") as f:
            found = re.search(r"VmHWM:\s+(\d+)\s+kB", f.read())
    except OSError:
        return None
    return int(found.group(1)) * 1024 if found else None


def bytes_written() -> int:
    """Bytes this process has passed to write() so far (files, SQLite, logs)."""
    return psutil.Process().io_counters().write_chars


@dataclass
class TurnResult:
    """One measured turn."""

    system: str
    ttft_s: float  # from the call to the first streamed token
    total_s: float  # from the call to the end of the turn, saving included
    prompt_tokens: int = 0
    reused: int = 0  # prompt tokens whose KV was not recomputed
    prefilled: int = 0  # prompt tokens evaluated
    evaluated: int = 0  # every token decoded in the turn (prompt + reply)
    generated: int = 0
    source: str = ""  # where the reused KV came from: live / disk / prefix / none
    restore_ms: float = 0.0
    save_ms: float = 0.0
    bytes_written: int = 0
    peak_rss: int = 0
    rss_before: int = 0
    text: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def rss_growth(self) -> int:
        return max(0, self.peak_rss - self.rss_before)


# the systems


class System:
    """A chat server in a folder. Subclasses implement the _methods."""

    name = "system"

    def __init__(self, folder: Path, model: Path, *, n_ctx: int, max_tokens: int,
                 threads: int = 0):
        self.folder, self.model = Path(folder), Path(model)
        self.n_ctx, self.max_tokens = n_ctx, max_tokens
        self.threads = threads  # 0: all cores, as reame's default n_threads
        self.folder.mkdir(parents=True, exist_ok=True)
        self.running = False

    # lifecycle

    def start(self) -> "System":
        """Build a new process over the folder: empty context, files as they are."""
        started = time.perf_counter()
        self._start()
        self.running = True
        log.debug("%s: started in %.2f s", self.name, time.perf_counter() - started)
        return self

    def close(self) -> None:
        if self.running:
            self._close()
            self.running = False
            gc.collect()

    def restart(self) -> None:
        self.close()
        self.start()

    def __enter__(self) -> "System":
        return self if self.running else self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # turns

    def send(self, chat_id: int, text: str) -> TurnResult:
        """Add a user message and generate the reply, measured."""
        return self._measured(lambda: self._send(chat_id, text))

    def edit(self, chat_id: int, user_index: int, text: str) -> TurnResult:
        """Replace the user_index-th user message (0-based), drop what followed, answer it."""
        return self._measured(lambda: self._edit(chat_id, user_index, text))

    def _measured(self, turn) -> TurnResult:
        gc.collect()
        meter = PeakRSS()
        written = bytes_written()
        result: TurnResult = turn()
        result.peak_rss = meter.stop()
        result.rss_before = meter.start
        result.bytes_written = bytes_written() - written
        return result

    # to implement

    def _start(self) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        raise NotImplementedError

    def new_chat(self, system_prompt: str = SYSTEM_PROMPT) -> int:
        raise NotImplementedError

    def insert(self, chat_id: int, pairs: list[tuple[str, str]]) -> None:
        """Add user/assistant message pairs directly, as if the chat had had them."""
        raise NotImplementedError

    def _send(self, chat_id: int, text: str) -> TurnResult:
        raise NotImplementedError

    def _edit(self, chat_id: int, user_index: int, text: str) -> TurnResult:
        raise NotImplementedError

    def count(self, text: str) -> int:
        """Tokens of text for this model (no special tokens added)."""
        raise NotImplementedError


class ServiceSystem(System):
    """Reame's ChatService, with the KV cache on (reame) or off (no cache).

    shift=False: the engine is told it cannot shift its KV (`engine.can_shift = False`, set at
    every start), so when the oldest messages leave a chat's window the kept window is
    re-evaluated instead (scenario 7's comparison)."""

    def __init__(self, folder: Path, model: Path, *, cache: bool, n_ctx: int, max_tokens: int,
                 kv_type: str = "f16", threads: int = 0, shift: bool = True):
        super().__init__(folder, model, n_ctx=n_ctx, max_tokens=max_tokens, threads=threads)
        self.cache_on, self.kv_type, self.shift = cache, kv_type, shift
        self.name = REAME if cache else NO_CACHE
        self.engine = self.store = self.kv = self.service = None

    @property
    def kv_dir(self) -> Path:
        return self.folder / "kv"

    def _start(self) -> None:
        from reame.config.reame_conf import GenerationConfig
        from reame.inference.engine import Engine
        from reame.runtime import service_over

        self.engine = Engine(self.model, n_ctx=self.n_ctx, kv_type=self.kv_type,
                             n_threads=self.threads)
        if not self.shift:
            self.engine.can_shift = False
        defaults = GenerationConfig(system_prompt=SYSTEM_PROMPT, temperature=0.0, top_p=1.0,
                                    max_tokens=self.max_tokens)
        self.service = service_over(self.folder, self.engine, defaults, cache=self.cache_on,
                                    max_disk_bytes=1 << 40, kv_dir=self.kv_dir)
        self.store, self.kv = self.service.store, self.service.cache.files

    def open_chat(self, chat_id: int) -> float:
        """What the page does when a chat is opened (restore its KV ahead); the seconds taken."""
        started = time.perf_counter()
        self.service.restore_ahead(chat_id)
        return time.perf_counter() - started

    def type_ahead(self, chat_id: int, text: str) -> float:
        """What the page does while the message is typed; the seconds taken. The whole message
        at once: a typist's keystrokes arrive slower than each call takes."""
        started = time.perf_counter()
        self.service.type_ahead(chat_id, text)
        return time.perf_counter() - started

    def _close(self) -> None:
        self.service.cache.flush()  # a restart keeps every file a turn queued
        self.engine.close()
        self.store.db.dispose()
        self.engine = self.store = self.kv = self.service = None

    def new_chat(self, system_prompt: str = SYSTEM_PROMPT) -> int:
        return self.service.new_chat(system_prompt=system_prompt).id

    def insert(self, chat_id: int, pairs: list[tuple[str, str]]) -> None:
        for user, reply in pairs:
            self.store.add_message(chat_id, "user", user)
            self.store.add_message(chat_id, "assistant", reply)

    def count(self, text: str) -> int:
        return len(self.engine.tokenize(text))

    def _send(self, chat_id: int, text: str) -> TurnResult:
        return self._run(lambda: self.service.send(chat_id, text, seed=0))

    def _edit(self, chat_id: int, user_index: int, text: str) -> TurnResult:
        users = [m for m in self.store.messages(chat_id) if m.role == "user"]
        target = users[user_index].id
        return self._run(lambda: self.service.edit_message(chat_id, target, text, seed=0))

    def _run(self, start_turn) -> TurnResult:
        before = self.engine.evaluated
        written_ms = self.kv.counters.write_ms if self.kv is not None else 0.0
        started = time.perf_counter()
        first = None
        last = None
        for update in start_turn():
            if first is None:
                first = time.perf_counter()
            last = update
        total = time.perf_counter() - started
        stats = last.stats
        # The KV file is written in the background after the turn; wait for it (untimed) so
        # that it does not overlap the next step, and report how long it took.
        write_ms = 0.0
        if self.kv is not None:
            self.kv.flush()
            write_ms = self.kv.counters.write_ms - written_ms
        return TurnResult(
            self.name, ttft_s=(first or started + total) - started, total_s=total,
            prompt_tokens=stats.prompt_tokens, reused=stats.reused, prefilled=stats.prefilled,
            evaluated=self.engine.evaluated - before, generated=stats.generated,
            source=stats.source, restore_ms=stats.restore_ms, save_ms=stats.save_ms,
            text=last.text, extra={"service_first_token_s": stats.first_token_s,
                                   "prefill_ms": stats.prefill_ms, "write_ms": write_ms,
                                   # the context shift (messages leaving the chat's window)
                                   "shifted": stats.shifted,
                                   "window_recomputed": stats.window_recomputed,
                                   "dropped_messages": stats.dropped_messages},
        )


def _counting_llama_class():
    """A Llama that records (n_tokens before, tokens) for every eval call: its own bookkeeping
    of the reused prefix and of what it actually decodes."""
    from llama_cpp import Llama

    class CountingLlama(Llama):
        def eval(self, tokens):  # noqa: D401 - same contract as Llama.eval
            self.eval_calls.append((self.n_tokens, len(tokens), time.perf_counter()))
            return super().eval(tokens)

        def load_state(self, state):
            started = time.perf_counter()
            super().load_state(state)
            self.loads.append((started, time.perf_counter()))

    return CountingLlama


class DiskCacheSystem(System):
    """Plain llama-cpp-python with its LlamaDiskCache, the closest library feature."""

    name = DISK_CACHE

    def __init__(self, folder: Path, model: Path, *, n_ctx: int, max_tokens: int,
                 threads: int = 0, capacity_bytes: int = 8 << 30):
        super().__init__(folder, model, n_ctx=n_ctx, max_tokens=max_tokens, threads=threads)
        self.capacity_bytes = capacity_bytes
        self.llm = None
        self.cache = None
        self.chats: dict[int, dict] = {}

    @property
    def cache_dir(self) -> Path:
        return self.folder / "llama_disk_cache"

    @property
    def chats_file(self) -> Path:
        return self.folder / "chats.json"

    def _start(self) -> None:
        import os

        from llama_cpp import LlamaDiskCache

        threads = self.threads or os.cpu_count() or 1
        self.llm = _counting_llama_class()(
            model_path=str(self.model), n_ctx=self.n_ctx, n_batch=512, n_threads=threads,
            n_threads_batch=threads, verbose=False)
        self.llm.eval_calls, self.llm.loads = [], []
        self.cache = LlamaDiskCache(cache_dir=str(self.cache_dir),
                                    capacity_bytes=self.capacity_bytes)
        self.llm.set_cache(self.cache)
        self.chats = ({int(k): v for k, v in json.loads(self.chats_file.read_text()).items()}
                      if self.chats_file.exists() else {})

    def _close(self) -> None:
        self.cache.cache.close()
        self.llm.close()
        self.llm = self.cache = None

    def _save_chats(self) -> None:
        self.chats_file.write_text(json.dumps(self.chats))

    def new_chat(self, system_prompt: str = SYSTEM_PROMPT) -> int:
        chat_id = max(self.chats, default=0) + 1
        self.chats[chat_id] = {"system": system_prompt, "messages": []}
        self._save_chats()
        return chat_id

    def insert(self, chat_id: int, pairs: list[tuple[str, str]]) -> None:
        for user, reply in pairs:
            self.chats[chat_id]["messages"] += [{"role": "user", "content": user},
                                                {"role": "assistant", "content": reply}]
        self._save_chats()

    def count(self, text: str) -> int:
        return len(self.llm.tokenize(text.encode(), add_bos=False, special=True))

    def _send(self, chat_id: int, text: str) -> TurnResult:
        return self._complete(chat_id, self.chats[chat_id]["messages"], text)

    def _edit(self, chat_id: int, user_index: int, text: str) -> TurnResult:
        messages = self.chats[chat_id]["messages"]
        users = [i for i, m in enumerate(messages) if m["role"] == "user"]
        return self._complete(chat_id, messages[: users[user_index]], text)

    def _complete(self, chat_id: int, kept: list[dict], text: str) -> TurnResult:
        chat = self.chats[chat_id]
        messages = ([{"role": "system", "content": chat["system"]}] if chat["system"] else [])
        messages += kept + [{"role": "user", "content": text}]
        calls_before, loads_before = len(self.llm.eval_calls), len(self.llm.loads)
        entries_before = len(self.cache.cache)
        started = time.perf_counter()
        first, last, pieces = None, None, []
        # LlamaDiskCache prints to stderr on every save; keep the bench's output readable.
        with contextlib.redirect_stderr(io.StringIO()):
            for chunk in self.llm.create_chat_completion(
                    messages, max_tokens=self.max_tokens, temperature=0.0, seed=0, stream=True):
                last = time.perf_counter()
                first = first or last
                pieces.append(chunk["choices"][0]["delta"].get("content") or "")
        ended = time.perf_counter()
        total = ended - started
        calls = self.llm.eval_calls[calls_before:]
        loaded = self.llm.loads[loads_before:]
        reused, prefilled, prefill_at = calls[0] if calls else (0, 0, started)
        source = "disk" if loaded else ("live" if reused else "none")
        reply = "".join(pieces).strip()
        chat["messages"] = kept + [{"role": "user", "content": text},
                                   {"role": "assistant", "content": reply}]
        self._save_chats()
        return TurnResult(
            self.name, ttft_s=(first or started + total) - started, total_s=total,
            prompt_tokens=reused + prefilled, reused=reused, prefilled=prefilled,
            evaluated=sum(n for _, n, _ in calls), generated=len(calls),
            source=source, text=reply,
            # lookup (unpickling the entry) + load_state, up to the first decode
            restore_ms=(prefill_at - started) * 1000 if loaded else 0.0,
            # the entry is pickled to disk after the last chunk, before the stream ends
            save_ms=(ended - (last or ended)) * 1000,
            extra={"cache_entries_before": entries_before,
                   "cache_entries_after": len(self.cache.cache),
                   "load_state_ms": sum(b - a for a, b in loaded) * 1000,
                   # from the first decode to the first token: the prompt's new tokens
                   # (and the first sample), as reame's TurnStats.prefill_ms
                   "prefill_ms": ((first - prefill_at) * 1000 if calls and first else 0.0)},
        )


def make_system(kind: str, folder: Path, model: Path, *, n_ctx: int, max_tokens: int,
                threads: int = 0) -> System:
    """One of SYSTEMS in folder (not started)."""
    common = dict(n_ctx=n_ctx, max_tokens=max_tokens, threads=threads)
    if kind == REAME:
        return ServiceSystem(folder, model, cache=True, **common)
    if kind == NO_CACHE:
        return ServiceSystem(folder, model, cache=False, **common)
    if kind == DISK_CACHE:
        return DiskCacheSystem(folder, model, **common)
    raise ValueError(f"unknown system {kind!r}: expected one of {', '.join(SYSTEMS)}")

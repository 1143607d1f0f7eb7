"""Stateless conversations (the OpenAI routes): a whole conversation sent with every request.

Nothing is stored but the KV: a conversation's file is found again by its tokens (the cache's
block-hash index, within the asker's scope). For that, a reply resent as text must become the
very tokens that were generated for it: ReplyMemory keeps them, per model and scope.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

from reame.config.files import atomic_file
from reame.config.refusals import MessageTooLong
from reame.inference.kv.blobs import TMP_PREFIX
from reame.inference.prompt import PromptBuilder, PromptMessage
from reame.inference.scope import Scope
from reame.inference.tools import Tool, canonical
from reame.inference.decoding import Decoding
from reame.inference.turn import TurnStats

log = logging.getLogger(__name__)

KNOWN_REPLIES = 1024  # replies whose exact tokens are kept for stateless clients
# A stateless conversation's sampling where its request names none: OpenAI's defaults.
STATELESS_TEMPERATURE = 1.0
STATELESS_TOP_P = 1.0


class ReplyMemory:
    """(model, scope, reply text) -> the exact tokens generated for it, newest last.

    With a path (a file in the KV folder), kept across restarts: a conversation resent after
    a restart then becomes the tokens its KV file holds, rather than its replies re-tokenized
    (a reply whose tokens do not come back the same by re-tokenizing it, e.g. odd runs of a
    small or random model, cut the reuse at the reply). One JSON line per reply remembered,
    the file rewritten when it holds twice as many lines as are kept. A line that does not
    read, or whose tokens are not its text, is skipped: a miss, never another prompt."""

    def __init__(self, size: int = KNOWN_REPLIES, path: Path | None = None):
        self.size, self.path = size, path
        self._tokens: dict[tuple[str, Scope, str], tuple[int, ...]] = {}
        self._unchecked: set[tuple[str, Scope, str]] = set()  # read from the file
        self._lock = threading.Lock()
        self._lines = 0
        # The file is read beside the start (up to about 60 ms for 2,048 lines of 200 tokens),
        # not in its way: a lookup or a reply remembered first waits for it.
        self._loaded = threading.Event()
        if path is None:
            self._loaded.set()
        else:
            threading.Thread(target=self._read, args=(path,), name="reame-replies",
                             daemon=True).start()

    def tokenize(self, prompts: PromptBuilder, system_prompt: str, turns: list[PromptMessage],
                 scope: Scope, tools: tuple[Tool, ...] = ()
                 ) -> tuple[list[PromptMessage], list[int]]:
        """The turns (replies this server wrote with their exact tokens) and the prompt, in
        the vocabulary of prompts' model; too long for its context raises MessageTooLong."""
        known = [self._known(prompts, t, scope) for t in turns]
        prompt = prompts.tokens(system_prompt, known, scope, tools)
        n_ctx = prompts.engine.n_ctx
        if len(prompt) >= n_ctx:
            raise MessageTooLong(
                f"The conversation is {len(prompt):,} tokens; the model's context holds "
                f"{n_ctx:,} tokens. Shorten it and send again.")
        return known, prompt

    def _known(self, prompts: PromptBuilder, turn: PromptMessage,
               scope: Scope) -> PromptMessage:
        """An assistant turn with the exact tokens this server generated for its text, in a
        reply to the same scope (another user's replies must not change this prompt)."""
        if turn.role != "assistant" or turn.tokens is not None:
            return turn
        key = (prompts.engine.fingerprint, scope, turn.content)
        self._loaded.wait()
        with self._lock:
            tokens = self._tokens.get(key)
            unchecked = key in self._unchecked
        if tokens and unchecked:
            if not _are_text(prompts, tokens, turn.content):
                with self._lock:
                    self._tokens.pop(key, None)
                    self._unchecked.discard(key)
                return turn
            with self._lock:
                self._unchecked.discard(key)
        return PromptMessage(turn.role, turn.content, tokens) if tokens else turn

    def remember(self, model: str, scope: Scope, text: str, tokens: list[int]) -> None:
        key = (model, scope, text)
        self._loaded.wait()
        with self._lock:
            self._put(key, tuple(tokens))
            self._unchecked.discard(key)
            if self.path is None:
                return
            try:
                if self._lines >= 2 * self.size:
                    self._rewrite(self.path)
                else:
                    # Only Reame may read it, as its KV files: it holds replies' words.
                    fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                    with open(fd, "a", encoding="utf-8") as out:
                        out.write(_line(key, self._tokens[key]))
                    self._lines += 1
            except OSError as exc:  # kept in memory all the same
                log.warning("could not keep a reply's tokens in %s: %s", self.path, exc)

    def _put(self, key: tuple[str, Scope, str], tokens: tuple[int, ...]) -> None:
        self._tokens.pop(key, None)
        self._tokens[key] = tokens
        while len(self._tokens) > self.size:
            oldest = next(iter(self._tokens))
            del self._tokens[oldest]
            self._unchecked.discard(oldest)

    def _read(self, path: Path) -> None:
        try:
            with open(path, encoding="utf-8", errors="replace") as lines:
                for line in lines:
                    self._lines += 1
                    entry = _entry(line)
                    if entry is not None:
                        self._put(*entry)
                        self._unchecked.add(entry[0])
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("the replies' tokens in %s could not be read: %s", path, exc)
        finally:
            self._unchecked &= self._tokens.keys()
            self._loaded.set()

    def _rewrite(self, path: Path) -> None:
        """The file again with only the replies kept (self._lock held)."""
        # A temporary name the KV folder knows as Reame's (a stale one is removed at start).
        with atomic_file(path, text=True, prefix=TMP_PREFIX, mode=0o600,
                         sync_folder=False) as out:
            for key, tokens in self._tokens.items():
                out.write(_line(key, tokens))
        self._lines = len(self._tokens)


def _line(key: tuple[str, Scope, str], tokens: tuple[int, ...]) -> str:
    model, scope, text = key
    return json.dumps([model, scope, text, list(tokens)], ensure_ascii=False) + "\n"


def _entry(line: str) -> tuple[tuple[str, Scope, str], tuple[int, ...]] | None:
    """A line of the file as (key, tokens), or None if it is not one."""
    try:
        model, scope, text, tokens = json.loads(line)
    except (ValueError, TypeError):
        return None
    if not (isinstance(model, str) and isinstance(scope, str) and isinstance(text, str)
            and isinstance(tokens, list) and tokens
            and all(type(t) is int and t >= 0 for t in tokens)):
        return None
    return (model, Scope(scope), text), tuple(tokens)


def _are_text(prompts: PromptBuilder, tokens: tuple[int, ...], text: str) -> bool:
    """Whether tokens (read from the file) are the model's and spell text."""
    engine = prompts.engine
    if any(t >= engine.n_vocab for t in tokens):
        return False
    try:
        return engine.detokenize(list(tokens)).strip() == text.strip()
    except Exception:  # tokens the model cannot spell: not this text
        return False


class ConversationKeeper:
    """A stateless turn's Keeper (turn.py): its KV file is saved by the runner; a reply that
    ran to its end is remembered with its exact tokens."""

    def __init__(self, memory: ReplyMemory, model: str, scope: Scope):
        self.memory, self.model, self.scope = memory, model, scope

    def alive(self) -> bool:
        return True

    def keep(self, decoding: Decoding, stats: TurnStats) -> None:
        tokens = decoding.exact_tokens
        if tokens is not None:
            text = decoding.text.strip()
            self.memory.remember(self.model, self.scope, text, tokens)
            # A reply that called tools comes back as its parts, which render as this text.
            again = canonical(text)
            if again is not None:
                self.memory.remember(self.model, self.scope, again, tokens)


class PlainKeeper:
    """A raw text completion's Keeper (/v1/completions): its KV file is saved by the runner,
    found again by the tokens of the text resent; there is no reply to remember (the text
    grown by the reply is tokenized whole, as a fresh request's would be)."""

    def alive(self) -> bool:
        return True

    def keep(self, decoding: Decoding, stats: TurnStats) -> None:
        return None

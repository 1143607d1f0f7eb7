"""A stored chat's reply, kept as it streams and at its turn's end (ChatKeeper).

A reply is written into its row while it streams, so that a server that dies mid-reply (a
crash, SIGKILL, llama.cpp aborting the process) loses at most the last WRITE_EVERY_S of it:
the row is added once its first words have been passed on, then its text is updated at most
every WRITE_EVERY_S (one small UPDATE, never per token), each time with text already passed
on. Until its turn ends the row is marked as cut (stopped, its stats UNFINISHED) and holds no
tokens, so a server started after a crash shows it as a reply that was cut, which Continue
goes on from, and no KV is believed to hold what it wrote. The turn's end (keep) completes
that same row with what a reply kept at its end always had: its final text, exact tokens,
stats and stopped flag, as the chat's leaf."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict

from reame.chats.messages import Role
from reame.chats.store import Chat, Message, MessageTree, Store
from reame.chats.tool_calls import kept_calls, words_so_far
from reame.config.refusals import ChatNotFound
from reame.inference.decoding import Decoding
from reame.inference.turn import TurnStats, TurnUpdate

log = logging.getLogger(__name__)

WRITE_EVERY_S = 1.0  # at most this much of a streaming reply is lost when the server dies
# The stats of a reply written while it streams, until its turn's end replaces them: a reply
# whose server stopped before its end keeps them (render shows it as cut, with Continue).
UNFINISHED = {"stopped": True, "unfinished": True}


def unfinished(stats: dict | None) -> bool:
    """Whether a message's stats (as stored) are those of a reply whose turn has not ended:
    being written now (being_written), or cut by the server's stop."""
    return bool(stats) and stats.get("unfinished") is True


# The rows this process is writing as they stream (their turns not ended): a reader of the
# store (the page showing the chat of a /v1 turn) tells them from rows a crash left.
_writing: set[int] = set()
_writing_lock = threading.Lock()


def being_written(message_id: int) -> bool:
    """Whether message_id is a reply this process is still writing."""
    with _writing_lock:
        return message_id in _writing


class ChatKeeper:
    """A stored chat's Keeper (turn.py): the reply becomes the chat's next message, with its
    exact tokens and stats; nothing is kept if the chat was deleted while it answered. kept:
    the chat's MessageTree once the reply is kept: the one read before the turn, with what the
    turn added (nothing else in this process adds to a chat during its turn; another node
    sharing the database may).

    shown() is called by the thread that streams the updates, keep() by the engine's thread
    at the turn's end: a lock orders them, and nothing is written after keep()."""

    def __init__(self, store: Store, chat: Chat, messages: list[Message], model: str,
                 after: int | None, continued: Message | None = None,
                 replaced: int | None = None, id_prefix: str | None = None):
        self.store, self.chat, self.model = store, chat, model
        self.messages = messages  # the chat's, every version, the user's message included
        self.after = after  # the message the reply follows (the user may show another meanwhile)
        # A reply this turn continues (Continue): kept as a new version of it, its text and
        # tokens followed by the turn's.
        self.continued = continued
        # The reply a retry replaces: shown again if the retry keeps none (unmade).
        self.replaced = replaced
        # The title a first message gave the chat (None: not a first message), for the model's
        # own (model_titles.py).
        self.first_title: str | None = None
        # The turn offered tools: the reply's calls are kept apart from its words, their ids
        # starting with id_prefix (None: no tools, the reply is its text).
        self.id_prefix = id_prefix
        self.kept: MessageTree | None = None
        self.text = ""  # the reply's text as kept
        self._lock = threading.Lock()
        self._row: int | None = None  # the reply's row, once written while it streams
        self._written_at = float("-inf")  # time.monotonic() of its last write
        # keep() has run, the chat is gone, or a write failed (a database down: each try
        # could hold the reply up to the stall bound): nothing more is written as it streams.
        self._ended = False

    def alive(self) -> bool:
        return self.store.has_chat(self.chat.id, self.chat.owner)

    def shown(self, update: TurnUpdate) -> None:
        """An update of the reply has been passed on (its text: the whole reply so far, a
        Continue's included): written into the reply's row if it has none yet, or if its last
        write is WRITE_EVERY_S old. A failed write is logged, and the reply goes on without
        more of them (its end writes it whole, as before)."""
        text = update.text if self.id_prefix is None else words_so_far(update.text)
        if (self._ended or update.done or update.queued or not text
                or time.monotonic() - self._written_at < WRITE_EVERY_S):
            return
        with self._lock:
            if self._ended:
                return
            self._written_at = time.monotonic()
            try:
                if self._row is None:
                    self._row = self.store.add_message(
                        self.chat.id, Role.ASSISTANT, text, stats=UNFINISHED,
                        stopped=True, after=self.after, expect_owner=self.chat.owner).id
                    with _writing_lock:
                        _writing.add(self._row)
                elif not self.store.write_so_far(self._row, text):
                    self._ended = True  # the chat was deleted
            except ChatNotFound:  # deleted (or given away) meanwhile: its end keeps nothing
                self._ended = True
            except Exception:  # the end writes it whole; this reply goes on meanwhile
                self._ended = True
                log.exception("chat %d: writing the reply so far failed", self.chat.id)

    def keep(self, decoding: Decoding, stats: TurnStats) -> int:
        """The turn's write at its end, one transaction (Turns._prepare_turn says why there is
        one before): the reply with its stats, as the chat's leaf, its updated time; in the
        row written while it streamed, if any."""
        with self._lock:
            self._ended = True
            reply, tokens = decoding.text, None if decoding.cut else decoding.generated
            if decoding.cut and self.id_prefix is not None:  # before a repeated call
                tokens = decoding.exact_tokens
            if self.continued is not None:
                stats.continued_chars = len(self.continued.content)
                reply = self.continued.content + reply
                earlier = (self.continued.token_list
                           if self.continued.tokens_model == self.model else None)
                tokens = None if tokens is None or earlier is None else earlier + list(tokens)
            self.text = reply.strip() if decoding.finished else reply
            # A reply cut at a stop string holds tokens past its text: re-tokenize it.
            fields = dict(tokens=tokens, tokens_model=self.model, stats=asdict(stats),
                          stopped=stats.stopped, after=self.after,
                          expect_owner=self.chat.owner)
            words = self.text
            if self.id_prefix is not None:  # its calls apart (its tokens hold them as written)
                words, fields["tool_calls"] = kept_calls(self.text, self.id_prefix)
            if self._row is None:
                message = self.store.add_message(self.chat.id, Role.ASSISTANT, words, **fields)
            else:
                message = self.store.end_reply(self.chat.id, self._row, words, **fields)
            self.kept = MessageTree(self.messages + [message], message.id)
            with _writing_lock:
                _writing.discard(self._row)
            return message.id

    def unmade(self) -> None:
        """The turn has ended: if it kept no reply (stopped, or failed, before its reply
        began), a retry's chat shows the reply it was to replace again, not its question
        alone. (A sent or edited message stays, as its turn's first write left it.)"""
        with self._lock:
            self._ended = True
            with _writing_lock:
                _writing.discard(self._row)
        if self.kept is not None or self.replaced is None:
            return
        try:
            self.store.put_leaf_back(self.chat.id, shown=self.after, back_to=self.replaced,
                                     expect_owner=self.chat.owner)
        except ChatNotFound:  # deleted meanwhile: nothing to show
            pass

"""Titles the model writes: after a chat's first reply, a short title in place of the first
words of its first message ([server] model_titles), as ChatGPT and Open WebUI name chats.

Never in a reply's way: the title is a background task of the scheduler (ModelRuntime.
write_aside), which runs only while no turn is on a slot or waiting, and which any turn that
comes stops at its next step; the writer then tries again once the model is idle, for at most
GIVE_UP_S. Its KV is nobody's: a scope of its own per user (the prompt holds the user's
message), no KV file, no snapshot, no chat's slot kept for it. A title the user changed
meanwhile (renamed) is never overwritten: the new one is written only over the title the
first message gave (Store.retitle, in one transaction).

One thread writes the titles, one after another, from a bounded line (MAX_WAITING; beyond, a
chat keeps the first words of its message). pending(user) names the chats whose title is
still to come, so the page can watch its list until they land.
"""

from __future__ import annotations

import logging
import queue
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from reame.chats.documents import split
from reame.chats.titles import shortened
from reame.inference.prompt import PromptMessage
from reame.inference.sampling import Sampling
from reame.inference.scope import Scope
from reame.inference.tasks import Replaced
from reame.inference.turn import Job

log = logging.getLogger(__name__)

MAX_WAITING = 64  # chats whose title waits to be written
GIVE_UP_S = 600.0  # a title not written by then (the model never idle) is not written
RETRY_S = 1.0  # between two tries while the model is busy
MAX_TOKENS = 16
MESSAGE_CHARS, REPLY_CHARS = 600, 300  # of the first exchange, in the title's prompt
SYSTEM = "You name conversations. You answer with a title and nothing else."
ASK = ("Write a title of two to six words for the conversation below, in the language it is "
       "written in. Answer with the title alone: no quotes, no full stop.\n\n"
       "Message: {message}\n\nReply: {reply}")
_MARKS = re.compile(r"^[\s\"'“”‘’*#`_>-]+|[\s\"'“”‘’*`_.:;!-]+$")
_PREFIX = re.compile(r"^(?:title|titre|título|titel|titolo)\s*:\s*", re.IGNORECASE)


def title_scope(owner: str | None) -> Scope:
    """The scope of a user's title prompts: no turn has it (its KV is reused by nobody)."""
    return Scope(f"title:{owner or ''}")


def clean_title(text: str) -> str:
    """The model's answer as a title: its first line, without quotes, Markdown marks, a
    "Title:" or a full stop; "" if nothing is left."""
    line = next((line for line in text.splitlines() if line.strip()), "")
    line = _PREFIX.sub("", _MARKS.sub("", line))
    return shortened(" ".join(_MARKS.sub("", line).split()))


@dataclass(frozen=True)
class _Wanted:
    chat_id: int
    owner: str | None
    first_title: str  # the title the first message gave: only that is replaced
    message: str
    reply: str
    since: float


class TitleWriter:
    """Writes the titles of the chats whose first reply has ended, one at a time."""

    def __init__(self, runtime: Callable[[], object | None],
                 retitle: Callable[[int, str, str], bool], *, enabled: bool = False):
        self._runtime, self._retitle, self.enabled = runtime, retitle, enabled
        self._line: queue.Queue[_Wanted] = queue.Queue(MAX_WAITING)
        self._lock = threading.Lock()
        self._pending: dict[int, str | None] = {}  # chat id -> owner
        self._thread: threading.Thread | None = None

    def after_first_reply(self, chat_id: int, owner: str | None, first_title: str,
                          message: str, reply: str) -> None:
        """A chat's first reply has been kept: write its title when the model is idle."""
        if not self.enabled or not reply.strip():
            return
        wanted = _Wanted(chat_id, owner, first_title, message, reply, time.monotonic())
        with self._lock:
            try:
                self._line.put_nowait(wanted)
            except queue.Full:
                return  # the first words stay
            self._pending[chat_id] = owner
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._write_all, name="reame-titles",
                                                daemon=True)
                self._thread.start()

    def pending(self, owner: str | None) -> frozenset[int]:
        """The chats of owner whose title the model is still to write."""
        with self._lock:
            return frozenset(c for c, o in self._pending.items() if o == owner)

    def _write_all(self) -> None:
        while True:
            try:
                wanted = self._line.get(timeout=5)
            except queue.Empty:
                with self._lock:
                    if self._line.empty():
                        self._thread = None
                        return
                continue
            try:
                self._write(wanted)
            except Exception:  # a title is a nicety: never more than a line in the log
                log.exception("writing the title of chat %d failed", wanted.chat_id)
            finally:
                with self._lock:
                    self._pending.pop(wanted.chat_id, None)

    def _write(self, wanted: _Wanted) -> None:
        while time.monotonic() - wanted.since < GIVE_UP_S:
            runtime = self._runtime()
            if runtime is None:
                return
            try:
                with runtime.lease():
                    job = self._job(runtime, wanted)
                    if len(job.prompt) + MAX_TOKENS > runtime.engine.n_ctx:
                        return  # a context too small for it: the first words stay
                text = runtime.write_aside(job)
            except Replaced:  # a model switch: the next model writes it
                text = None
            if text is not None:
                title = clean_title(text)
                if title and self._retitle(wanted.chat_id, wanted.first_title, title):
                    log.info("chat %d titled by the model", wanted.chat_id)
                return
            time.sleep(RETRY_S)

    @staticmethod
    def _job(runtime, wanted: _Wanted) -> Job:
        documents, typed = split(wanted.message)
        message = typed.strip() or ", ".join(d.name for d in documents)
        ask = ASK.format(message=message[:MESSAGE_CHARS], reply=wanted.reply[:REPLY_CHARS])
        turns = [PromptMessage("user", ask)]
        scope = title_scope(wanted.owner)
        prompt = runtime.prompts.tokens(SYSTEM, turns, scope)
        return Job(prompt, turns, SYSTEM, scope, Sampling(temperature=0.0), MAX_TOKENS,
                   plain=True)

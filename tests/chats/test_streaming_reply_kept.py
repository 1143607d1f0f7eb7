"""A stored chat's reply is written while it streams (reame/chats/chat_keeper.py): a server that
dies mid-reply (SIGKILL, llama.cpp aborting the process) keeps it, cut, as far as it had been
shown up to about a second before, and Continue goes on from it after the restart. The turn's
normal end completes that same row with what it always kept.

In-process with the real model and a real SQLite file, then a real server process killed
mid-reply and started again on the same database."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict

import httpx
import pytest
from sqlalchemy import text

from reame.chats import chat_keeper
from reame.chats.chat_keeper import UNFINISHED, ChatKeeper, unfinished
from reame.config.refusals import ChatNotFound
from reame.inference.turn import TurnUpdate
from reame.web.page.render import BEING_WRITTEN, CUT_BY_RESTART, to_chatbot

from tests.conftest import start_server
from tests.gradio_api import ApiClient

STORY = "Write a very long story about a dragon who learns to sing, with many chapters."


@pytest.fixture
def every_update(monkeypatch):
    """Every update of a reply written (not one a second): the rows are seen as they go."""
    monkeypatch.setattr(chat_keeper, "WRITE_EVERY_S", 0.0)


def last_row(service, chat_id):
    return service.store.tree(chat_id).branch[-1]


def shown_last(service, chat_id) -> str:
    """The chat's last message as the page shows it."""
    _, tree = service.tree(chat_id)
    return to_chatbot(list(tree.branch), tree=tree)[-1]["content"]


def message_count(service) -> int:
    with service.store.db.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM message")).scalar()


def test_a_reply_is_written_as_it_streams_and_its_end_completes_that_row(
        service, every_update, monkeypatch):
    chat = service.new_chat()
    stream = service.send(chat.id, STORY)
    first, second = next(stream), next(stream)
    row = last_row(service, chat.id)
    # Written once passed on (the first update, not the second being passed on now), as cut,
    # without tokens: no KV is believed to hold them before the end.
    assert (row.role, row.content, row.stopped, row.stats_dict) == (
        "assistant", first.text, True, UNFINISHED)
    assert row.token_list is None and row.tokens_model is None
    tree = service.store.tree(chat.id)
    assert tree.leaf_id == row.id
    # Shown from the store meanwhile (the page showing a chat an API client's turn writes):
    # being written, not cut, and no Continue.
    shown = shown_last(service, chat.id)
    assert BEING_WRITTEN in shown and CUT_BY_RESTART not in shown
    assert f"reame-act-continue-{row.id}" not in shown
    third = next(stream)
    assert (last_row(service, chat.id).id, last_row(service, chat.id).content) == (
        row.id, second.text)
    final = [third, *stream][-1]
    assert final.done and final.message_id == row.id
    tree = service.store.tree(chat.id)
    assert [m.role for m in tree.messages] == ["user", "assistant"], "no second row"
    kept = tree.branch[-1]
    assert kept.id == tree.leaf_id == row.id
    assert (kept.content, kept.stopped) == (final.text, False)
    assert kept.stats_dict == asdict(final.stats) and not unfinished(kept.stats_dict)
    assert kept.token_list and kept.tokens_model == service.engine.fingerprint

    # What the same turn keeps with no write while it streams (the reply kept at its end
    # only, as before): the same text, tokens and stats, in one row.
    monkeypatch.setattr(ChatKeeper, "shown", lambda self, update: None)
    other = service.new_chat()
    alone = list(service.send(other.id, STORY))[-1]
    reference = last_row(service, other.id)
    assert (kept.content, kept.token_list, kept.tokens_model, kept.stopped) == (
        reference.content, reference.token_list, reference.tokens_model, reference.stopped)
    assert kept.stats_dict.keys() == reference.stats_dict.keys()
    assert final.stats.generated == alone.stats.generated == kept.stats_dict["generated"]


def test_a_reply_stopped_mid_stream_is_kept_in_the_row_written_so_far(service, every_update):
    chat = service.new_chat()
    stream = service.send(chat.id, STORY)
    seen = [next(stream).text for _ in range(5)]
    row = last_row(service, chat.id)
    stream.close()  # what a Stop does to the generator
    tree = service.store.tree(chat.id)
    stopped = tree.branch[-1]
    assert len(tree.messages) == 2 and stopped.id == row.id == tree.leaf_id
    assert stopped.stopped and stopped.content == seen[-1]
    assert stopped.stats_dict["stopped"] is True and not unfinished(stopped.stats_dict)
    assert stopped.stats_dict["generated"] >= 5


def test_a_failed_write_mid_stream_leaves_the_reply_to_its_end(service, every_update,
                                                                monkeypatch, caplog):
    """A write that fails while the reply streams (a database gone for a moment) is logged,
    no other is tried (each could hold the reply up), and the end writes the reply whole."""
    tries = []

    def failing(message_id, content):
        tries.append(content)
        raise RuntimeError("the database is down")

    monkeypatch.setattr(service.store, "write_so_far", failing)
    chat = service.new_chat()
    updates = list(service.send(chat.id, STORY))
    assert len(tries) == 1 and "writing the reply so far failed" in caplog.text
    tree = service.store.tree(chat.id)
    assert len(tree.messages) == 2 and tree.branch[-1].id == updates[-1].message_id
    assert tree.branch[-1].content == updates[-1].text and not tree.branch[-1].stopped


@pytest.mark.parametrize("updates_before", [1, 3])
def test_a_chat_deleted_mid_reply_keeps_no_row(service, every_update, updates_before):
    """Deleted before the reply's row was written (1: the first update is written only once
    passed on) or after (3): the turn ends with ChatNotFound as before, and no row is left or
    added."""
    chat = service.new_chat()
    stream = service.send(chat.id, STORY)
    for _ in range(updates_before):
        next(stream)
    service.delete_chat(chat.id)
    with pytest.raises(ChatNotFound):
        list(stream)
    assert message_count(service) == 0
    assert service.scheduler.busy == 0


def test_a_retry_streams_into_a_new_version_which_its_end_completes(service, every_update):
    chat = service.new_chat()
    first = list(service.send(chat.id, STORY))[-1]
    stream = service.regenerate(chat.id, seed=7)
    next(stream), next(stream)
    tree = service.store.tree(chat.id)
    row = tree.branch[-1]
    assert row.id != first.message_id and tree.version(row) == (2, 2) and row.stopped
    final = list(stream)[-1]
    tree = service.store.tree(chat.id)
    assert final.message_id == row.id == tree.leaf_id and len(tree.messages) == 3
    assert tree.branch[-1].content == final.text and not tree.branch[-1].stopped
    assert tree.by_id[first.message_id].content == first.text, "the old version stays"


def test_a_reply_cut_by_a_crash_shows_as_cut_and_continue_goes_on_from_it(
        service, every_update, monkeypatch):
    """The row a crash leaves (written while streaming, never ended) is a cut reply: the page
    says so and offers Continue, which makes a new version of it, its text first."""
    chat = service.new_chat()
    question = service.store.add_message(chat.id, "user", STORY)
    keeper = ChatKeeper(service.store, service.store.get_chat(chat.id), [question],
                        service.engine.fingerprint, after=question.id)
    keeper.shown(TurnUpdate("Once upon a time, in a land far away, there lived a dragon"))
    # ... and the process died here: keep() never ran; a new process writes nothing.
    monkeypatch.setattr(chat_keeper, "_writing", set())
    tree = service.store.tree(chat.id)
    cut = tree.branch[-1]
    assert cut.stopped and unfinished(cut.stats_dict) and cut.token_list is None
    shown = shown_last(service, chat.id)
    assert f"reame-act-continue-{cut.id}" in shown and "the server stopped" in shown
    assert CUT_BY_RESTART.split(":")[0] in shown
    # An export says it was cut, and its import keeps it so.
    [copy] = service.import_chats(service.export_file(chat.id)["text"])
    copied = service.messages(copy.id)[-1]
    assert (copied.content, copied.stopped, copied.stats) == (cut.content, True, UNFINISHED)

    stream = service.continue_reply(chat.id)
    first, _ = next(stream), next(stream)
    row = last_row(service, chat.id)
    assert row.id != cut.id and row.content == first.text
    assert row.content.startswith(cut.content) and unfinished(row.stats_dict)
    final = list(stream)[-1]
    tree = service.store.tree(chat.id)
    reply = tree.branch[-1]
    assert reply.id == row.id == final.message_id and tree.version(reply) == (2, 2)
    assert reply.content == final.text and len(reply.content) > len(cut.content)
    assert reply.content.startswith(cut.content) and not reply.stopped
    assert not unfinished(reply.stats_dict) and reply.stats_dict["continued_chars"] == len(
        cut.content)
    shown = shown_last(service, chat.id)
    assert "the server stopped" not in shown and BEING_WRITTEN not in shown


# A real server killed mid-reply.


def model_id(url: str) -> str:
    return httpx.get(url + "v1/models", timeout=30).json()["data"][0]["id"]


class Reader(threading.Thread):
    """Streams a stored chat's turn through /v1 (X-Reame-Chat), noting when each piece of text
    came; it ends when the stream does, however (the server killed)."""

    def __init__(self, url: str, chat_id: int, message: str):
        super().__init__(daemon=True)
        self.url, self.chat_id, self.message = url, chat_id, message
        self.seen: list[tuple[float, str]] = []  # (time.monotonic(), the text so far)
        self.text = ""
        self.finished = False  # [DONE] came: the reply ended before the kill
        self.lock = threading.Lock()

    def run(self) -> None:
        body = {"model": model_id(self.url), "stream": True, "max_tokens": 1000,
                "temperature": 0, "messages": [{"role": "user", "content": self.message}]}
        try:
            with httpx.stream("POST", self.url + "v1/chat/completions", json=body,
                              headers={"X-Reame-Chat": str(self.chat_id)},
                              timeout=120) as answer:
                assert answer.status_code == 200, answer.read()
                for line in answer.iter_lines():
                    if line == "data: [DONE]":
                        self.finished = True
                    elif line.startswith("data: "):
                        for choice in json.loads(line[6:]).get("choices", []):
                            delta = choice.get("delta", {}).get("content") or ""
                            if delta:
                                with self.lock:
                                    self.text += delta
                                    self.seen.append((time.monotonic(), self.text))
        except httpx.HTTPError:
            pass  # the server died

    def shown_by(self, moment: float) -> str:
        with self.lock:
            return next((t for at, t in reversed(self.seen) if at <= moment), "")

    def streamed_s(self) -> float:
        """From the first piece of text to the last one."""
        with self.lock:
            return self.seen[-1][0] - self.seen[0][0] if self.seen else 0.0

    def last_at(self) -> float:
        with self.lock:
            return self.seen[-1][0]


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_reply_survives_the_server_killed_mid_reply_and_continue_goes_on(
        tmp_path, model_path):
    server = start_server(tmp_path / "server", model_path=model_path, max_tokens=16)
    try:
        api = ApiClient(server.url, verbose=False)
        chat_id = api.predict("Dragons", None, api_name="/new_chat")
        reader = Reader(server.url, chat_id, STORY)
        reader.start()
        # Some seconds of reply on screen (however fast this machine writes it).
        deadline = time.monotonic() + 240
        while reader.streamed_s() < 4 * chat_keeper.WRITE_EVERY_S + 1:
            assert time.monotonic() < deadline and reader.is_alive(), reader.text
            time.sleep(0.05)
        killed_at = time.monotonic()
        server.process.kill()  # SIGKILL: no shutdown of any kind
        server.process.wait()
        reader.join(60)
        assert not reader.finished, "the reply ended before the kill: make it longer"
        shown = reader.text  # everything that reached the client, the last bytes included
        # What had been shown a write's interval of streaming (and a second of slack) before
        # the kill, or before the last text if none came since (a loaded machine can stall).
        last = min(killed_at, reader.last_at())
        due = reader.shown_by(last - chat_keeper.WRITE_EVERY_S - 1.0)
        assert due, "nothing was shown early enough to be due"

        server.process = None
        server.start()
        api = ApiClient(server.url, verbose=False)
        messages = api.predict(chat_id, api_name="/get_chat")["messages"]
        assert [m["role"] for m in messages] == ["user", "assistant"], messages
        assert messages[0]["content"] == STORY
        cut = messages[1]
        assert cut["stopped"] is True and cut["stats"] == UNFINISHED, cut
        assert shown.startswith(cut["content"]), (cut["content"], shown)
        assert len(cut["content"]) >= len(due), (cut["content"], due)

        # Continue (the page's, by name): the same reply goes on, a new version of the cut.
        job = api.submit(chat_id, api_name="/continue_reply")
        whole = job.result(timeout=240)
        assert whole.startswith(cut["content"]) and len(whole) > len(cut["content"])
        messages = api.predict(chat_id, api_name="/get_chat")["messages"]
        assert len(messages) == 2, messages
        reply = messages[1]
        assert (reply["content"], reply["version"], reply["versions"]) == (whole, 2, 2)
        assert reply["stopped"] is False and not reply["stats"].get("unfinished"), reply
        assert reply["stats"]["continued_chars"] == len(cut["content"])
    finally:
        server.stop()

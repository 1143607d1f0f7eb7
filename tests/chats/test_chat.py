"""The turn, with the real default model."""

import pytest

from reame.chats.service import ChatService, EmptyMessage, MessageTooLong, NoModel
from reame.chats.window import turns_of
from reame.config.refusals import ChatError, ChatNotFound

from tests.conftest import GREEDY, THREADS
from tests.reference import assert_answers, model_answer


def reply(service, chat_id, text, **kwargs):
    updates = list(service.send(chat_id, text, **kwargs))
    assert updates[-1].done
    return updates


def test_a_turn_streams_and_stores_both_messages(service):
    chat = service.new_chat()
    updates = reply(service, chat.id, "What is the capital city of France? Answer in one word.")
    assert len(updates) > 3, "the reply streams token by token"
    texts = [u.text for u in updates[:-1]]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))
    final = updates[-1]
    assert_answers(final.text,
                   model_answer("What is the capital city of France? Answer in one word."))
    messages = service.store.messages(chat.id)  # the rows, with their tokens
    assert [(m.role, m.content) for m in messages] == [
        ("user", "What is the capital city of France? Answer in one word."), ("assistant", final.text)]
    stats = messages[1].stats_dict
    assert stats["generated"] == final.stats.generated > 0
    assert stats["prefilled"] == stats["prompt_tokens"]
    assert messages[1].token_list and messages[1].tokens_model == service.engine.fingerprint


def test_the_chat_is_titled_from_its_first_message(service):
    chat = service.new_chat()
    reply(service, chat.id, "  Tell me   about the   moon and its phases please, in detail!  ")
    assert service.get_chat(chat.id).title == "Tell me about the moon and its phases please…"
    reply(service, chat.id, "Another question")
    assert service.get_chat(chat.id).title.startswith("Tell me about")


def test_a_continued_chat_evaluates_only_the_new_tokens(service):
    engine = service.engine
    chat = service.new_chat()
    reply(service, chat.id, "Name a colour.")
    kv_after_first = list(engine.tokens)
    before = engine.evaluated
    second = reply(service, chat.id, "Name another one.")[-1].stats
    assert second.reused == len(kv_after_first), "the whole first turn is reused"
    assert second.prefilled == second.prompt_tokens - second.reused
    # Every token the KV holds past the reused ones was evaluated once, and nothing else: the
    # new prompt tokens, the reply, and the next prompt's fixed head, evaluated ahead.
    assert engine.evaluated - before == len(engine.tokens) - second.reused
    reply_tokens = service.store.messages(chat.id)[-1].token_list
    head = engine.tokenize("<|im_end|>\n<|im_start|>user\n")
    assert engine.tokens[second.prompt_tokens:] == reply_tokens + head
    # (plus the reply's last token when max_tokens ended it: it is evaluated only then)
    assert second.ahead in (len(head), len(head) + 1)
    kv_after_second = list(engine.tokens)
    third = reply(service, chat.id, "Thanks.")[-1].stats
    assert third.reused == len(kv_after_second), "the head evaluated ahead is reused too"
    assert engine.tokens[:third.reused] == kv_after_second


def test_empty_message_is_refused(service):
    chat = service.new_chat()
    for text in ("", "   \n "):
        with pytest.raises(EmptyMessage):
            service.send(chat.id, text)
    assert service.messages(chat.id) == []


def test_unknown_chat_is_a_clear_error(service):
    with pytest.raises(ChatNotFound, match="chat 999 does not exist"):
        service.send(999, "hi")


def test_a_message_longer_than_the_context_is_refused_and_the_chat_stays_usable(service):
    chat = service.new_chat()
    reply(service, chat.id, "Hi")
    with pytest.raises(MessageTooLong, match=r"context holds 2,048 tokens"):
        list(service.send(chat.id, "word " * 3000))
    assert len(service.messages(chat.id)) == 2, "nothing is stored for it"
    assert reply(service, chat.id, "Hello again")[-1].text


def test_a_stopped_reply_keeps_its_partial_text(service):
    chat = service.new_chat()
    service.update_settings(chat.id, max_tokens=64)
    stream = service.send(chat.id, "Write a long story about a dragon.")
    seen = [next(stream).text for _ in range(5)]
    stream.close()  # what a Stop does to the generator
    stored = service.messages(chat.id)[-1]
    assert stored.role == "assistant" and stored.stopped
    assert stored.content == seen[-1]
    assert stored.stats["stopped"] is True
    assert service.scheduler.busy == 0  # its slot is free
    assert reply(service, chat.id, "Go on.")[-1].text


@pytest.mark.slow
def test_oldest_messages_are_left_out_when_the_history_outgrows_the_context(store, model_path):
    from reame.inference.engine import Engine
    small = Engine(model_path, n_ctx=256, n_threads=THREADS)
    service = ChatService(store, small, GREEDY)
    chat = service.new_chat()
    service.update_settings(chat.id, max_tokens=40)
    for n in range(8):
        last = reply(service, chat.id, f"Tell me a fact about the number {n}.")[-1]
    assert last.stats.dropped_messages > 0
    assert last.stats.prompt_tokens + 40 <= 256 or last.stats.prompt_tokens <= 256
    assert len(service.messages(chat.id)) == 16, "every message stays stored"


def test_without_a_model_sending_says_why(store):
    service = ChatService(store, None, GREEDY, load_error="Model file not found: /x.gguf")
    chat = service.new_chat()
    with pytest.raises(NoModel, match="Model file not found: /x.gguf"):
        service.send(chat.id, "hi")


def test_settings_are_validated(service):
    chat = service.new_chat()
    with pytest.raises(Exception, match="temperature must be between 0 and 2"):
        service.update_settings(chat.id, temperature=5)
    updated = service.update_settings(chat.id, temperature=0.3, system_prompt="Be brief.")
    assert (updated.temperature, updated.system_prompt) == (0.3, "Be brief.")


def test_each_earlier_message_is_tokenized_once_and_the_prompt_is_unchanged(service,
                                                                             monkeypatch):
    chat = service.new_chat()
    for text in ("Which planet do we live on?", "What is the capital of Italy?"):
        reply(service, chat.id, text)
    turns = turns_of(service.store.messages(chat.id), service.engine.fingerprint)
    builder = service.prompts
    calls = []
    tokenize = service.engine.tokenize

    def counting(text, **kwargs):
        calls.append(text)
        return tokenize(text, **kwargs)

    monkeypatch.setattr(service.engine, "tokenize", counting)
    first = builder.tokens(chat.system_prompt, turns)
    assert calls == [], "every piece (the template's, each message's text) was tokenized already"
    fresh = type(builder)(service.engine)
    assert fresh.tokens(chat.system_prompt, turns) == first, "the same tokens as from scratch"
    assert len(calls) == len(set(calls)), "a new builder tokenizes each distinct piece once"
    assert {chat.system_prompt, "Which planet do we live on?",
            "What is the capital of Italy?"} <= set(calls), "each message's text on its own"
    calls.clear()
    assert fresh.tokens(chat.system_prompt, turns) == first and calls == []


def test_a_turn_writes_in_one_transaction_before_its_reply_and_one_after(service, monkeypatch):
    """A turn's writes of one moment are one transaction: before its reply (the user's
    message, the title of a first message, the rewind of an edit), its reply's row once its
    first words are passed on (then its text at most once per WRITE_EVERY_S, made long here:
    tests/chats/test_streaming_reply_kept.py), and when it ends (the reply, its stats, the chat's
    leaf and time, in that row). The first is not put off to the end: a reload while the reply
    is written shows the message (checked here mid-reply)."""
    from contextlib import closing

    from sqlalchemy import event

    from reame.chats import chat_keeper

    monkeypatch.setattr(chat_keeper, "WRITE_EVERY_S", 3600.0)
    commits = []
    event.listen(service.store.db, "commit", lambda conn: commits.append(1))
    chat = service.new_chat()
    commits.clear()
    stream = service.send(chat.id, "Name a colour.")
    with closing(stream):  # a failed check mid-reply must not leave the turn running
        next(stream)
        assert len(commits) == 1, "the user's message, and the title, in one transaction"
        assert [m.role for m in service.messages(chat.id)] == ["user"]
        assert service.get_chat(chat.id).title == "Name a colour."
        assert list(stream)[-1].done
    assert len(commits) == 3, "the reply's row, then its end: text, stats and leaf in one"
    assert [m.role for m in service.store.tree(chat.id).messages] == ["user", "assistant"]

    first = service.messages(chat.id)[0]
    commits.clear()
    assert list(service.edit_message(chat.id, first.id, "Name a fruit."))[-1].done
    assert len(commits) == 3, "an edit: the rewind and the new version, the row, the reply"
    commits.clear()
    assert list(service.regenerate(chat.id))[-1].done
    assert len(commits) == 3
    tree = service.store.tree(chat.id)
    assert [m.content for m in tree.branch][0] == "Name a fruit."
    assert tree.version(tree.branch[0]) == (2, 2)
    assert tree.version(tree.branch[1]) == (2, 2)
    assert len(tree.messages) == 5, "one row a reply"


def test_a_settings_change_on_a_full_server_stands_without_sharing_the_opening(tmp_path,
                                                                              model_path):
    """Sharing the default prompt's opening is maintenance: on a server whose slots and line
    are full it used to raise ServerBusy out of the settings change (chaos test: a model
    switch answered "Internal error" although the new model was serving)."""
    from reame.inference.engine import Engine
    from reame.runtime import service_over

    engine = Engine(model_path, n_ctx=1024, n_threads=THREADS, slots=1)
    service = service_over(tmp_path, engine, GREEDY, max_waiting=0)
    chat = service.new_chat()
    reply = service.send(chat.id, "Write a long story about a lighthouse.", max_tokens=200)
    next(reply)  # the only slot is taken, and there is no room to wait
    try:
        service.set_defaults(GREEDY.changed(system_prompt="You answer in one short sentence."))
        assert service.defaults.system_prompt == "You answer in one short sentence."
    finally:
        reply.close()
        engine.close()


def test_a_reply_cut_at_max_tokens_continues_reusing_its_kv(service):
    """Continue: the prompt ends inside the cut reply, so its KV is reused whole and only a
    token or so is evaluated; the reply goes on as a new version of it, its text and tokens
    followed by the new ones, and with greedy sampling it is the reply a larger Max tokens
    would have written in one go (compared with that reply, computed here)."""
    question = "Write a short poem about the sea."
    chat = service.new_chat()
    service.update_settings(chat.id, max_tokens=12)
    cut = reply(service, chat.id, question)[-1]
    assert cut.stats.at_limit and cut.stats.generated == 12
    updates = list(service.continue_reply(chat.id))
    done = updates[-1]
    assert done.done and all(u.text.startswith(cut.text) for u in updates if not u.queued)
    assert done.stats.reused >= done.stats.prompt_tokens - 1, done.stats
    assert done.stats.prefilled <= 1, "only the last token is evaluated again"
    assert [(m.role, m.version, m.versions) for m in service.messages(chat.id)] == [
        ("user", 1, 1), ("assistant", 2, 2)], "the cut reply stays as version 1"
    tree = service.store.tree(chat.id)  # the rows, with their tokens
    messages = tree.branch
    assert messages[1].content == done.text
    first = next(m for m in tree.messages if m.role == "assistant" and m.id != messages[1].id)
    assert first.content == cut.text and messages[1].token_list[:12] == first.token_list

    whole = service.new_chat()
    service.update_settings(whole.id, max_tokens=24)
    in_one_go = reply(service, whole.id, question)[-1]
    assert messages[1].token_list == service.store.messages(whole.id)[1].token_list
    assert done.text == in_one_go.text


def test_only_a_reply_can_be_continued(service):
    chat = service.new_chat()
    with pytest.raises(ChatError, match="no reply to continue"):
        service.continue_reply(chat.id)

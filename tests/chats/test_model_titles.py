"""Titles the model writes ([server] model_titles; reame/chats/model_titles.py), on a real
server: after a chat's first reply its title becomes the model's, never while another reply is
being written (a background task that waits for an idle model), never over a title the user
gave, and its KV is no chat's (the chat's next turn continues from its own). The page's list
shows the new title without a reload."""

import json
import threading
import time
import urllib.request

import pytest
from playwright.sync_api import expect

from reame.chats.model_titles import clean_title
from reame.chats.titles import TITLE_LENGTH, title_from
from tests.browser_helpers import CURRENT, browser, new_chat, open_app, page, send  # noqa: F401
from tests.conftest import start_server
from tests.gradio_api import ApiClient

FIRST = "How do I keep basil alive on a windowsill in winter?"


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_path):
    server = start_server(tmp_path_factory.mktemp("titles"), model_path=model_path,
                          model_titles=True, max_tokens=16)
    yield server
    server.stop()


def titles(api: ApiClient) -> dict[int, str]:
    return {chat["id"]: chat["title"] for chat in api.predict(api_name="/list_chats")}


def wait_for_title(api: ApiClient, chat_id: int, old: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        title = titles(api)[chat_id]
        if title != old:
            return title
        time.sleep(0.2)
    raise AssertionError(f"chat {chat_id} kept the title {old!r}")


def long_reply(server, ends: dict[str, int], tokens: int) -> threading.Thread:
    """A stateless /v1 reply of exactly tokens tokens (the end tokens banned), in a thread."""
    with urllib.request.urlopen(server.url + "v1/models", timeout=30) as answer:
        model = json.loads(answer.read())["data"][0]["id"]
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Count on."}],
                       "max_tokens": tokens, "temperature": 0, "logit_bias": ends}).encode()
    request = urllib.request.Request(server.url + "v1/chat/completions", body,
                                     {"Content-Type": "application/json"})
    thread = threading.Thread(target=lambda: urllib.request.urlopen(request, timeout=240).read())
    thread.start()
    return thread


def test_clean_title_keeps_words_not_marks():
    assert clean_title('"Basil in Winter."\nMore text') == "Basil in Winter"
    assert clean_title("Title: **Windowsill herbs**") == "Windowsill herbs"
    assert clean_title("   \n\n") == ""
    assert len(clean_title("word " * 40)) <= TITLE_LENGTH


@pytest.mark.timeout(240)
def test_the_model_titles_a_chat_after_its_first_reply_when_no_reply_is_written(
        server, engine):
    api = ApiClient(server.url, verbose=False)
    ends = {str(t): -100 for t in range(engine.n_vocab) if engine.is_end(t)}
    # A long reply holds the model: the title waits for its end.
    writing = long_reply(server, ends, 200)
    time.sleep(0.5)
    chat = api.predict("", None, api_name="/new_chat")
    api.predict(chat, FIRST, api_name="/send")
    first = title_from(FIRST)
    assert writing.is_alive(), "the long reply ended too soon to show anything"
    assert titles(api)[chat] == first  # not while another reply is written
    writing.join(240)
    title = wait_for_title(api, chat, first)
    assert title and title != first and len(title) <= TITLE_LENGTH, title
    assert "<" not in title and "\n" not in title, title
    # Its KV is no chat's: the chat's next turn continues from its own history.
    api.predict(chat, "And in summer?", api_name="/send")
    stats = api.predict(chat, api_name="/get_chat")["messages"][-1]["stats"]
    assert stats["reused"] > 20 and stats["source"] != "none", stats


@pytest.mark.timeout(240)
def test_a_title_the_user_gave_is_never_overwritten(server, engine):
    api = ApiClient(server.url, verbose=False)
    ends = {str(t): -100 for t in range(engine.n_vocab) if engine.is_end(t)}
    chat = api.predict("", None, api_name="/new_chat")
    writing = long_reply(server, ends, 200)
    time.sleep(0.5)
    api.predict(chat, "What is a good name for a grey cat?", api_name="/send")
    api.predict(chat, "Cat names", api_name="/rename_chat")  # while the title waits
    assert writing.is_alive(), "the long reply ended too soon to show anything"
    writing.join(240)
    # Another chat's title comes after this one's would have: by then this one stayed.
    other = api.predict("", None, api_name="/new_chat")
    api.predict(other, FIRST, api_name="/send")
    wait_for_title(api, other, title_from(FIRST))
    assert titles(api)[chat] == "Cat names"


@pytest.mark.timeout(180)
def test_the_page_s_list_shows_the_model_s_title_without_a_reload(page, server):  # noqa: F811
    open_app(page, server)
    new_chat(page)
    send(page, FIRST)
    title = page.locator(f"{CURRENT} .reame-title")
    expect(title).not_to_have_text(title_from(FIRST), timeout=60_000)
    expect(title).not_to_have_text("New chat")


@pytest.mark.timeout(120)
def test_a_context_too_small_for_the_title_s_prompt_keeps_the_first_words(
        tmp_path, model_path, caplog):
    """The title's prompt (the first exchange, up to 900 characters) is measured against the
    context before llama.cpp sees it: a context it does not fit keeps the first words, and
    nothing fails in the log."""
    from reame.chats.service import ChatService
    from reame.chats.store import Store
    from reame.inference.engine import Engine
    from tests.conftest import GREEDY, THREADS

    engine = Engine(model_path, n_ctx=256, n_threads=THREADS)
    service = ChatService(Store(tmp_path / "reame.db"), engine, GREEDY, model_titles=True)
    try:
        chat = service.new_chat("Basil notes")
        # The first exchange as it was kept: with the question around it, over 256 tokens.
        message, reply = "Basil 1234 5678 leaves. " * 25, "Basil likes 20 to 25 degrees. " * 10
        service.titles.after_first_reply(chat.id, None, "Basil notes", message, reply)
        deadline = time.monotonic() + 60
        while service.titles.pending(None) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not service.titles.pending(None)
        assert service.list_chats()[0].title == "Basil notes"
        assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text
    finally:
        engine.close()

"""The named API endpoints, through gradio_client against a real server process."""

import time

import pytest

from tests.conftest import start_server
from tests.gradio_api import ApiClient
from tests.reference import assert_answers, model_answer


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_path):
    """One server for the tests whose chats never meet (each makes and reads its own); a test
    that lists every chat or restarts the server has a server of its own."""
    server = start_server(tmp_path_factory.mktemp("api"), model_path=model_path)
    yield server
    server.stop()


def client_for(server) -> ApiClient:
    return ApiClient(server.url, verbose=False)


@pytest.mark.slow
def test_every_chat_action_by_name_and_the_chats_survive_a_restart(server_factory):
    server = server_factory()
    client = client_for(server)
    chat_id = client.predict("Geography", "You are a terse assistant.", api_name="/new_chat")
    assert isinstance(chat_id, int)

    job = client.submit(chat_id, "What is the capital city of France? Answer in one word.", api_name="/send")
    chunks = list(job)
    assert len(chunks) > 2, "the reply streams"
    assert all(b.startswith(a) for a, b in zip(chunks, chunks[1:]))
    final = job.result()
    assert final == chunks[-1]
    terse = "You are a terse assistant."
    assert_answers(final, model_answer("What is the capital city of France? Answer in one word.",
                                    system_prompt=terse))

    other = client.predict("", None, api_name="/new_chat")
    listed = client.predict(api_name="/list_chats")
    assert [c["id"] for c in listed] == [other, chat_id]

    chat = client.predict(chat_id, api_name="/get_chat")
    assert chat["title"] == "Geography"
    assert chat["system_prompt"] == "You are a terse assistant."
    roles = [(m["role"], m["content"]) for m in chat["messages"]]
    assert roles == [("user", "What is the capital city of France? Answer in one word."), ("assistant", final)]
    stats = chat["messages"][1]["stats"]
    assert stats["generated"] > 0 and stats["prefilled"] == stats["prompt_tokens"]

    renamed = client.predict(chat_id, "Capitals", api_name="/rename_chat")
    assert renamed["title"] == "Capitals"
    tuned = client.predict(chat_id, None, 0.0, None, 48, api_name="/update_chat")
    assert (tuned["system_prompt"], tuned["temperature"], tuned["max_tokens"]) == (
        "You are a terse assistant.", 0.0, 48)
    with pytest.raises(Exception, match="temperature must be between 0 and 2"):
        client.predict(chat_id, None, 5.0, None, None, api_name="/update_chat")
    assert client.predict(other, api_name="/delete_chat") is True

    server.restart()
    client = client_for(server)
    base = client.predict(api_name="/cache_stats")  # the totals kept across the restart
    listed = client.predict(api_name="/list_chats")
    assert [(c["id"], c["title"]) for c in listed] == [(chat_id, "Capitals")]
    again = client.predict(chat_id, api_name="/get_chat")
    assert [m["content"] for m in again["messages"]] == [m["content"] for m in chat["messages"]]
    follow_up = client.predict(chat_id, "Which planet do we live on?", api_name="/send")
    assert_answers(follow_up, model_answer(
        "What is the capital city of France? Answer in one word.", final,
        "Which planet do we live on?", system_prompt=terse), n=1)
    # The new process restored the chat's KV from its file: only the new tokens were computed.
    stats = client.predict(chat_id, api_name="/get_chat")["messages"][-1]["stats"]
    assert stats["source"] == "disk"
    assert stats["reused"] > 20 and stats["prefilled"] == stats["prompt_tokens"] - stats["reused"]
    assert stats["prefilled"] < 20
    cache = client.predict(api_name="/cache_stats")
    assert cache["enabled"] and cache["files"] >= 1 and cache["disk_bytes"] > 0
    assert cache["hits"] - base["hits"] == 1
    assert cache["tokens_restored"] - base["tokens_restored"] == stats["reused"]


@pytest.mark.slow
def test_regenerate_and_edit_through_the_api(server):
    client = client_for(server)
    chat_id, before = two_turns(client, "t")

    job = client.submit(chat_id, api_name="/regenerate")
    regenerated = job.result()
    after = client.predict(chat_id, api_name="/get_chat")["messages"]
    assert len(after) == 4 and after[-1]["content"] == regenerated
    # The prompt is live with its last decode's logits kept: nothing is evaluated again.
    stats = after[-1]["stats"]
    assert stats["prefilled"] == 0 and stats["reused"] == stats["prompt_tokens"]

    second_user = before[2]
    edited = client.predict(chat_id, second_user["id"], "Say goodbye.", api_name="/edit_message")
    after = client.predict(chat_id, api_name="/get_chat")["messages"]
    assert [m["content"] for m in after[:3]] == [before[0]["content"], before[1]["content"],
                                                 "Say goodbye."]
    assert after[-1]["content"] == edited and len(after) == 4
    assert after[-1]["stats"]["reused"] >= after[-1]["stats"]["prompt_tokens"] - 12
    with pytest.raises(Exception, match="only the user's messages can be edited"):
        client.predict(chat_id, after[1]["id"], "x", api_name="/edit_message")


def test_continue_reply_through_the_api_goes_on_from_the_cut_reusing_its_kv(server):
    """/continue_reply (the page's Continue): a reply cut at the chat's max_tokens goes on,
    streamed whole, its text first; the prompt ends inside it, so only its last token or so is
    evaluated again."""
    client = client_for(server)
    chat_id = client.predict("Go on", None, api_name="/new_chat")
    client.predict(chat_id, None, None, None, 10, api_name="/update_chat")
    client.predict(chat_id, "Write a long story about a dragon.", api_name="/send")
    cut = client.predict(chat_id, api_name="/get_chat")["messages"][-1]
    assert cut["stats"]["at_limit"] and cut["stats"]["generated"] == 10, cut["stats"]
    job = client.submit(chat_id, api_name="/continue_reply")
    whole = job.result()
    assert all(text.startswith(cut["content"]) for text in job.outputs() if text), job.outputs()
    reply = client.predict(chat_id, api_name="/get_chat")["messages"][-1]
    assert reply["content"] == whole and len(whole) > len(cut["content"])
    assert reply["stats"]["prefilled"] <= 1, reply["stats"]
    assert reply["stats"]["reused"] >= reply["stats"]["prompt_tokens"] - 1, reply["stats"]
    with pytest.raises(Exception, match="no reply to continue"):
        client.predict(client.predict("", None, api_name="/new_chat"),
                       api_name="/continue_reply")


def test_type_ahead_evaluates_a_draft_that_send_then_reuses(server):
    client = client_for(server)
    chat_id = client.predict("", None, api_name="/new_chat")
    question = "What is the capital of Italy?"
    typed = client.predict(chat_id, question[:20], api_name="/type_ahead")
    assert typed > 0
    typed += client.predict(chat_id, question, api_name="/type_ahead")
    assert client.predict(chat_id, question, api_name="/type_ahead") == 0, "nothing new"
    # (Typed ahead or not, the reply is the same: test_reproducible checks it.)
    assert client.predict(chat_id, question, api_name="/send").strip()
    stats = client.predict(chat_id, api_name="/get_chat")["messages"][1]["stats"]
    # The draft as sent was evaluated while typing: the send evaluates nothing more.
    assert stats["typed_ahead"] > 0 and stats["prefilled"] == 0
    assert stats["reused"] + stats["prefilled"] == stats["prompt_tokens"]
    with pytest.raises(Exception, match="chat 999999 does not exist"):
        client.predict(999999, "hi", api_name="/type_ahead")


def test_unknown_chat_ids_give_a_clear_error(server):
    client = client_for(server)
    for api_name, args in [("/get_chat", (4242,)), ("/rename_chat", (4242, "x")),
                           ("/delete_chat", (4242,)), ("/send", (4242, "hi"))]:
        with pytest.raises(Exception, match="chat 4242 does not exist"):
            client.predict(*args, api_name=api_name)


def test_an_empty_message_is_refused_by_the_api(server):
    client = client_for(server)
    chat_id = client.predict("t", None, api_name="/new_chat")
    with pytest.raises(Exception, match="the message is empty"):
        client.predict(chat_id, "   ", api_name="/send")
    assert client.predict(chat_id, api_name="/get_chat")["messages"] == []


def test_a_missing_model_leaves_the_server_up_and_says_why(server_factory, tmp_path):
    server = server_factory(model_path="models/not-here.gguf")
    client = client_for(server)
    chat_id = client.predict("t", None, api_name="/new_chat")
    with pytest.raises(Exception) as info:
        client.predict(chat_id, "hello", api_name="/send")
    message = str(info.value)
    assert "Model file not found" in message and "not-here.gguf" in message
    assert client.predict(api_name="/list_chats")[0]["id"] == chat_id


def test_a_malformed_config_stops_the_start_naming_the_line(tmp_path):
    import subprocess
    import sys

    from tests.conftest import ROOT

    bad = tmp_path / "reame.conf"
    bad.write_text("[model]\nn_ctx = 2048\nn_threads 4\n")
    result = subprocess.run([sys.executable, str(ROOT / "app.py"), "--config", str(bad)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "line 3: n_threads 4" in result.stderr


def two_turns(client, title: str, first: str = "Say hello.") -> tuple[int, list[dict]]:
    """A new chat with two turns; its id and messages."""
    chat_id = client.predict(title, None, api_name="/new_chat")
    client.predict(chat_id, first, api_name="/send")
    client.predict(chat_id, "Which planet do we live on?", api_name="/send")
    return chat_id, client.predict(chat_id, api_name="/get_chat")["messages"]


@pytest.mark.slow
def test_versions_and_branches_through_the_api(server):
    client = client_for(server)
    # Another opening than the other tests' chats: the branch's KV can come only from its own.
    chat_id, before = two_turns(client, "", first="Say hi to me.")
    assert [m["version"] for m in before] == [1, 1, 1, 1]
    edited = client.predict(chat_id, before[2]["id"], "Say goodbye.", api_name="/edit_message")
    shown = client.predict(chat_id, api_name="/get_chat")["messages"]
    assert shown[-1]["content"] == edited
    assert (shown[2]["version"], shown[2]["versions"]) == (2, 2)
    assert shown[2]["parent_id"] == before[1]["id"]
    thread = client.predict(chat_id, api_name="/get_thread")
    assert len(thread["messages"]) == 6 and thread["leaf_id"] == shown[-1]["id"]
    back = client.predict(chat_id, before[2]["id"], api_name="/show_version")
    assert [m["content"] for m in back["messages"]] == [m["content"] for m in before]

    branch_id = client.predict(chat_id, before[1]["id"], api_name="/branch")
    branch = client.predict(branch_id, api_name="/get_chat")
    assert branch["branched_from"] == chat_id
    assert [m["content"] for m in branch["messages"]] == [m["content"] for m in before[:2]]
    client.predict(branch_id, "Name a colour.", api_name="/send")
    stats = client.predict(branch_id, api_name="/get_chat")["messages"][-1]["stats"]
    assert stats["source"] in ("live", "branch") and stats["reused"] > 20
    assert stats["prefilled"] == stats["prompt_tokens"] - stats["reused"]
    with pytest.raises(Exception, match="not in"):
        client.predict(branch_id, before[3]["id"], api_name="/show_version")


@pytest.mark.slow
def test_an_idle_server_leaves_the_cpu_to_the_model(server):
    """Gradio's queue alone looked for new events every millisecond: 9 % of a core here while
    nothing happened, taken from llama.cpp's threads while they decoded
    (reame/web/http/queue_polling.py). An idle server now uses a few percent at most, and an
    event sent to it is still answered."""
    import psutil

    process = psutil.Process(server.process.pid)
    client = client_for(server)
    client.predict(api_name="/list_chats")
    time.sleep(1.0)  # what the call set going (its event stream, the KV writer) winds down
    before, started = process.cpu_times(), time.monotonic()
    time.sleep(3.0)
    after, elapsed = process.cpu_times(), time.monotonic() - started
    used = (after.user + after.system - before.user - before.system) / elapsed
    assert used < 0.05, f"{used:.1%} of a core while idle"
    assert isinstance(client.predict(api_name="/list_chats"), list)

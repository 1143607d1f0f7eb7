"""Custom instructions (reame/chats/instructions.py) on a real server with accounts, through the
named API: a user's new chats take them into their system prompt; the opening they make is read
once, so a second new chat evaluates only its message, also after a restart; another user with
the same words starts from their own KV; the chats already started keep theirs."""

import pytest

from reame.chats.instructions import ABOUT_HEADING, HOW_HEADING, MAX_CHARS
from tests.conftest import start_server
from tests.gradio_api import ApiClient

PASSWORDS = {"alice": "alice-pass-123", "bob": "bob-pass-456"}
# About a hundred tokens: the opening is several whole chunks, more than the default's.
HOW = ("Answer in two short sentences at most. Use metric units. Say plainly when you are "
       "not sure, and never invent a source, a quotation or a number you do not know.")
ABOUT = ("I coordinate volunteers at a harbour co-op in Lisbon: we repair small fishing "
         "boats, run a tool library and teach knots to children on Saturday mornings.")


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_path):
    server = start_server(tmp_path_factory.mktemp("instructions"), model_path=model_path,
                          users=PASSWORDS, max_tokens=8)
    yield server
    server.stop()


def client(server, name: str) -> ApiClient:
    return ApiClient(server.url, auth=(name, PASSWORDS[name]), verbose=False)


def turn(api: ApiClient, message: str) -> dict:
    """A new chat's first turn: the chat as /get_chat gives it, and its reply's stats."""
    chat_id = api.predict("", None, api_name="/new_chat")
    api.predict(chat_id, message, api_name="/send")
    chat = api.predict(chat_id, api_name="/get_chat")
    return {"chat": chat, "stats": chat["messages"][-1]["stats"]}


@pytest.mark.timeout(240)
def test_a_second_new_chat_starts_from_the_users_instructions_and_evaluates_only_its_message(
        server):
    alice, bob = client(server, "alice"), client(server, "bob")
    kept = alice.predict(f"  {HOW}  ", ABOUT, api_name="/set_instructions")
    assert kept == {"how_to_answer": HOW, "about_me": ABOUT}
    assert alice.predict(api_name="/get_instructions") == kept
    assert bob.predict(api_name="/get_instructions") == {"how_to_answer": "", "about_me": ""}

    first = turn(alice, "What knot holds a boat to a ring?")
    prompt = first["chat"]["system_prompt"]
    assert HOW in prompt and ABOUT in prompt and ABOUT_HEADING in prompt and HOW_HEADING in prompt
    opening = first["stats"]["prefilled"]  # the opening and the message, evaluated once
    assert opening > 100, first["stats"]

    second = turn(alice, "And for a rope to a post?")
    stats = second["stats"]
    # Only the message (and the template's words around it) is evaluated.
    assert stats["prefilled"] <= 24, stats
    assert stats["reused"] >= opening - 24, stats

    # After a restart, from disk.
    server.restart()
    alice, bob = client(server, "alice"), client(server, "bob")
    third = turn(alice, "Which knot for a ladder?")["stats"]
    assert third["prefilled"] <= 24 and third["source"] != "none", third

    # Bob, with the very same words, starts from his own KV: the opening is evaluated for him.
    bob.predict(HOW, ABOUT, api_name="/set_instructions")
    bobs = turn(bob, "What knot holds a boat to a ring?")["stats"]
    assert bobs["prefilled"] > 100, bobs
    assert bobs["reused"] < 64, bobs  # at most the default system prompt's shared opening


@pytest.mark.timeout(120)
def test_chats_already_started_keep_their_prompt_and_long_or_cleared_instructions(server):
    alice = client(server, "alice")
    alice.predict("Be brief.", "", api_name="/set_instructions")
    before = alice.predict("", None, api_name="/new_chat")
    alice.predict("Be very formal.", "", api_name="/set_instructions")
    assert "Be brief." in alice.predict(before, api_name="/get_chat")["system_prompt"]
    after = alice.predict("", None, api_name="/new_chat")
    assert "Be very formal." in alice.predict(after, api_name="/get_chat")["system_prompt"]
    # A system prompt given with /new_chat replaces both.
    own = alice.predict("", "You are a pirate.", api_name="/new_chat")
    assert alice.predict(own, api_name="/get_chat")["system_prompt"] == "You are a pirate."

    with pytest.raises(Exception, match=f"How to answer has {MAX_CHARS + 1:,} characters"):
        alice.predict("x" * (MAX_CHARS + 1), "", api_name="/set_instructions")
    assert alice.predict(api_name="/get_instructions")["how_to_answer"] == "Be very formal."

    assert alice.predict("", "", api_name="/set_instructions") == {
        "how_to_answer": "", "about_me": ""}
    plain = alice.predict("", None, api_name="/new_chat")
    default = client(server, "bob").predict("", "", api_name="/set_instructions")
    assert default == {"how_to_answer": "", "about_me": ""}
    prompt = alice.predict(plain, api_name="/get_chat")["system_prompt"]
    assert HOW_HEADING not in prompt and ABOUT_HEADING not in prompt

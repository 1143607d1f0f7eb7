"""The agents' APIs on a server with accounts, over HTTP: Anthropic's /v1/messages takes the key
as x-api-key (a wrong or missing one is a 401 in Anthropic's shape); a stored response of
/v1/responses is its user's (another user's id is a 404 to GET and DELETE, and cannot be
continued), and the responses kept per user are bounded and expire; another website's page
can send neither a request nor a form to them."""

from __future__ import annotations

import json

import anthropic
import pytest
from openai import BadRequestError, NotFoundError, OpenAI

from reame.chats.store import Store
from reame.chats.store.stored_responses import ResponseNotFound, StoredResponses
from tests.accounts.test_accounts import v1
from tests.conftest import Server, start_server
from tests.whole.test_security import MODEL, raw

USERS = {"alice": "alice-secret-1", "bob": "bob-secret-22"}


@pytest.fixture(scope="module")
def guarded(tmp_path_factory, model_path):
    """A server with accounts: alice and bob, each with an API key."""
    server = start_server(tmp_path_factory.mktemp("agents"), model_path=model_path,
                          max_tokens=8, users=USERS, keys=True)
    yield server, server.keys
    server.stop()


def claude(server: Server, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url.rstrip("/"), api_key=key, max_retries=0,
                               timeout=120)


def test_messages_take_the_key_as_x_api_key_and_refuse_a_wrong_one(guarded):
    server, keys = guarded
    hello = [{"role": "user", "content": "Say hello."}]
    reply = claude(server, keys["alice"]).messages.create(model="m", max_tokens=4,
                                                          messages=hello)
    assert reply.usage.output_tokens > 0
    with pytest.raises(anthropic.AuthenticationError) as refused:
        claude(server, "rk-wrong").messages.create(model="m", max_tokens=4, messages=hello)
    assert refused.value.body["error"]["type"] == "authentication_error"
    status, answer = v1(server, "messages", body={"model": "m", "max_tokens": 4,
                                                  "messages": hello})
    assert status == 401 and answer["type"] == "error", answer
    status, _ = v1(server, "messages/count_tokens", key=keys["bob"],
                   body={"model": "m", "messages": hello})
    assert status == 200


def gpt(server: Server, key: str) -> OpenAI:
    return OpenAI(base_url=server.url + "v1", api_key=key, max_retries=0, timeout=120)


def test_another_users_response_id_is_a_404_and_cannot_be_continued(guarded):
    server, keys = guarded
    alice, bob = gpt(server, keys["alice"]), gpt(server, keys["bob"])
    secret = alice.responses.create(model=MODEL, input="My PIN is 4827. Remember it.")
    assert alice.responses.retrieve(secret.id).id == secret.id
    with pytest.raises(NotFoundError):
        bob.responses.retrieve(secret.id)
    with pytest.raises(NotFoundError):
        bob.responses.delete(secret.id)
    with pytest.raises(NotFoundError):
        bob.responses.input_items.list(secret.id)
    with pytest.raises(BadRequestError) as refused:
        bob.responses.create(model=MODEL, input="What is my PIN?",
                             previous_response_id=secret.id)
    # the same answer as for an id nobody made: nothing tells that it exists
    with pytest.raises(BadRequestError) as unknown:
        bob.responses.create(model=MODEL, input="What is my PIN?",
                             previous_response_id="resp_" + "0" * 32)
    assert (refused.value.body["code"] == unknown.value.body["code"]
            == "previous_response_not_found")
    assert alice.responses.retrieve(secret.id).id == secret.id, "still alice's"
    followed = alice.responses.create(model=MODEL, input="What is it?",
                                      previous_response_id=secret.id)
    assert followed.usage.input_tokens_details.cached_tokens > secret.usage.input_tokens


def test_the_responses_kept_per_user_are_bounded_and_expire(tmp_path):
    stored = StoredResponses(Store(tmp_path / "reame.db"), max_per_user=3)
    stored.save("resp_bob", "bob", None, {"n": "bob"})
    for n in range(5):
        stored.save(f"resp_{n}", "alice", None, {"n": n})
    for n in (0, 1):  # alice's oldest went first, beyond her 3
        with pytest.raises(ResponseNotFound):
            stored.get(f"resp_{n}", "alice")
    assert [stored.get(f"resp_{n}", "alice")[1]["n"] for n in (2, 3, 4)] == [2, 3, 4]
    assert stored.get("resp_bob", "bob")[1] == {"n": "bob"}, "another user's stay"
    by_bytes = StoredResponses(stored.store, max_bytes_per_user=2000)
    for n in range(4):
        by_bytes.save(f"resp_big{n}", "dave", None, {"text": "x" * 900})
    with pytest.raises(ResponseNotFound):
        by_bytes.get("resp_big1", "dave")
    assert [by_bytes.get(f"resp_big{n}", "dave")[0] for n in (2, 3)] == [None, None]
    assert stored.get("resp_4", "alice")[1]["n"] == 4, "another user's stay"
    expired = StoredResponses(stored.store, max_age_s=-1)
    with pytest.raises(ResponseNotFound):
        expired.get("resp_bob", "bob")
    expired.save("resp_new", "carol", None, {})  # a write removes what has expired
    with pytest.raises(ResponseNotFound):
        stored.get("resp_bob", "bob")


def test_another_site_cannot_post_to_the_agents_apis(guarded):
    """A page of another origin, with the victim's key in hand or not: its JSON POST is refused
    before it is read (403, no CORS header), so is its preflight; a form or text/plain body,
    which a page can send without a preflight, is not JSON (415). Keyed clients (no Origin)
    are served."""
    server, keys = guarded
    bodies = {"v1/messages": {"model": "m", "max_tokens": 8,
                              "messages": [{"role": "user", "content": "Hi"}]},
              "v1/responses": {"model": MODEL, "max_output_tokens": 8, "input": "Hi"}}
    for path, body in bodies.items():
        url, data = server.url + path, json.dumps(body).encode()
        key = {"Authorization": f"Bearer {keys['alice']}"}
        json_type = {**key, "Content-Type": "application/json"}
        status, headers, text = raw(url, method="POST", body=data,
                                    headers={**json_type, "Origin": "https://evil.example"})
        assert status == 403 and headers.get("Access-Control-Allow-Origin") is None, (
            path, status, text)
        status, _, _ = raw(url, method="OPTIONS", headers={
            "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
        assert status == 403, path
        status, _, text = raw(url, method="POST", body=data,
                              headers={**key, "Content-Type": "text/plain"})
        assert status == 415, (path, status, text)
        assert raw(url, method="POST", body=data, headers=json_type)[0] == 200, path

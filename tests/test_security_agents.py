"""The agents' APIs on a server with accounts, over HTTP: Anthropic's /v1/messages takes the key
as x-api-key (a wrong or missing one is a 401 in Anthropic's shape)."""

from __future__ import annotations

import anthropic
import pytest

from .conftest import Server, write_config
from .test_accounts import cli, v1

USERS = {"alice": "alice-secret-1", "bob": "bob-secret-22"}


@pytest.fixture(scope="module")
def guarded(tmp_path_factory, model_path):
    """A server with accounts: alice and bob, each with an API key."""
    folder = tmp_path_factory.mktemp("agents")
    config = write_config(folder, model_path=model_path, max_tokens=8)
    keys = {}
    for name, password in USERS.items():
        made = cli(config, "adduser", name, "--key", password=password)
        assert made.returncode == 0, made.stderr
        keys[name] = made.stdout.split("API key (shown once): ")[1].split()[0]
    server = Server(config, folder / "server.log").start()
    yield server, keys
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

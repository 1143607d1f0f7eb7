"""Accounts: the users file, the CLI, login for the page and gradio_client, API keys for /v1,
and each user seeing only their own chats by every route — against real server processes."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from reame.accounts import manage
from reame.accounts.users import AccountError, Accounts
from reame.chats.store import Store
from tests.conftest import ROOT, Server, start_server, write_config
from tests.gradio_api import ApiClient
from tests.reference import assert_answers, model_answer

CAPITAL = "What is the capital city of France? Answer in one word."
PASSWORDS = {"alice": "alice-secret-1", "bob": "bob-secret-22"}
OLD_TITLE = "From before accounts"


def cli(config, *args, password: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "app.py"), *args, "--config", str(config)]
                          + (["--password-stdin"] if password is not None else []),
                          input=(password + "\n") if password is not None else None,
                          capture_output=True, text=True, cwd=ROOT, timeout=60)


def test_an_unknown_name_costs_a_login_check_what_a_known_one_does(tmp_path, monkeypatch):
    """A wrong password for a known name and any password for an unknown one: one scrypt each,
    with the same parameters, so the time of a failed login does not tell which names
    exist. (The scrypts are counted, not timed: the same on any CPU.)"""
    import hashlib

    accounts = Accounts(tmp_path / "users.json")
    accounts.add_user("alice", "correct horse", admin=True)
    real, calls = hashlib.scrypt, []

    def counted(*args, **kwargs):
        calls.append({k: kwargs[k] for k in ("n", "r", "p", "dklen")})
        return real(*args, **kwargs)

    monkeypatch.setattr(hashlib, "scrypt", counted)
    assert not accounts.check_password("alice", "wrong horse")
    known, calls[:] = list(calls), []
    assert not accounts.check_password("nobody", "wrong horse")
    assert calls == known and len(known) == 1


def test_passwords_are_scrypt_hashes_and_keys_are_stored_hashed(tmp_path):
    accounts = Accounts(tmp_path / "users.json")
    accounts.add_user("alice", "correct horse", admin=True)
    key = accounts.add_key("alice")
    raw = (tmp_path / "users.json").read_text()
    assert "correct horse" not in raw and key not in raw
    assert json.loads(raw)["users"]["alice"]["password"].startswith("scrypt$")
    assert stat.S_IMODE(os.stat(tmp_path / "users.json").st_mode) == 0o600
    again = Accounts(tmp_path / "users.json")
    assert again.check_password("alice", "correct horse")
    assert not again.check_password("alice", "wrong horse")
    assert not again.check_password("nobody", "correct horse")
    assert again.user_for_key(key) == "alice"
    assert again.user_for_key(key + "x") is None and again.user_for_key("sk-whatever") is None
    assert again.is_admin("alice")
    with pytest.raises(AccountError, match="at least 8"):
        again.add_user("bob", "short")
    with pytest.raises(AccountError, match="exists"):
        again.add_user("alice", "another password")
    again.revoke_key("alice", again.keys("alice")[0]["id"])
    assert accounts.user_for_key(key) is None, "a running server sees the change (reloads)"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory, model_path):
    """A server with accounts: alice (admin, first user) and bob, each with an API key."""
    folder = tmp_path_factory.mktemp("accounts")
    server = start_server(folder, model_path=model_path, max_tokens=16, start=False)
    config = server.config
    keys = {}
    for name in ("alice", "bob"):
        made = cli(config, "adduser", name, "--key", password=PASSWORDS[name])
        assert made.returncode == 0, made.stderr
        keys[name] = made.stdout.split("API key (shown once): ")[1].split()[0]
    assert "users_file = users.json" in config.read_text(), "adduser turned accounts on"
    # A chat from before accounts were turned on: it has no owner.
    Store(folder / "sessions" / "reame.db").create_chat(
        title=OLD_TITLE, system_prompt="", temperature=0.0, top_p=1.0, max_tokens=16)
    server.start()
    yield server, keys
    server.stop()


def as_user(server: Server, name: str) -> ApiClient:
    return ApiClient(server.url, auth=(name, PASSWORDS[name]), verbose=False)


def v1(server: Server, path: str, *, key: str | None = None, body=None, headers=None):
    request = urllib.request.Request(
        server.url + "v1/" + path, data=json.dumps(body).encode() if body is not None else None,
        headers={"Content-Type": "application/json", **(headers or {}),
                 **({"Authorization": f"Bearer {key}"} if key else {})})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_page_and_gradio_client_need_a_login(guarded):
    server, _ = guarded
    with pytest.raises(Exception):
        ApiClient(server.url, verbose=False)
    with pytest.raises(Exception):
        ApiClient(server.url, auth=("alice", "wrong password"), verbose=False)
    alice = as_user(server, "alice")
    chat = alice.predict(api_name="/new_chat")
    assert_answers(alice.predict(chat, CAPITAL, api_name="/send"), model_answer(CAPITAL))


def test_api_keys_are_required_for_v1(guarded):
    server, keys = guarded
    body = {"model": "SmolLM2-135M-Instruct.Q4_1.gguf", "temperature": 0,
            "messages": [{"role": "user", "content": CAPITAL}]}
    status, answer = v1(server, "chat/completions", body=body)
    assert status == 401 and answer["error"]["code"] == "missing_api_key"
    status, answer = v1(server, "chat/completions", body=body, key="rk-not-a-key")
    assert status == 401 and answer["error"]["code"] == "invalid_api_key"
    status, answer = v1(server, "models")
    assert status == 401
    status, answer = v1(server, "chat/completions", body=body, key=keys["bob"])
    assert status == 200
    assert_answers(answer["choices"][0]["message"]["content"],
                   model_answer(CAPITAL, system_prompt=""))


def test_a_users_chats_are_invisible_to_another_user_by_every_route(guarded):
    server, keys = guarded
    alice, bob = as_user(server, "alice"), as_user(server, "bob")
    chat = alice.predict(api_name="/new_chat")
    alice.predict(chat, CAPITAL, api_name="/send")
    message_id = alice.predict(chat, api_name="/get_chat")["messages"][0]["id"]
    assert chat in [c["id"] for c in alice.predict(api_name="/list_chats")]
    assert chat not in [c["id"] for c in bob.predict(api_name="/list_chats")]
    calls = [((chat,), "/get_chat"), ((chat, "hi"), "/send"), ((chat,), "/regenerate"),
             ((chat, message_id, "hi"), "/edit_message"), ((chat, "mine"), "/rename_chat"),
             ((chat,), "/delete_chat")]
    for args, endpoint in calls:
        with pytest.raises(Exception, match=f"chat {chat} does not exist"):
            bob.predict(*args, api_name=endpoint)
    status, answer = v1(server, "chat/completions", key=keys["bob"],
                        headers={"X-Reame-Chat": str(chat)},
                        body={"model": "SmolLM2-135M-Instruct.Q4_1.gguf",
                              "messages": [{"role": "user", "content": "hi"}]})
    assert status == 404 and "does not exist" in answer["error"]["message"]
    # Nothing of alice's changed.
    kept = alice.predict(chat, api_name="/get_chat")
    assert [m["content"] for m in kept["messages"]][0] == CAPITAL and len(kept["messages"]) == 2
    assert kept["title"] != "mine"


def test_only_an_admin_changes_the_settings(guarded):
    server, _ = guarded
    with pytest.raises(Exception, match="only an admin"):
        as_user(server, "bob").predict({"generation": {"temperature": 0.5}},
                                       api_name="/update_settings")
    changed = as_user(server, "alice").predict({"generation": {"max_tokens": 20}},
                                               api_name="/update_settings")
    assert changed["settings"]["generation"]["max_tokens"] == 20


def test_exposing_the_app_without_accounts_is_refused(tmp_path, model_path):
    config = write_config(tmp_path, model_path=model_path, host="0.0.0.0")
    refused = subprocess.run([sys.executable, str(ROOT / "app.py"), "--config", str(config)],
                             capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert refused.returncode == 2
    assert "refusing to listen on 0.0.0.0 without accounts" in refused.stderr
    assert "allow_anonymous" in refused.stderr
    empty = write_config(tmp_path / "e", model_path=model_path, users_file="users.json") \
        if (tmp_path / "e").mkdir() is None else None
    refused = subprocess.run([sys.executable, str(ROOT / "app.py"), "--config", str(empty)],
                             capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert refused.returncode == 2 and "no users" in refused.stderr


def test_chats_from_before_accounts_are_shown_to_nobody_until_a_user_adopts_them(guarded):
    server, _ = guarded
    alice, bob = as_user(server, "alice"), as_user(server, "bob")
    titles = lambda client: [c["title"] for c in client.predict(api_name="/list_chats")]
    assert OLD_TITLE not in titles(alice) and OLD_TITLE not in titles(bob)
    log = server.log_path.read_text()
    assert "1 chat made before accounts were turned on belongs to nobody" in log
    assert "python app.py adopt NAME" in log

    nobody = cli(server.config, "adopt", "carol")
    assert nobody.returncode == 2 and "no user 'carol'" in nobody.stderr
    adopted = cli(server.config, "adopt", "bob")
    assert adopted.returncode == 0, adopted.stderr
    assert "1 chat made without accounts now belongs to bob" in adopted.stdout
    assert OLD_TITLE in titles(bob) and OLD_TITLE not in titles(alice)
    again = cli(server.config, "adopt", "alice")
    assert "0 chats made without accounts" in again.stdout, "nothing left without an owner"
    handed = cli(server.config, "adopt", "alice", "--from", "bob")
    assert handed.returncode == 0 and "of bob now belong" in handed.stdout
    assert OLD_TITLE in titles(alice) and OLD_TITLE not in titles(bob)


def test_the_last_admin_cannot_be_removed(tmp_path):
    """Nobody could manage the users from the page, nor the settings: deluser and the Users
    tab (both reame/accounts/manage.py) refuse, saying why."""
    accounts = Accounts(tmp_path / "users.json")
    assert manage.add_user(accounts, "alice", "alice-secret-1") == \
        "user alice added (admin: the first user)"
    manage.add_user(accounts, "bob", "bob-secret-22")
    with pytest.raises(AccountError, match="'alice' is the last admin and cannot be removed"):
        manage.remove_user(accounts, "alice")
    manage.add_user(accounts, "carol", "carol-secret-3", admin=True)
    assert manage.remove_user(accounts, "alice").startswith("user alice removed; their chats "
                                                            "stay, owned by u:")
    assert [manage.users_line(row) for row in manage.users(accounts)] == [
        "bob: no keys", "carol (admin): no keys"]

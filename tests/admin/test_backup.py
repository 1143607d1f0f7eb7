"""Backup and restore: a consistent copy taken while chats are being written, checked before
anything is restored, never deleting what was there. All but the last test need no model: their
KV files are written by the project's own writer (KVStore.write), with synthetic states."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from reame.accounts.users import Accounts
from reame.admin.backup import (
    MANIFEST_NAME,
    BackupError,
    backup,
    check_backup,
    restore,
    run_backup,
    run_restore,
)
from reame.chats.store import Store
from reame.config.reame_conf import load_config
from reame.inference.batches import Batch
from reame.inference.kv.blobs import TMP_PREFIX, FolderBlobs
from reame.inference.kv.kvstore import TOTALS_NAME, KVStore

from tests.conftest import ROOT, Server, start_server, write_config
from tests.gradio_api import ApiClient

FINGERPRINT = "model=test;kv=f16;flash_attn=0"
PASSWORD = "alice-secret-1"


class Site:
    """One Reame's folder as its server has it: reame.conf, sessions/reame.db, sessions/kv."""

    def __init__(self, folder: Path, *, users: bool = False):
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.config_path = write_config(folder, users_file="users.json" if users else "")
        self.config = load_config(self.config_path)

    def store(self) -> Store:
        return Store(self.config.storage.database_path)

    def kv(self) -> KVStore:
        return KVStore(FolderBlobs(self.config.cache.dir), fingerprint=FINGERPRINT,
                       max_bytes=1 << 30)


def filled_site(folder: Path, *, users: bool = True) -> Site:
    """A site with an account, chats (one with a retried reply), their KV files, a shared-prefix
    file and the cache's totals; and what a backup must leave: a temp file, a foreign file."""
    site = Site(folder, users=users)
    owner = None
    if users:
        accounts = Accounts(site.config.users_path)
        accounts.add_user("alice", PASSWORD, admin=True)
        owner = accounts.user_id("alice")
    store, kv = site.store(), site.kv()
    for n in range(3):
        chat = new_chat(store, f"chat {n}", owner)
        store.add_message(chat.id, "user", f"question {n}")
        store.add_message(chat.id, "assistant", f"answer {n}", tokens=[5, 6, 7],
                          tokens_model="m", stats={"source": "none", "generated": 3})
        tokens = list(range(10 + n))
        kv.write(kv.chat_key(chat.id), tokens, os.urandom(1000 * (n + 1)),
                 [Batch(0, len(tokens), False)], scope=owner or "")
    store.rewind(chat.id, 1)
    store.add_message(chat.id, "assistant", "another answer")
    kv.write(kv.prefix_key("ab" * 12), list(range(64)), os.urandom(500),
             [Batch(0, 64, False)])
    (site.config.cache.dir / TOTALS_NAME).write_text(json.dumps(
        {"prefill_rates": {"m": 250.0}, "counts": {"": [3, 2, 40]}}), encoding="utf-8")
    (site.config.cache.dir / f"{TMP_PREFIX}half-written.tmp").write_bytes(b"partial")
    (site.config.cache.dir / "notes.txt").write_text("not Reame's", encoding="utf-8")
    store.db.dispose()
    return site


def new_chat(store: Store, title: str, owner: str | None = None):
    return store.create_chat(title=title, system_prompt="s", temperature=0.5, top_p=0.9,
                             max_tokens=10, owner=owner)


def chats_of(site: Site | Path) -> list[tuple[dict, list[dict]]]:
    """Every chat with every version of its messages, as stored in the site's database (or
    the database at a path)."""
    store = Store(site if isinstance(site, Path) else site.config.storage.database_path)
    try:
        return [(store.get_chat(chat_id).model_dump(),
                 [m.model_dump() for m in store.tree(chat_id).messages])
                for chat_id in sorted(store.chat_ids())]
    finally:
        store.db.dispose()


def tree(folder: Path) -> dict[str, str]:
    """Every file under folder (its path relative to it) with the SHA-256 of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def kv_bytes(folder: Path) -> dict[str, bytes]:
    """Reame's own files in a KV folder (KV files and totals), by name."""
    return {p.name: p.read_bytes() for p in folder.iterdir()
            if p.suffix == ".kv" or p.name == TOTALS_NAME}


def kv_times(folder: Path) -> dict[str, int]:
    """When each of Reame's files in a KV folder was last used (what eviction goes by)."""
    return {p.name: p.stat().st_mtime_ns for p in folder.iterdir()
            if p.suffix == ".kv" or p.name == TOTALS_NAME}


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_restore_gives_the_same_chats_accounts_and_kv_files(tmp_path):
    old = filled_site(tmp_path / "old")
    manifest = backup(old.config, tmp_path / "backup")
    parts = {entry.path: entry.part for entry in manifest.files}
    assert parts["reame.db"] == "database" and parts["users.json"] == "accounts"
    assert parts["reame.conf"] == "config" and parts[f"kv/{TOTALS_NAME}"] == "kv"
    assert sorted(p for p, part in parts.items() if part == "kv") == sorted(
        f"kv/{name}" for name in kv_bytes(old.config.cache.dir)), "every KV file and the totals"
    assert not any(TMP_PREFIX in p or "notes" in p for p in parts), "nothing else"
    assert manifest.left_out == {}
    assert mode(tmp_path / "backup" / "users.json") == 0o600
    assert mode(tmp_path / "backup") == 0o700
    assert not list((tmp_path / "backup").glob("reame.db-*")), "the database is one file"

    new = Site(tmp_path / "new", users=True)  # a fresh machine with its own reame.conf
    own_conf = new.config_path.read_bytes()
    restored = restore(tmp_path / "backup", new.config)
    assert restored.moved_aside == []
    assert chats_of(new) == chats_of(old)
    assert kv_bytes(new.config.cache.dir) == kv_bytes(old.config.cache.dir), "byte-identical"
    assert kv_times(new.config.cache.dir) == kv_times(old.config.cache.dir), "the LRU order"
    assert new.config.users_path.read_bytes() == old.config.users_path.read_bytes()
    assert mode(new.config.users_path) == 0o600 and mode(new.config.storage.database_path) == 0o600
    assert Accounts(new.config.users_path).check_password("alice", PASSWORD)
    assert new.config_path.read_bytes() == own_conf, "the config is restored only if asked"
    assert not [p for p in new.config.cache.dir.iterdir() if p.name.startswith(TMP_PREFIX)]


def test_a_kv_file_damaged_on_the_server_is_left_out_and_named(tmp_path):
    old = filled_site(tmp_path / "old")
    damaged = old.config.cache.dir / old.kv().chat_key(1)
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    manifest = backup(old.config, tmp_path / "backup")
    assert manifest.left_out == {f"kv/{damaged.name}": "checksum mismatch"}
    assert not (tmp_path / "backup" / "kv" / damaged.name).exists()
    new = Site(tmp_path / "new", users=True)
    restore(tmp_path / "backup", new.config)
    assert chats_of(new) == chats_of(old), "a KV file is only a cache: the chats are all there"
    assert set(kv_bytes(new.config.cache.dir)) == set(kv_bytes(old.config.cache.dir)) - {
        damaged.name}


@pytest.mark.parametrize("victim", ["reame.db", "kv", "users.json", "reame.conf"])
def test_a_damaged_backup_is_refused_naming_the_file_and_nothing_changes(tmp_path, victim):
    old = filled_site(tmp_path / "old")
    backup(old.config, tmp_path / "backup")
    if victim == "kv":
        victim = "kv/" + sorted((tmp_path / "backup" / "kv").glob("chat-*.kv"))[0].name
    path = tmp_path / "backup" / victim
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit
    path.write_bytes(bytes(data))
    there = filled_site(tmp_path / "there")  # data already there, and --force
    before = tree(there.folder)
    with pytest.raises(BackupError, match=re.escape(victim) + " in the backup .* is damaged"):
        restore(tmp_path / "backup", there.config, force=True, with_config=True)
    assert tree(there.folder) == before


def test_a_backup_without_its_manifest_is_refused(tmp_path):
    old = filled_site(tmp_path / "old")
    backup(old.config, tmp_path / "backup")
    (tmp_path / "backup" / MANIFEST_NAME).unlink()  # as if the backup had not finished
    new = Site(tmp_path / "new", users=True)
    with pytest.raises(BackupError, match="has no manifest.json: not a Reame backup, or one "
                                          "that did not finish"):
        restore(tmp_path / "backup", new.config)
    assert not new.config.storage.database_path.exists()


def test_a_manifest_cannot_send_a_file_elsewhere(tmp_path):
    old = filled_site(tmp_path / "old")
    backup(old.config, tmp_path / "backup")
    manifest_path = tmp_path / "backup" / MANIFEST_NAME
    manifest = json.loads(manifest_path.read_text())
    (tmp_path / "evil").write_bytes(b"x")
    manifest["files"].append({"path": "../evil", "part": "kv", "size": 1,
                              "sha256": hashlib.sha256(b"x").hexdigest()})
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(BackupError, match="lists an unexpected file '../evil'"):
        check_backup(tmp_path / "backup")
    manifest["format"] = 99
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(BackupError, match="backup format 99: this Reame reads format 1"):
        check_backup(tmp_path / "backup")


def test_a_backup_goes_only_into_a_new_or_empty_folder(tmp_path):
    old = filled_site(tmp_path / "old")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "something").write_text("mine")
    with pytest.raises(BackupError, match="is not empty"):
        backup(old.config, tmp_path / "full")
    (tmp_path / "a-file").write_text("mine")
    with pytest.raises(BackupError, match="is a file"):
        backup(old.config, tmp_path / "a-file")
    with pytest.raises(BackupError, match="inside the KV folder"):
        backup(old.config, old.config.cache.dir / "backup")
    assert (tmp_path / "full" / "something").read_text() == "mine"
    (tmp_path / "empty").mkdir()
    assert backup(old.config, tmp_path / "empty").files


def test_existing_data_is_replaced_only_with_force_and_then_moved_aside(tmp_path):
    old = filled_site(tmp_path / "old")
    backup(old.config, tmp_path / "backup")
    there = Site(tmp_path / "there", users=True)
    store = there.store()
    new_chat(store, "mine")
    store.db.dispose()
    Accounts(there.config.users_path).add_user("bob", "bob-secret-22")
    there.kv().write(there.kv().chat_key(1), [1, 2], b"kv", [Batch(0, 2, False)])
    mine = chats_of(there)
    before = tree(there.folder)
    with pytest.raises(BackupError, match="there is data already: .*reame.db.*--force"):
        restore(tmp_path / "backup", there.config)
    assert tree(there.folder) == before

    restored = restore(tmp_path / "backup", there.config, force=True)
    assert chats_of(there) == chats_of(old)
    aside = dict(restored.moved_aside)
    database = there.config.storage.database_path
    assert set(aside) == {database, there.config.cache.dir, there.config.users_path}
    assert all(".before-restore-" in new.name for new in aside.values())
    old_db = tmp_path / "kept.db"  # what was there is kept, whole
    aside[database].rename(old_db)
    assert chats_of(old_db) == mine
    assert Accounts(aside[there.config.users_path]).names() == ["bob"]
    assert (aside[there.config.cache.dir] / there.kv().chat_key(1)).exists()


def test_a_restore_is_refused_while_a_server_has_the_database_open(tmp_path):
    old = filled_site(tmp_path / "old")
    backup(old.config, tmp_path / "backup")
    there = Site(tmp_path / "there", users=True)
    store = there.store()  # as a running server holds it: connections kept open
    new_chat(store, "mine")
    try:
        with pytest.raises(BackupError, match="is in use .* stop the server"):
            restore(tmp_path / "backup", there.config, force=True)
        assert [c.title for c in store.list_chats()] == ["mine"]
    finally:
        store.db.dispose()


def test_with_config_a_new_machine_gets_the_config_and_the_data_beside_it(tmp_path):
    old = filled_site(tmp_path / "old")
    backup(old.config, tmp_path / "backup")
    target = tmp_path / "new-machine" / "reame.conf"  # nothing there yet
    assert run_restore([str(tmp_path / "backup"), "--config", str(target), "--with-config"],
                       target) == 0
    assert target.read_bytes() == old.config_path.read_bytes()
    config = load_config(target)
    assert config.storage.database_path == tmp_path / "new-machine" / "sessions" / "reame.db"
    assert chats_of(config.storage.database_path) == chats_of(old)
    assert kv_bytes(config.cache.dir) == kv_bytes(old.config.cache.dir)
    assert Accounts(config.users_path).check_password("alice", PASSWORD)


def test_accounts_are_not_restored_where_the_config_has_no_users_file(tmp_path):
    old = filled_site(tmp_path / "old")
    backup(old.config, tmp_path / "backup")
    new = Site(tmp_path / "new", users=False)
    with pytest.raises(BackupError, match="holds an accounts file, but .* has no \\[server\\] "
                                          "users_file"):
        restore(tmp_path / "backup", new.config)
    assert not new.config.storage.database_path.exists()


def test_chats_written_during_the_backup_leave_a_consistent_snapshot(tmp_path):
    site = Site(tmp_path / "old")
    store = site.store()
    old_chats = 200
    for n in range(old_chats):  # about 4 MB: a copy of many small steps
        chat = new_chat(store, f"old {n}")
        store.add_message(chat.id, "user", f"{n} " + "x" * 20000)
    writer = Turns(store)
    steps: list[tuple[int, int, int]] = []  # (remaining, total, chats the writer had made)

    def step(_status, remaining, total):
        steps.append((remaining, total, writer.chats))
        if len(steps) > 10 * math.ceil(total / 8):  # (raised out of the copy)
            raise AssertionError("the copy keeps restarting: each write begins it again")
        time.sleep(0.005)  # a slow disk: the server keeps writing between steps

    writer.start()
    try:
        writer.wait_for(3)
        before = store.count_chats()
        backup(site.config, tmp_path / "backup", pages=8, progress=step)
    finally:
        writer.stop()
    after = store.count_chats()
    store.db.dispose()
    total = steps[-1][1]
    assert len(steps) == math.ceil(total / 8), "the copy never restarted"
    assert steps[-1][2] - steps[0][2] >= 5, "chats were added while the copy ran"

    new = Site(tmp_path / "new")
    restore(tmp_path / "backup", new.config)
    db = sqlite3.connect(new.config.storage.database_path)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    copied = db.execute("SELECT count(*) FROM chat").fetchone()[0]
    # the database as it was when the copy began (the writer may have stored one more chat
    # than it had counted yet)
    assert before <= copied <= old_chats + steps[0][2] + 1
    assert copied < after
    assert db.execute("SELECT count(*) FROM message WHERE chat_id NOT IN "
                      "(SELECT id FROM chat)").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM chat WHERE leaf_id IS NOT NULL AND leaf_id NOT IN "
                      "(SELECT id FROM message)").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM message WHERE parent_id IS NOT NULL AND parent_id "
                      "NOT IN (SELECT id FROM message)").fetchone()[0] == 0
    assert (db.execute("SELECT count(*) FROM message_fts").fetchone()
            == db.execute("SELECT count(*) FROM message").fetchone())
    db.close()
    restored = new.store()
    assert restored.count_chats() == copied
    restored.db.dispose()


class Turns:
    """A thread that keeps adding chats with a question and a reply, as a busy server does."""

    def __init__(self, store: Store):
        self.store, self.chats = store, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wait_for(self, chats: int) -> None:
        while self.chats < chats:
            time.sleep(0.01)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.is_set():
            chat = new_chat(self.store, "new")
            self.chats += 1
            self.store.add_message(chat.id, "user", "question")
            self.store.add_message(chat.id, "assistant", "reply", tokens=[1, 2, 3])


def test_the_commands_exit_codes_and_messages(tmp_path, capsys):
    old = filled_site(tmp_path / "old")
    dest, conf = tmp_path / "backup", ["--config", str(old.config_path)]
    nowhere = tmp_path / "nowhere.conf"

    assert run_backup([str(dest), *conf], nowhere) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"backed up to {dest} in ") and err == ""
    assert " s: 8 files, " in out and "(the database: " in out and "; 5 KV files: " in out
    assert "; the accounts file; the config file)" in out

    assert run_backup([str(dest), *conf], nowhere) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"reame: {dest} is not empty: back up into a new or empty folder\n"
    assert run_backup([str(tmp_path / "b2")], nowhere) == 2
    assert capsys.readouterr().err == f"reame: config file not found: {nowhere}\n"

    new = Site(tmp_path / "new", users=True)
    target = ["--config", str(new.config_path)]
    assert run_restore([str(dest), *target], nowhere) == 0
    out, err = capsys.readouterr()
    plan, done = out.split("restored from ")
    # What it writes is said first, folder by folder.
    assert plan.splitlines() == [f"will write into {new.folder / 'sessions'}: reame.db",
                                 f"will write into {new.folder / 'sessions' / 'kv'}: 5 files",
                                 f"will write into {new.folder}: users.json"], plan
    assert done.startswith(f"{dest} (made ") and "): 7 files, " in out and err == ""
    assert "; the accounts file)" in out, "the config only with --with-config"
    assert run_restore([str(dest), *target], nowhere) == 2
    assert "reame: there is data already: " in capsys.readouterr().err
    assert run_restore([str(dest), *target, "--force"], nowhere) == 0
    out = capsys.readouterr().out
    assert out.count("moved aside: ") == 3
    assert run_restore([str(tmp_path / "old"), *target], nowhere) == 2
    assert capsys.readouterr().err == (f"reame: {tmp_path / 'old'} has no manifest.json: not a "
                                       f"Reame backup, or one that did not finish\n")
    with pytest.raises(SystemExit) as exit_:
        run_restore([], nowhere)
    assert exit_.value.code == 2


# With the real model, on real servers: not run by the model-free selection above.


@pytest.mark.slow
def test_a_chat_backed_up_while_the_server_answers_continues_from_disk(tmp_path, model_path):
    old = start_server(tmp_path / "old", model_path=model_path)
    busy = None
    try:
        client = ApiClient(old.url, verbose=False)
        chat_id = client.predict("Geography", "You are a terse assistant.", api_name="/new_chat")
        client.predict(chat_id, "Which planet do we live on?", api_name="/send")
        writes = settled_kv_writes(client)
        client.predict(chat_id, "What is the capital city of France? Answer in one word.",
                       api_name="/send")
        settled_kv_writes(client, more_than=writes)  # the chat's KV file holds both turns
        before = client.predict(chat_id, api_name="/get_chat")["messages"]

        busy = Answering(old.url)
        busy.start()
        busy.wait_for_replies(1)
        made = app_command("backup", tmp_path / "backup", "--config", old.config)
        assert made.returncode == 0, made.stderr
        assert "backed up to" in made.stdout
        busy.wait_for_replies(busy.replies + 1)  # it kept answering through the backup
    finally:
        if busy is not None:
            busy.stop()
        old.stop()
    manifest = check_backup(tmp_path / "backup")
    assert any(e.path.startswith(f"kv/chat-{chat_id}-") for e in manifest.files)
    assert manifest.left_out == {}

    (tmp_path / "new").mkdir()
    new_config = write_config(tmp_path / "new", model_path=model_path)
    put_back = app_command("restore", tmp_path / "backup", "--config", new_config)
    assert put_back.returncode == 0, put_back.stderr
    new = Server(new_config, tmp_path / "new" / "server.log").start()
    try:
        client = ApiClient(new.url, verbose=False)
        assert busy.chat_id in [c["id"] for c in client.predict(api_name="/list_chats")]
        assert client.predict(chat_id, api_name="/get_chat")["messages"] == before
        client.predict(chat_id, "Say hello.", api_name="/send")
        stats = client.predict(chat_id, api_name="/get_chat")["messages"][-1]["stats"]
        assert stats["source"] == "disk", "the restored KV file, not a recomputed history"
        assert stats["reused"] > 20 and stats["prefilled"] == stats["prompt_tokens"] - stats[
            "reused"]
        assert stats["prefilled"] < 20
        assert client.predict(api_name="/cache_stats")["counters"]["rejected"] == 0
    finally:
        new.stop()


def app_command(*args) -> subprocess.CompletedProcess:
    """`python app.py ARGS`, as a person runs it."""
    return subprocess.run([sys.executable, str(ROOT / "app.py"), *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def settled_kv_writes(client: ApiClient, *, more_than: int = -1, timeout: float = 60) -> int:
    """The server's count of KV files written, once it is above more_than and has not moved
    for a second (the background writer is idle)."""
    deadline, last, still_since = time.monotonic() + timeout, None, time.monotonic()
    while time.monotonic() < deadline:
        writes = client.predict(api_name="/cache_stats")["counters"]["writes"]
        if writes != last:
            last, still_since = writes, time.monotonic()
        elif writes > more_than and time.monotonic() - still_since >= 1.0:
            return writes
        time.sleep(0.2)
    raise AssertionError(f"the KV writes did not settle (last count {last})")


class Answering:
    """Another chat on the server, answering one message after another until stopped."""

    def __init__(self, url: str):
        self.client = ApiClient(url, verbose=False)
        self.chat_id = self.client.predict("Busy", None, api_name="/new_chat")
        self.replies = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._errors: list[Exception] = []

    def start(self) -> None:
        self._thread.start()

    def wait_for_replies(self, count: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while self.replies < count and not self._errors and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not self._errors, self._errors
        assert self.replies >= count, f"only {self.replies} replies"

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)

    def _run(self) -> None:
        try:
            n = 0
            while not self._stop.is_set():
                n += 1
                self.client.predict(self.chat_id, f"Count to {n}.", api_name="/send")
                self.replies += 1
        except Exception as exc:  # noqa: BLE001 - reported by wait_for_replies
            self._errors.append(exc)

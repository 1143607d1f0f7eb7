"""The KV blobs' interface (reame/inference/kv/blobs.py), held to by both implementations: the
local folder and the tests' in-memory one (tests/kv_blobs.py); and a KV store over each."""

from __future__ import annotations

import pytest

from reame.inference.batches import Batch
from reame.inference.kv.blobs import FolderBlobs
from reame.inference.kv.kvstore import KVStore

from tests.kv_blobs import Backend, MemoryBlobs, memory_blobs_at


@pytest.fixture(params=["folder", "memory"])
def backend(request, tmp_path):
    yield Backend(request.param)
    if request.param == "memory":
        from tests.kv_blobs import MEMORY
        MEMORY.pop(str(tmp_path / "kv"), None)


def test_put_get_list_size_touch_delete(backend, tmp_path):
    blobs = backend.at(tmp_path / "kv")
    assert blobs.get("a.kv") is None and blobs.open("a.kv") is None
    assert blobs.size("a.kv") is None and not blobs.exists("a.kv")
    blobs.put("a.kv", [b"head", memoryview(b"-body")])
    assert blobs.size("a.kv") == 9 and blobs.exists("a.kv")
    mapped = blobs.get("a.kv")
    assert bytes(mapped[:]) == b"head-body"
    mapped[0:4] = b"HEAD"  # a private copy: the blob is unchanged
    mapped.close()
    assert Backend.read(blobs, "a.kv") == b"head-body"
    blobs.put("a.kv", [b"new"])  # replaced whole
    assert Backend.read(blobs, "a.kv") == b"new"
    blobs.put("b.kv", [b"x" * 10])
    Backend.set_used(blobs, "a.kv", 1000.0)
    listed = {b.key: b for b in blobs.list()}
    assert set(listed) == {"a.kv", "b.kv"} and listed["b.kv"].size == 10
    assert listed["a.kv"].used_ns == 1000 * 10**9 < listed["b.kv"].used_ns
    blobs.touch("a.kv")
    assert {b.key: b for b in blobs.list()}["a.kv"].used_ns > 1000 * 10**9
    blobs.touch("gone.kv")  # nothing, no error
    assert blobs.delete("a.kv") and not blobs.delete("a.kv")
    assert [b.key for b in blobs.list()] == ["b.kv"]
    blobs.put("empty.kv", [])
    with pytest.raises(ValueError):
        blobs.get("empty.kv")


def test_a_failed_put_leaves_the_old_blob(backend, tmp_path):
    blobs = backend.at(tmp_path / "kv")
    blobs.put("a.kv", [b"old"])

    def parts():
        yield b"half of a new one"
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        blobs.put("a.kv", parts())
    assert Backend.read(blobs, "a.kv") == b"old"
    assert [b.key for b in blobs.list()] == ["a.kv"]


def test_a_store_over_either_finds_its_files_again_after_a_restart(backend, tmp_path):
    blobs = backend.at(tmp_path / "kv")
    kv = KVStore(blobs, fingerprint="test", max_bytes=1 << 30)
    key = kv.chat_key(3)
    kv.write_later(key, [5, 6, 7], bytes(4000), [Batch(0, 3, False)])
    kv.flush()
    again = KVStore(backend.at(tmp_path / "kv"), fingerprint="test", max_bytes=1 << 30)
    assert again.ready_chats() == {3} and again.peek(key) == [5, 6, 7]
    with again.read(key) as entry:
        assert entry.verified() and bytes(entry.state) == bytes(4000)
    data = bytearray(Backend.read(blobs, key))
    data[-20] ^= 0xFF
    blobs.put(key, [bytes(data)])
    with again.read(key) as entry:
        assert not entry.verified(), "a damaged file fails its checksum"
    blobs.put(key, [bytes(data[:30])])
    assert again.read(key) is None and again.counters.rejected == 1
    again.delete_chat(3)
    assert not again.exists(key) and again.ready_chats() == frozenset()


def test_the_in_memory_blobs_of_a_folder_outlive_their_store(tmp_path):
    assert memory_blobs_at(tmp_path) is memory_blobs_at(tmp_path)
    assert isinstance(memory_blobs_at(tmp_path), MemoryBlobs)
    assert isinstance(Backend("folder").at(tmp_path), FolderBlobs)

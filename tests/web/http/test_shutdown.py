"""A SIGTERM (systemd's stop, `kill`) ends the server only after its queued KV files are
written: uvicorn, after its graceful shutdown, raises SIGTERM again for the handler it found,
and the default handler would end the process at once."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from reame.inference.kv.blobs import FolderBlobs
from reame.inference.kv.kvstore import KVStore
from tests.conftest import ROOT, free_port

STATE_BYTES = 300 << 20  # a write that takes a while, so that an early end would cut it


@pytest.mark.slow
def test_sigterm_ends_the_server_after_the_queued_kv_writes(tmp_path):
    script = textwrap.dedent(f"""
        import os, signal, sys, threading, time
        from pathlib import Path
        sys.path.insert(0, {str(ROOT)!r})
        import uvicorn
        from reame.web.server import finish_writes_on_sigterm
        from reame.inference.batches import Batch
        from reame.inference.kv.blobs import FolderBlobs
        from reame.inference.kv.kvstore import KVStore

        class Service:  # what the handler needs of the real ChatService: its KV cache
            cache = KVStore(FolderBlobs(Path({str(tmp_path)!r})), fingerprint="test",
                            max_bytes=1 << 40)

        async def asgi(scope, receive, send):
            pass

        def stop_soon():
            time.sleep(1.0)  # uvicorn is serving and has installed its own handlers
            Service.cache.write_later(Service.cache.chat_key(1), [1, 2, 3],
                                      bytes({STATE_BYTES}), [Batch(0, 3, False)])
            os.kill(os.getpid(), signal.SIGTERM)

        finish_writes_on_sigterm(Service)
        threading.Thread(target=stop_soon, daemon=True).start()
        uvicorn.run(asgi, host="127.0.0.1", port={free_port()}, log_level="warning")
    """)
    ended = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           timeout=120)
    assert ended.returncode == -15, ended.stderr  # still ended by the signal, as asked
    files = KVStore(FolderBlobs(tmp_path), fingerprint="test", max_bytes=1 << 40)
    path = files.chat_key(1)
    assert files.exists(path), "the queued KV file was not written before the process ended"
    entry = files.read(path)
    assert entry is not None and entry.tokens == [1, 2, 3] and entry.verified()
    entry.close()

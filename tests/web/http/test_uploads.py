"""Uploads through the page's upload route, many at once: the same document uploaded and
attached by several tabs at the same time is never refused. Gradio keeps each upload in a
folder named by its content's digest; taking one tab's file must not remove the folder another
tab's upload of the same content is being moved into (a 500, about once in 600 uploads
before); and the folders taken files leave empty are removed, not left behind."""

from __future__ import annotations

import threading

import pytest

from tests.conftest import Server, start_server
from tests.page_events import PageSession, file_data

TABS, ROUNDS = 4, 100  # a session (here: the one user of a server without accounts) keeps 4 at most
CONTENT = b"The keeper logged forty ships in March.\n" * 20


@pytest.fixture
def quick_server(tmp_path, model_path) -> Server:
    server = start_server(tmp_path, model_path=model_path, max_tokens=8)
    yield server
    server.stop()


def upload_and_attach(server: Server, tab: int, failures: list[str]) -> None:
    """Upload the shared content under a name of this tab's and attach it, ROUNDS times."""
    session = PageSession(server.url)
    attach = session.fn_index("attach", "upload")
    try:
        for round_ in range(ROUNDS):
            name = f"notes-{tab}-{round_}.md"
            uploaded = session.upload(name, CONTENT)
            if uploaded.status_code != 200:
                failures.append(f"upload {name}: {uploaded.status_code} {uploaded.text[:200]}")
                continue
            ok, output = session.run(attach, [file_data(uploaded.json()[0], name)], [])
            if not ok:
                failures.append(f"attach {name}: {output}")
    finally:
        session.close()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_same_document_uploaded_and_attached_in_many_tabs_at_once_is_never_refused(
        quick_server):
    failures: list[str] = []
    tabs = [threading.Thread(target=upload_and_attach, args=(quick_server, n, failures))
            for n in range(TABS)]
    for tab in tabs:
        tab.start()
    for tab in tabs:
        tab.join(150)
    assert not any(tab.is_alive() for tab in tabs), "a tab never finished"
    assert not failures, f"{len(failures)} of {TABS * ROUNDS} refused: {failures[:3]}"

    # The folders the takes left empty are gone by the next upload: only its own is there.
    session = PageSession(quick_server.url)
    try:
        assert session.upload("last.md", b"Another text.\n").status_code == 200
    finally:
        session.close()
    folders = [p for p in (quick_server.config.parent / "gradio").rglob("*") if p.is_dir()]
    assert len(folders) == 1, f"{len(folders)} upload folders left: {folders[:4]}"

"""Documents attached to a message, in a real browser: attached, shown with their size, read
and removed before sending; sent folded into the message, which holds their text; a PDF's
text read; what cannot be attached refused by name; one user's .txt attached at once while
another user's eight slow PDFs are read; and the same document in a second chat
answered at least 5x sooner, its KV reused from the first chat (a 1,000-token document in
`make test`, the 3,000 tokens docs/page.md quotes in `make test-full`).

Helpers and fixtures: tests/browser_helpers.py.
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page, expect

from reame.chats.documents import Document, compose
from tests.browser_helpers import (  # noqa: F401 - browser, page and server are fixtures
    BOT,
    BOX,
    REPLY_TIMEOUT,
    SCREENSHOTS,
    STATS,
    TOAST,
    UI_TIMEOUT,
    USER,
    api,
    browser,
    current_id,
    first_words_after_enter,
    new_chat,
    open_app,
    page,
    page_load,
    send,
    server,
    shown_as_loaded,
    stats_figures,
    wait_for_reply_done,
)
from tests.conftest import FULL, Server, start_server
from tests.page_events import PageSession, file_data, fn_index
from tests.pdf_files import shared_stream_pdf

ATTACHED = "#attached .reame-attached"
PASSWORDS = {"alice": "alice-secret-1", "bob": "bob-secret-22"}

WORDS = ("harbour lighthouse keeper lamp storm ship rope tide night island stone stairs "
         "window signal fog horn boat gull winter supply letter log weather wind wave rock "
         "coast beacon lens oil wick glass bell shore cliff current anchor sail north south "
         "east west morning evening calm rough gale chart keeper's daughter mainland ferry").split()


def prose(n_words: int, seed: int) -> str:
    """Readable-looking text of n_words, in paragraphs (the same for the same seed)."""
    rng = random.Random(seed)
    paragraphs, sentence, words = [], [], []
    for n in range(n_words):
        sentence.append(rng.choice(WORDS))
        if len(sentence) >= rng.randint(8, 16):
            words.append(" ".join(sentence).capitalize() + ".")
            sentence = []
        if len(words) >= 5:
            paragraphs.append(" ".join(words))
            words = []
    paragraphs.append(" ".join(words + [" ".join(sentence)]).strip())
    return "\n\n".join(p for p in paragraphs if p)


def pdf_with(text: str) -> bytes:
    """A one-page PDF whose page shows text (one line), made by hand."""
    stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>",
               b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
               b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
               b"/Resources << /Font << /F1 5 0 R >> >> >>",
               b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
               b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for n, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % n + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % at for at in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1, xref)
    return bytes(out)


def attach(page: Page, *files: Path) -> None:
    with page.expect_file_chooser() as chooser:
        page.click("#attach")
    chooser.value.set_files([str(f) for f in files])


def strip_names(page: Page) -> list[str]:
    return [re.sub(r"\s+·.*", "", s).strip()
            for s in page.locator(f"{ATTACHED} summary").all_inner_texts()]


def test_a_document_is_attached_shown_removed_and_sent_folded(page, server, tmp_path):
    notes = tmp_path / "notes.md"
    notes.write_text("# Lighthouse log\n\nThe lamp was lit at dusk.\n\nFog came at nine.\n",
                     encoding="utf-8")
    other = tmp_path / "other.txt"
    other.write_text("Not this one.", encoding="utf-8")
    open_app(page, server)
    new_chat(page)
    attach(page, notes)
    expect(page.locator(ATTACHED)).to_have_count(1)
    summary = page.locator(f"{ATTACHED} summary").inner_text()
    assert re.fullmatch(r"notes\.md · \d+ tokens", summary.strip()), summary
    # Its text can be read before sending.
    page.locator(f"{ATTACHED} summary").click()
    expect(page.locator(f"{ATTACHED} pre")).to_contain_text("Fog came at nine.")
    attach(page, other)
    expect(page.locator(ATTACHED)).to_have_count(2)
    assert strip_names(page) == ["notes.md", "other.txt"]
    page.get_by_role("button", name="Remove other.txt").click()
    expect(page.locator(ATTACHED)).to_have_count(1)
    assert strip_names(page) == ["notes.md"]

    box = page.locator(BOX)
    box.fill("When did the fog come?")
    box.press("Enter")
    wait_for_reply_done(page, 1)
    expect(page.locator(ATTACHED)).to_have_count(0)  # sent with the message, gone from here
    user = page.locator(USER)
    expect(user.locator("details.reame-doc summary")).to_have_text(
        re.compile(r"Attached: notes\.md"))
    expect(user.locator("details.reame-doc pre")).to_be_hidden()  # folded
    assert user.inner_text().strip().endswith("When did the fog come?")
    chat = api(server).predict(current_id(page), api_name="/get_chat")
    assert chat["title"] == "When did the fog come?"
    sent = chat["messages"][0]["content"]
    assert sent == compose([Document("notes.md", notes.read_text().strip("\n"))],
                           "When did the fog come?")
    # After a reload the message still shows its document folded; and in dark mode (the
    # browser's preference), for docs/page.md's screenshot.
    page.emulate_media(color_scheme="dark")
    page.reload()
    expect(page.locator(USER).locator("details.reame-doc summary")).to_have_text(
        re.compile(r"Attached: notes\.md"))
    wait_for_reply_done(page, 1)
    page.screenshot(path=SCREENSHOTS / "dark.png")
    page.emulate_media(color_scheme="light")


def test_a_file_dropped_on_the_message_box_is_attached(page, server):
    """Dragging a file onto the message box attaches it as the attach button does; a file of
    a kind not taken, dropped, is named as not attached."""
    open_app(page, server)
    new_chat(page)

    def drop(name: str, text: str) -> None:
        files = page.evaluate_handle(
            """([name, text]) => { const data = new DataTransfer();
                data.items.add(new File([text], name, {type: "text/plain"})); return data; }""",
            [name, text])
        page.dispatch_event(f"{BOX}", "dragover", {"dataTransfer": files})
        page.dispatch_event(f"{BOX}", "drop", {"dataTransfer": files})

    drop("fog.txt", "Fog came at nine.\n")
    expect(page.locator(ATTACHED)).to_have_count(1)
    assert strip_names(page) == ["fog.txt"]
    drop("tool.exe", "MZ")
    expect(page.locator("#reame-hint")).to_contain_text("Not attached: tool.exe")
    assert strip_names(page) == ["fog.txt"]


def test_a_pdf_is_read_and_what_cannot_be_attached_is_named(page, server, tmp_path):
    paper = tmp_path / "paper.pdf"
    paper.write_bytes(pdf_with("The keeper logged forty ships in March."))
    huge = tmp_path / "huge.md"
    huge.write_text(prose(3000, 7), encoding="utf-8")  # more than 2,048 tokens can hold
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n", encoding="utf-8")
    open_app(page, server)
    new_chat(page)
    attach(page, paper)
    expect(page.locator(ATTACHED)).to_have_count(1)
    page.locator(f"{ATTACHED} summary").click()
    expect(page.locator(f"{ATTACHED} pre")).to_have_text(
        "The keeper logged forty ships in March.")
    attach(page, huge, empty)
    toast = page.locator(TOAST).filter(has_text="Not attached")
    expect(toast).to_contain_text("huge.md: it is")
    expect(toast).to_contain_text("more than this model's context of 2,048 tokens")
    expect(toast).to_contain_text("empty.txt holds no text")
    assert strip_names(page) == ["paper.pdf"], "a refused file was attached"


@pytest.fixture
def accounts_server(tmp_path, model_path) -> Server:
    """A server of its own with accounts (alice, bob): stopped at the end with whatever it
    is still reading."""
    server = start_server(tmp_path, model_path=model_path, max_tokens=8, users=PASSWORDS,
                          admins=())
    yield server
    server.stop()


def attach_over_http(server: Server, name: str, content: bytes, started, done) -> None:
    """Log in as alice in a session of its own (another tab) and attach a file as the page
    does; started and done (threading.Event) are set as its event starts and ends."""
    session = PageSession(server.url, "alice", PASSWORDS["alice"])
    try:
        uploaded = session.upload(name, content)
        assert uploaded.status_code == 200, uploaded.text
        joined = session.http.post("gradio_api/queue/join", json={
            "data": [[file_data(uploaded.json()[0], name)], []],
            "fn_index": session.fn_index("attach", "upload"), "trigger_id": None,
            "event_data": None, "session_hash": session.session_hash})
        assert joined.status_code == 200, joined.text
        with session.http.stream("GET", "gradio_api/queue/data", timeout=None,
                                 params={"session_hash": session.session_hash}) as stream:
            for line in stream.iter_lines():
                message = json.loads(line[5:]) if line.startswith("data:") else {}
                if message.get("msg") == "process_starts":
                    started.set()
                elif message.get("msg") == "process_completed":
                    done.set()
                    return
    except httpx.HTTPError:
        pass  # the server stopped at the test's end, still reading
    finally:
        session.close()


@pytest.mark.timeout(120)
def test_a_text_file_attaches_at_once_while_another_users_pdfs_are_read(browser,
                                                                        accounts_server,
                                                                        tmp_path):
    """Eight tabs of alice attach a slow PDF each (four pages of the crafted stream: 1.3-6 s
    of CPU a page); while all eight are in flight, bob's one-line .txt attaches at once. Before,
    the attach events ran eight at a time (the server's default concurrency) in the server's
    own process: bob's .txt waited for one of alice's PDFs to end. Now they run any number at
    once, alice's PDFs are read one at a time in a reader process, and a .txt needs none."""
    server = accounts_server
    note = tmp_path / "note.txt"
    note.write_text("Fog came at nine.\n", encoding="utf-8")
    context = browser.new_context()
    context.set_default_timeout(UI_TIMEOUT)
    bob = context.new_page()
    bob.goto(server.url)
    bob.fill("#username", "bob")
    bob.fill("#password", PASSWORDS["bob"])
    with bob.expect_response(page_load) as loaded:
        bob.click("button[type=submit]")
    shown_as_loaded(bob, loaded.value)
    slow = shared_stream_pdf(4)
    started = [threading.Event() for _ in range(8)]
    done = [threading.Event() for _ in range(8)]
    tabs = [threading.Thread(target=attach_over_http, daemon=True,
                             args=(server, f"slow{n}.pdf", slow, started[n], done[n]))
            for n in range(8)]
    try:
        for tab in tabs:
            tab.start()
        for event in started:
            assert event.wait(30), "alice's attach events did not all start"
        assert not any(event.is_set() for event in done), "alice's PDFs were read at once"
        start = time.monotonic()
        attach(bob, note)
        expect(bob.locator(ATTACHED)).to_have_count(1)
        took = time.monotonic() - start
        assert strip_names(bob) == ["note.txt"]
        ended = sum(event.is_set() for event in done)
    finally:
        context.close()
        server.stop()
        for tab in tabs:
            tab.join(30)
    print(f"\nbob's .txt attached in {took:.2f} s, {8 - ended} of alice's 8 PDFs in flight")
    assert ended == 0, f"bob's .txt waited for {ended} of alice's PDFs"
    assert took < 5, f"bob's .txt took {took:.1f} s to attach"


@pytest.fixture(scope="module")
def wide_server(tmp_path_factory, model_path) -> Server:
    """A server whose context holds a 3,000-token document with room for a reply."""
    server = start_server(tmp_path_factory.mktemp("documents"), model_path=model_path,
                          n_ctx=4096, max_tokens=8)
    yield server
    server.stop()


# Every text a reply's place showed while its message was read (render.shown_reply).
READING_SEEN_JS = """() => {
    window.__reading = [];
    new MutationObserver(() => {
        for (const note of document.querySelectorAll('#chatbot .reame-reading')) {
            if (!window.__reading.includes(note.innerText)) window.__reading.push(note.innerText);
        }
    }).observe(document.querySelector('#chatbot'),
               {subtree: true, childList: true, characterData: true});
}"""

# The document's size: docs/page.md's 3,000 tokens under make test-full; 1,000 in make test, where
# reading 3,000 tokens on one core of a busy machine took 42 s and checked nothing more.
DOC_WORDS, DOC_TOKENS = (2500, (2700, 3300)) if FULL else (830, (900, 1100))


def type_ahead_events(page: Page) -> set[int]:
    """The page's type-ahead events (their fn_index): the message box's change, and the one
    that follows a document's upload."""
    config = page.evaluate("window.gradio_config")
    upload = fn_index(config, "attach", "upload")
    after = {d["id"] for d in config["dependencies"] if d.get("trigger_after") == upload}
    return {fn_index(config, "message", "change"), *after}


def hold_type_ahead(page: Page) -> None:
    """Let no type-ahead call of the page reach the server: a message sent as it is."""
    events = type_ahead_events(page)

    def route(route):
        try:
            asked = json.loads(route.request.post_data or "{}").get("fn_index")
        except ValueError:
            asked = None
        if asked in events:
            route.fulfill(status=200, content_type="application/json",
                          body=json.dumps({"data": [], "is_generating": False,
                                           "duration": 0, "average_duration": 0,
                                           "render_config": None, "changed_state_ids": []}))
        else:
            route.continue_()

    page.route("**/gradio_api/run/predict*", route)


def test_a_document_is_read_while_its_question_is_typed(page, wide_server, tmp_path):
    """Attached, a document is evaluated at once (in the background, as typing is): sent with
    its question, only the question is read after Enter."""
    notes = tmp_path / "notes.md"
    notes.write_text(prose(DOC_WORDS // 2, 5), encoding="utf-8")
    open_app(page, wide_server)
    new_chat(page)
    events = type_ahead_events(page)
    with page.expect_response(lambda r: "/run/predict" in r.url and json.loads(
            r.request.post_data or "{}").get("fn_index") in events, timeout=REPLY_TIMEOUT):
        attach(page, notes)  # answered once the document is evaluated
    expect(page.locator(ATTACHED)).to_have_count(1)
    tokens = int(re.search(r"([\d,]+) tokens", page.locator(
        f"{ATTACHED} summary").inner_text()).group(1).replace(",", ""))
    send(page, "Who is the keeper?")
    stats = api(wide_server).predict(current_id(page), api_name="/get_chat")["messages"][1][
        "stats"]
    assert stats["typed_ahead"] >= tokens, (tokens, stats)
    assert stats["prefilled"] < 48, stats  # the question and the template's words around it
    assert f"{stats['typed_ahead']:,} evaluated while typing" in stats_figures(page)


def test_the_same_document_in_a_second_chat_answers_5x_sooner(page, wide_server, tmp_path):
    """The document is the chats' first content: the second chat starts from the first one's
    KV (the cache finds the shared opening by its tokens), so only the question is read. Each
    message is sent as it is, no type-ahead (which would read the first chat's document
    before Enter: test_a_document_is_read_while_its_question_is_typed)."""
    report = tmp_path / "report.md"
    report.write_text(prose(DOC_WORDS, 11), encoding="utf-8")
    open_app(page, wide_server)
    hold_type_ahead(page)
    seconds, tokens, reading = [], None, []
    for question in ("Who is the keeper?", "What is the weather like?"):
        new_chat(page)
        attach(page, report)
        expect(page.locator(ATTACHED)).to_have_count(1)
        tokens = int(re.search(r"([\d,]+) tokens", page.locator(
            f"{ATTACHED} summary").inner_text()).group(1).replace(",", ""))
        page.evaluate(READING_SEEN_JS)
        seconds.append(first_words_after_enter(page, question))
        wait_for_reply_done(page, 1)
        expect(page.locator(BOT)).to_have_count(1, timeout=REPLY_TIMEOUT)
        reading.append(page.evaluate("window.__reading"))
    # While the first chat read the document, its reply's place said how far; the second
    # chat, with the document's KV reused, read only the question: nothing to say.
    assert reading[0] and all(re.fullmatch(
        r"Reading your message: [\d,]+ of [\d,]+ tokens(, about .+ left)?…", text)
        for text in reading[0]), reading[0]
    done, total = (int(n.replace(",", "")) for n in re.findall(r"[\d,]+", reading[0][0])[:2])
    assert 0 < done < total and total >= tokens, reading[0]
    assert reading[1] == [], reading[1]
    expect(page.locator("#chatbot .reame-reading")).to_have_count(0)
    low, high = DOC_TOKENS
    assert low <= tokens <= high, f"the document is {tokens} tokens, not {low:,}-{high:,}"
    first, second = seconds
    stats = api(wide_server).predict(current_id(page), api_name="/get_chat")["messages"][1][
        "stats"]
    assert stats["reused"] >= tokens - 128, stats  # whole chunks of the shared opening
    assert first >= 5 * second, (
        f"first chat {first:.2f} s, second {second:.2f} s to the first words: "
        f"{first / second:.1f}x, not 5x")
    print(f"\nfirst words after Enter: first chat {first:.2f} s, second {second:.2f} s "
          f"({first / second:.1f}x), a {tokens:,}-token document")
    expect(page.locator(STATS)).to_have_count(1)

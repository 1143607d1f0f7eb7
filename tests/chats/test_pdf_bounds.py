"""Reading a PDF is bounded (reame/chats/pdf_worker.py, pdf_readers.py), with real files
written by hand (tests/pdf_files.py) read by real child processes:

- the crafted file (1,000 pages naming one compressed stream of 100,000 `(x) Tj`) really
  costs plain pypdf seconds a page, and is refused at once for its drawing instructions; so
  is the same cost hidden behind a form XObject drawn many times;
- each other bound is refused with its reason: pages, characters (reading stops there, before
  the rest is read), CPU seconds, wall-clock seconds (the child is gone after), memory;
  encrypted and broken files too;
- an ordinary multi-page PDF reads to the same text as pypdf in the server's process did, and
  a dense 1,000-page one stays far below the instructions bound;
- the readers' line: one user's PDFs take one reader, in turn; another user's PDF is read at
  once meanwhile; a user cannot queue more than max_waiting.
"""

from __future__ import annotations

import io
import os
import random
import threading
import time
from pathlib import Path

import pytest
from pypdf import PdfReader, PdfWriter

from reame.chats.documents import MAX_PAGES, DocumentRefused, read_document
from reame.chats.pdf_readers import LIMITS, PdfReaders, read_pdf
from reame.chats.pdf_worker import Limits, instruction_bytes

from tests.pdf_files import form_pdf, shared_stream_pdf, text_pdf

pytestmark = pytest.mark.timeout(120)

WORDS = ("keeper lamp storm ship rope tide night island stone stairs window signal fog horn "
         "boat gull winter supply letter weather wind wave rock coast beacon lens").split()


def lines(n_lines: int, seed: int, width: int = 90) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n_lines):
        line = ""
        while len(line) < width:
            line += rng.choice(WORDS) + " "
        out.append(line.strip().capitalize() + ".")
    return out


def refusal(data: bytes, limits: Limits = LIMITS, name: str = "file.pdf") -> tuple[str, float]:
    """read_pdf's refusal of data (it must refuse) and the seconds it took."""
    start = time.monotonic()
    with pytest.raises(DocumentRefused) as refused:
        read_pdf(name, data, limits)
    return str(refused.value), time.monotonic() - start


def children() -> set[int]:
    """The processes this one has started that still exist."""
    found = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        found.update(int(pid) for pid in (task / "children").read_text().split())
    return found


def test_the_crafted_file_costs_seconds_a_page_and_is_refused_at_once():
    data = shared_stream_pdf(1000)
    assert len(data) < 200_000
    # Plain pypdf, as the server ran it before: seconds for one page, a thousand of them.
    reader = PdfReader(io.BytesIO(data))
    start = time.process_time()
    assert reader.pages[0].extract_text() == "x" * 100_000
    per_page = time.process_time() - start
    assert per_page > 0.5, f"one page cost plain pypdf only {per_page:.2f} s of CPU"
    start = time.monotonic()
    with pytest.raises(DocumentRefused) as refused:
        read_document("crafted.pdf", data)
    took = time.monotonic() - start
    assert str(refused.value).startswith(
        "crafted.pdf holds too many drawing instructions to read: over 64,000,000 bytes of "
        "them by page 92")
    assert took < 10, f"refused after {took:.1f} s"
    print(f"\nplain pypdf: {per_page:.2f} s of CPU for one page of {len(data):,} bytes "
          f"({per_page * 1000 / 60:.0f} minutes for all); refused in {took:.2f} s")


def test_a_form_drawn_many_times_counts_each_time():
    # Three pages of 50 `/X Do` each; X holds 100,000 operators: 2 kB of file, about 70 s of
    # pypdf a page.
    data = form_pdf(3, 50)
    assert len(data) < 5_000
    message, took = refusal(data)
    assert "holds too many drawing instructions to read" in message, message
    assert "by page 2 " in message, message
    assert took < 10


def test_pages_are_bounded():
    message, _ = refusal(shared_stream_pdf(MAX_PAGES + 1, operators=1), name="long.pdf")
    assert message == f"long.pdf has {MAX_PAGES + 1:,} pages: at most {MAX_PAGES:,} can be read"
    assert read_pdf("short.pdf", shared_stream_pdf(MAX_PAGES, operators=1)).count("x") == 1000


def test_text_is_bounded_and_reading_stops_there():
    # 40 pages of 20,000 letters each (about 0.3 s of CPU a page): over 30,000 characters by
    # the second page. Reading them all would pass the 5 s CPU bound, so the reason shows
    # that reading stopped.
    limits = Limits(max_chars=30_000, cpu_s=5, wall_s=30)
    message, took = refusal(shared_stream_pdf(40, operators=20_000), limits)
    assert message == ("file.pdf holds more text than any chat could take: over 30,000 "
                       "characters"), message
    print(f"\nrefused for its text in {took:.2f} s")


def test_cpu_time_is_bounded():
    # Four pages of the crafted stream: 2-6 s of CPU each; one second is allowed.
    limits = Limits(cpu_s=1, wall_s=20)
    message, took = refusal(shared_stream_pdf(4), limits)
    assert message == "file.pdf takes more than 1 s of CPU time to read: it is refused"
    assert took < limits.wall_s  # ended by its CPU bound, not the wall-clock one
    print(f"\nrefused for 1 s of CPU after {took:.2f} s")


def test_wall_clock_time_is_bounded_and_the_reader_is_gone():
    limits = Limits(cpu_s=60, wall_s=2)
    before = children()
    message, took = refusal(shared_stream_pdf(4), limits)
    assert message == "file.pdf could not be read within 2 s: it is refused"
    assert limits.wall_s <= took < limits.wall_s + 3, took
    assert children() <= before, "the reader still runs"


def test_memory_is_bounded():
    # One page of a million operators: pypdf's list of them takes more than 200 MB.
    message, _ = refusal(shared_stream_pdf(1, operators=1_000_000), Limits(memory_mb=200))
    assert message == "file.pdf needs more than 200 MB of memory to read"


def test_encrypted_broken_and_not_pdf_files_are_refused():
    writer = PdfWriter()
    writer.add_blank_page(200, 200)
    writer.encrypt("secret", algorithm="RC4-128")
    encrypted = io.BytesIO()
    writer.write(encrypted)
    assert refusal(encrypted.getvalue())[0] == (
        "file.pdf is encrypted: save it without a password first")
    assert refusal(b"%PDF-1.4 and nothing else")[0].startswith(
        "file.pdf could not be read as a PDF (")
    assert refusal(b"plain words")[0] == "file.pdf is not a PDF file"


def old_pdf_text(data: bytes) -> str:
    """What reame/chats/documents.py read from a PDF before, in the server's own process."""
    pages = [page.extract_text() or "" for page in PdfReader(io.BytesIO(data)).pages]
    text = "\n\n".join(page.strip("\n") for page in pages if page.strip())
    return text.replace("\n</document>", "\n</ document>").strip("\n")


def test_an_ordinary_pdf_reads_to_the_same_text_as_before():
    pages = [lines(40, seed) for seed in range(30)]
    pages[7] = []  # a blank page
    pages[12][3] = "Brackets (like these) and a back\\slash survive."
    data = text_pdf(pages)
    document = read_document("book.pdf", data)
    assert document.text == old_pdf_text(data)
    assert document.name == "book.pdf"
    assert "Brackets (like these) and a back\\slash survive." in document.text
    assert document.text.count("\n\n") == 28  # 29 pages with text


def test_a_dense_thousand_page_book_is_far_below_the_instructions_bound():
    # 1,000 pages of 50 lines of 90 characters (typeset in two kerned parts a line).
    page = lines(50, 1)
    data = text_pdf([page] * 1000)
    counted, pages = instruction_bytes(PdfReader(io.BytesIO(data)).pages)
    assert pages == 1000
    assert counted * 4 < LIMITS.max_instruction_bytes, counted
    print(f"\na dense 1,000-page book: {counted:,} bytes of drawing instructions, "
          f"{LIMITS.max_instruction_bytes / counted:.0f}x below the bound")


# The readers' line.


class Turns:
    """Asks for turns of a PdfReaders from threads; each holds its turn until released."""

    def __init__(self, readers: PdfReaders):
        self.readers = readers
        self.started: list[str] = []
        self.refused: dict[str, str] = {}
        self.release: dict[str, threading.Event] = {}
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()

    def ask(self, who: str, user: str) -> None:
        self.release[who] = threading.Event()

        def run():
            try:
                with self.readers.turn(user, who):
                    with self.lock:
                        self.started.append(who)
                    assert self.release[who].wait(30)
            except DocumentRefused as exc:
                self.refused[who] = str(exc)

        self.threads.append(threading.Thread(target=run, daemon=True))
        self.threads[-1].start()
        time.sleep(0.05)  # in line before the next one asks

    def done(self, who: str) -> None:
        self.release[who].set()

    def wait_started(self, expected: list[str]) -> None:
        deadline = time.monotonic() + 5
        while self.started != expected and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)  # and no more than those
        assert self.started == expected


def test_one_users_pdfs_take_one_reader_and_others_are_served_in_turn():
    turns = Turns(PdfReaders(slots=2))
    for n in range(1, 5):  # alice attaches four PDFs
        turns.ask(f"a{n}", "alice")
    turns.wait_started(["a1"])  # one at a time: the second reader stays free
    turns.ask("b1", "bob")
    turns.wait_started(["a1", "b1"])  # bob is read at once
    turns.ask("c1", "carol")
    turns.wait_started(["a1", "b1"])  # both readers busy: carol waits
    turns.done("b1")
    turns.wait_started(["a1", "b1", "c1"])  # before alice's second: alice is being read
    turns.done("a1")
    turns.wait_started(["a1", "b1", "c1", "a2"])
    for who in ("c1", "a2", "a3", "a4"):
        turns.done(who)
    turns.wait_started(["a1", "b1", "c1", "a2", "a3", "a4"])
    for thread in turns.threads:
        thread.join(5)
    assert not turns.refused


def test_a_user_cannot_queue_more_than_max_waiting():
    turns = Turns(PdfReaders(slots=1, max_waiting=2))
    turns.ask("a1", "alice")
    turns.ask("a2", "alice")
    turns.ask("a3.pdf", "alice")
    turns.wait_started(["a1"])
    assert turns.refused == {"a3.pdf": "a3.pdf was not read: 2 of your PDFs are being read or "
                                       "wait for it; attach it once they are done"}
    turns.done("a1")
    turns.wait_started(["a1", "a2"])
    turns.done("a2")
    turns.ask("a4", "alice")  # room again
    turns.wait_started(["a1", "a2", "a4"])
    turns.done("a4")


@pytest.mark.slow
def test_another_users_pdf_is_read_while_one_user_has_slow_ones():
    readers = PdfReaders(slots=2, limits=Limits(cpu_s=3, wall_s=20))
    slow, results = shared_stream_pdf(4), {}

    def read_slow(n):
        try:
            results[n] = readers.read("alice", f"slow{n}.pdf", slow)
        except DocumentRefused as exc:
            results[n] = str(exc)

    threads = [threading.Thread(target=read_slow, args=(n,), daemon=True) for n in (1, 2)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    start = time.monotonic()
    text = readers.read("bob", "notes.pdf", text_pdf([["Fog came at nine."]]))
    took = time.monotonic() - start
    assert text == "Fog came at nine."
    assert not results, "alice's PDFs ended first"
    for thread in threads:
        thread.join(30)
    assert results == {n: f"slow{n}.pdf takes more than 3 s of CPU time to read: it is refused"
                       for n in (1, 2)}
    print(f"\nbob's PDF read in {took:.2f} s while alice's were")

"""PDFs written by hand for the tests of reading them (tests/chats/test_pdf_bounds.py,
tests/web/page/test_page_documents.py): ordinary pages of text, and the crafted ones that cost pypdf
seconds of CPU a page in a file of a few kB."""

from __future__ import annotations

import zlib

FONT = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"


def assemble(objects: list[bytes]) -> bytes:
    """A PDF of objects (numbered from 1; the first is the catalog) with its xref table."""
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


def stream(data: bytes, extra: bytes = b"") -> bytes:
    """A stream object holding data, compressed (FlateDecode)."""
    packed = zlib.compress(data, 9)
    return (b"<< /Length %d /Filter /FlateDecode %s>>\nstream\n" % (len(packed), extra)
            + packed + b"\nendstream")


def _document(page_bodies: list[bytes], shared: list[bytes]) -> bytes:
    """Catalog (1), page tree (2), font (3), the shared objects (from 4), then each page
    (its body may name the shared objects as 4 0 R, ...)."""
    first = 4 + len(shared)
    kids = b" ".join(b"%d 0 R" % (first + n) for n in range(len(page_bodies)))
    return assemble([b"<< /Type /Catalog /Pages 2 0 R >>",
                     b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, len(page_bodies)),
                     FONT, *shared, *page_bodies])


def _page(contents: bytes, xobjects: bytes = b"") -> bytes:
    return (b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents %s "
            b"/Resources << /Font << /F1 3 0 R >> %s>> >>" % (contents, xobjects))


def shows(operators: int) -> bytes:
    """A content stream of that many text operators, each showing one letter."""
    return b"BT /F1 12 Tf 72 720 Td " + b"(x) Tj " * operators + b"ET"


def shared_stream_pdf(pages: int, operators: int = 100_000) -> bytes:
    """Pages that all name one content stream of operators `(x) Tj` (the attack: a few kB
    compressed, interpreted once for each page)."""
    return _document([_page(b"4 0 R")] * pages, [stream(shows(operators))])


def form_pdf(pages: int, draws: int, operators: int = 100_000) -> bytes:
    """Pages whose own content is short, drawing one form XObject of operators `(x) Tj`
    draws times (`/X Do`): the same cost hidden behind a form."""
    form = stream(shows(operators), b"/Type /XObject /Subtype /Form /BBox [0 0 612 792] "
                                    b"/Resources << /Font << /F1 3 0 R >> >> ")
    content = stream(b"q " + b"/X Do " * draws + b"Q")
    return _document([_page(b"5 0 R", b"/XObject << /X 4 0 R >> ")] * pages, [form, content])


def text_pdf(pages: list[list[str]]) -> bytes:
    """An ordinary PDF: each page a list of lines of text, set as a typesetter would (each
    line a TJ array with kerning between its parts)."""
    bodies, streams = [], []
    for n, lines in enumerate(pages):
        ops = [b"BT /F1 10 Tf 12 TL 72 740 Td"]
        for line in lines:
            raw = line.encode("latin-1").replace(b"\\", b"\\\\").replace(
                b"(", b"\\(").replace(b")", b"\\)")
            half = len(raw) // 2
            ops.append(b"[(%s)-12(%s)]TJ T*" % (raw[:half], raw[half:]))
        ops.append(b"ET")
        streams.append(stream(b"\n".join(ops)))
        bodies.append(_page(b"%d 0 R" % (4 + n)))
    return _document(bodies, streams)

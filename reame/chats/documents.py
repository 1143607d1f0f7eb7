"""Documents attached to a message: their text, and how it sits in the message.

A document goes into the message as text, before what the person typed, in a block the page
shows folded (and the person can read, or remove before sending):

    <document name="notes.md">
    ...its text...
    </document>

The message stored is exactly what the model reads, so everything else (the KV cache, search,
export, branches) works on it as on any message. A chat whose first message opens with the
same document as an earlier chat of the same user starts from that chat's KV: the document is
evaluated once (the cache finds the shared opening by its tokens).

Text files are read as UTF-8, here (cheap); PDFs through pypdf (text only: no images, no OCR)
in a bounded process of their own (pdf_readers.py, pdf_worker.py): a crafted PDF can cost
minutes of CPU.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePath

from reame.chats.pdf_readers import MAX_PAGES  # noqa: F401 (documents.MAX_PAGES)
from reame.chats.pdf_readers import read_pdf as read_pdf_at_once
from reame.config.refusals import DocumentRefused  # noqa: F401 (documents.DocumentRefused)

PDF = ".pdf"
# Text, Markdown and code: read as UTF-8 text.
TEXT_KINDS = (".txt", ".md", ".markdown", ".rst", ".csv", ".tsv", ".log", ".json", ".yaml",
              ".yml", ".toml", ".ini", ".conf", ".xml", ".html", ".css", ".py", ".js", ".ts",
              ".tsx", ".jsx", ".java", ".c", ".h", ".cpp", ".hpp", ".cc", ".rs", ".go", ".rb",
              ".php", ".sh", ".sql", ".kt", ".swift", ".cs", ".lua", ".r", ".tex")
KINDS = (*TEXT_KINDS, PDF)
MAX_NAME = 120  # characters of a document's name kept

_OPEN = '<document name="{name}">\n'
_CLOSE = "\n</document>\n\n"
_BLOCK = re.compile(r'<document name="([^"\n]*)">\n(.*?)\n</document>\n\n', re.DOTALL)


@dataclass(frozen=True)
class Document:
    name: str
    text: str

    @property
    def block(self) -> str:
        """The document as it goes into the message."""
        return _OPEN.format(name=self.name) + self.text + _CLOSE


def clean_name(name: str) -> str:
    """A file's name as a document's: its last part, without what would end the block's
    opening line (quotes, angle brackets, line breaks)."""
    base = PurePath(str(name).replace("\\", "/")).name
    base = re.sub(r'["<>\r\n\t]', "_", base).strip() or "document"
    return base[:MAX_NAME]


def kind_of(name: str) -> str | None:
    """The kind of a file by its name (".md", ".pdf", ...), or None if it is not taken."""
    suffix = PurePath(name).suffix.lower()
    return suffix if suffix in KINDS else None


def read_document(name: str, data: bytes,
                  read_pdf: Callable[[str, bytes], str] | None = None) -> Document:
    """The document a file holds, or DocumentRefused saying why not. read_pdf(name, data):
    a PDF's text (default: pdf_readers.read_pdf, a bounded process, at once; the page waits
    for its turn among users' PDFs: PdfReaders.read)."""
    kind = kind_of(name)
    shown = clean_name(name)
    if kind is None:
        raise DocumentRefused(
            f"{shown} cannot be attached: only text, Markdown, code and PDF files can "
            f"({', '.join(KINDS)})")
    if kind == PDF:
        text = (read_pdf or read_pdf_at_once)(shown, data)
    else:
        text = _plain_text(shown, data)
    # A text holding the block's own closing line would end the block early.
    text = text.replace("\n</document>", "\n</ document>").strip("\n")
    if not text.strip():
        raise DocumentRefused(f"{shown} holds no text to read")
    return Document(shown, text)


def _plain_text(name: str, data: bytes) -> str:
    if b"\0" in data:
        raise DocumentRefused(f"{name} is not a text file (it holds binary data)")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise DocumentRefused(f"{name} is not UTF-8 text") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def compose(documents: list[Document], text: str) -> str:
    """The message: the documents' blocks, then what the person typed."""
    return "".join(d.block for d in documents) + text


def split(message: str) -> tuple[list[Document], str]:
    """The documents at the start of a message and the rest of it (compose's inverse)."""
    documents, at = [], 0
    while (found := _BLOCK.match(message, at)) is not None:
        documents.append(Document(found.group(1), found.group(2)))
        at = found.end()
    return documents, message[at:]

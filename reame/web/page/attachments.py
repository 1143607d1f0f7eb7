"""Documents attached to the message being written: the page's strip of them above the message
box, and the handlers that add and remove them (layout.py wires them).

Attaching runs for everyone at once (layout.py: no concurrency limit): a text file is read at
once, a PDF waits for its turn among the server's PDF readers, one at a time per user
(reame/chats/pdf_readers.py), so one person's slow PDFs never hold up another's attachments.

The documents wait in a gr.State (a list of {"name", "text", "tokens"}) until the message is
sent: begin_send puts them into it (documents.compose), where the person sees them folded. Each
is shown in the strip with its size, its text on demand, and a button that removes it.
"""

from __future__ import annotations

import html

import gradio as gr

from reame.chats.documents import Document, DocumentRefused, clean_name, compose, read_document
from reame.chats.pdf_readers import PdfReaders
from reame.chats.service import ChatService
from reame.config.refusals import ChatError
from reame.web.http.uploads import UploadRefused, Uploads, session_key
from reame.web.http.user import user_of

MAX_DOCUMENTS = 8  # attached to one message

def strip_html(docs: list[dict]) -> str:
    """The attached documents as the strip shows them ('' when there are none)."""
    if not docs:
        return ""
    items = []
    for n, doc in enumerate(docs):
        name = html.escape(doc["name"])
        size = (f'{doc["tokens"]:,} tokens' if doc.get("tokens") is not None
                else f'{len(doc["text"]):,} characters')
        items.append(
            f'<li class="reame-attached"><details><summary>{name} · {size}</summary>'
            f'<pre class="reame-doc-text">{html.escape(doc["text"])}</pre></details>'
            f'<button type="button" class="reame-detach" data-reame-detach="{n}" '
            f'aria-label="Remove {name}" title="Remove {name}">✕</button></li>')
    return (f'<ul class="reame-attachments" aria-label="Attached documents">{"".join(items)}'
            "</ul>")


def with_documents(docs: list[dict] | None, text: str) -> str:
    """The message to send: the attached documents, then what was typed."""
    return compose([Document(d["name"], d["text"]) for d in docs or []], text)


class Attachments:
    def __init__(self, service: ChatService, uploads: Uploads | None,
                 readers: PdfReaders | None = None):
        self.service, self.uploads = service, uploads
        self.readers = readers or PdfReaders()

    def attach(self, uploaded, docs, request: gr.Request):
        """Read the uploaded files (through the upload ledger) and add them to the strip; a
        file that cannot be attached is named with the reason, the others are added."""
        docs = list(docs or [])
        if self.uploads is None:
            raise gr.Error("Nothing was attached: this server takes no uploads",
                           print_exception=False)
        paths = uploaded if isinstance(uploaded, list) else [uploaded]
        key = session_key(request.headers.get("cookie", ""))
        # Whose turn a PDF waits for: the logged-in user (without accounts, the one user).
        user = user_of(request) or key

        def read_pdf(name: str, data: bytes) -> str:
            return self.readers.read(user, name, data)

        problems = []
        for path in filter(None, paths):
            name = clean_name(getattr(path, "orig_name", None) or str(path))
            try:
                data = self.uploads.take(path, key)
                if len(docs) >= MAX_DOCUMENTS:
                    raise DocumentRefused(f"at most {MAX_DOCUMENTS} documents go with one "
                                          "message")
                doc = read_document(name, data, read_pdf)
                tokens = self.service.document_tokens(doc.text)
            except (UploadRefused, ChatError) as exc:
                problems.append(f"{name}: {exc}")
                continue
            docs.append({"name": doc.name, "text": doc.text, "tokens": tokens})
        if problems:
            gr.Warning("Not attached: " + "; ".join(problems))
        return docs, strip_html(docs)

    def detach(self, which, docs):
        """Remove the document the strip's ✕ named (its place in the list)."""
        docs = list(docs or [])
        try:
            del docs[int(which)]
        except (ValueError, TypeError, IndexError):
            pass  # already removed (a double click)
        return docs, strip_html(docs), ""

"""A PDF's text, read in a process of its own: `python -m reame.chats.pdf_worker LIMITS` takes
the file on stdin and writes {"text": ...} or {"refused": why} as JSON on stdout.

pypdf interprets a page's drawing instructions one by one in Python: a 2 kB file whose 1,000
pages all name one compressed content stream of 100,000 `(x) Tj` operators costs seconds of
CPU per page, half an hour in all, and only then would its text be refused as too long. So the
reading is bounded, each bound refused with words that say which:

- pages: at most max_pages;
- drawing instructions: before any text is read, the bytes of content pypdf would interpret
  are added up page by page, a stream shared by many pages counted once for each page (it is
  interpreted once for each), and a form XObject once for each `Do` that draws it. pypdf
  costs about 2 ms of CPU a kB on this 2-core machine whatever the content, so this bounds
  the CPU time of a file of valid instructions before it is spent;
- characters of text: reading stops past max_chars;
- CPU time and memory: the process limits itself (RLIMIT_CPU, RLIMIT_AS) before it reads
  anything, so whatever pypdf does on a crafted file, it ends; and the parent
  (reame/chats/pdf_readers.py) kills it at a wall-clock bound.

A reason is written to follow the file's name ("paper.pdf has 1,200 pages: ...").
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
from collections import Counter
from dataclasses import asdict, dataclass

# A 1,000-page book of dense text is 10-20 MB of content (a page of 50 kerned lines: 11 kB,
# 18 ms); 64 MB is several times that, about 2 minutes of pypdf, past the CPU bound anyway.
MAX_INSTRUCTION_BYTES = 64_000_000
# More than the largest context reame.conf allows (131,072 tokens) could hold at 30
# characters a token, more than any tokenizer averages.
MAX_CHARS = 4_000_000
CPU_S = 60  # a 1,000-page book of dense text takes about 20 s
WALL_S = 120  # two readers and the model share the cores
MEMORY_MB = 1024
FORM_DEPTH = 8  # forms drawn by forms: deeper ones are not counted (pypdf skips cycles)

# Operators that make pypdf interpret a content stream (pypdf skips one without any, unread).
_TEXT_OPERATOR = re.compile(rb"T[jJ]|Do|['\"]")
# A `Do` and the name of what it draws (a name may spell characters as #xx).
_DRAW = re.compile(rb"/([^\s/\[\]()<>{}%]+)\s*Do\b")
_ESCAPE = re.compile(rb"#([0-9A-Fa-f]{2})")


@dataclass(frozen=True)
class Limits:
    max_pages: int = 1000
    max_instruction_bytes: int = MAX_INSTRUCTION_BYTES
    max_chars: int = MAX_CHARS
    cpu_s: int = CPU_S
    wall_s: float = WALL_S
    memory_mb: int = MEMORY_MB

    def argument(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_argument(cls, text: str) -> Limits:
        return cls(**json.loads(text))


class Refused(Exception):
    """The file is not read; the words follow its name."""


def pdf_text(data: bytes, limits: Limits) -> str:
    """The text of a PDF's pages, one after the other (blank pages left out), or Refused."""
    from pypdf import PdfReader  # only a reader process loads pypdf

    reader = PdfReader(io.BytesIO(data))
    if reader.is_encrypted:
        raise Refused("is encrypted: save it without a password first")
    if len(reader.pages) > limits.max_pages:
        raise Refused(f"has {len(reader.pages):,} pages: at most {limits.max_pages:,} can be "
                      "read")
    bound = limits.max_instruction_bytes
    instructions, pages = instruction_bytes(reader.pages, stop_past=bound)
    if instructions > bound:
        raise Refused(f"holds too many drawing instructions to read: over {bound:,} bytes "
                      f"of them by page {pages:,} (each page counts all it draws, shared or "
                      "not)")
    texts, chars = [], 0
    for page in reader.pages:
        text = page.extract_text() or ""
        chars += len(text)
        if chars > limits.max_chars:
            raise Refused(f"holds more text than any chat could take: over "
                          f"{limits.max_chars:,} characters")
        texts.append(text)
    return "\n\n".join(text.strip("\n") for text in texts if text.strip())


def instruction_bytes(pages, stop_past: int | None = None) -> tuple[int, int]:
    """The bytes of drawing instructions pypdf interprets to read the pages' text, counted as
    it interprets them, and how many pages were counted (it stops at the first page that
    takes the sum past stop_past)."""
    costs: dict = {}  # what a stream costs with the resources it is drawn with
    total = number = 0
    for number, page in enumerate(pages, 1):
        total += _cost(page.get("/Contents"), page.get("/Resources"), costs, 0)
        if stop_past is not None and total > stop_past:
            break
    return total, number


def _cost(contents, resources, costs: dict, depth: int) -> int:
    """The bytes of instructions interpreted to read contents (a stream or an array of them)
    with resources: its own, and each form it draws, once for each time it draws it."""
    streams = _streams(contents)
    if not streams or depth > FORM_DEPTH:
        return 0
    resources = _resolve(resources)
    key = (tuple(map(id, streams)), id(resources))
    if key in costs:
        return costs[key]
    costs[key] = 0  # a form that draws itself: pypdf skips it
    data = (streams[0].get_data() if len(streams) == 1
            else b"\n".join(stream.get_data() for stream in streams))
    cost = 0
    if _TEXT_OPERATOR.search(data):
        cost = len(data)
        forms = _forms(resources)
        if forms:
            drawn = Counter(_ESCAPE.sub(lambda m: bytes([int(m[1], 16)]), name)
                            for name in _DRAW.findall(data))
            for name, times in drawn.items():
                form = forms.get(name)
                if form is not None:
                    cost += times * _cost(form, form.get("/Resources"), costs, depth + 1)
    costs[key] = cost
    return cost


def _resolve(obj):
    return obj.get_object() if obj is not None and hasattr(obj, "get_object") else obj


def _streams(contents) -> list:
    """The streams of a page's or a form's content (an array of streams, a stream, none)."""
    contents = _resolve(contents)
    if contents is None:
        return []
    parts = contents if isinstance(contents, list) else [contents]
    return [s for s in map(_resolve, parts) if hasattr(s, "get_data")]


def _forms(resources) -> dict[bytes, object]:
    """The form XObjects of resources by name (as bytes, without the slash)."""
    if not hasattr(resources, "get"):
        return {}
    xobjects = _resolve(resources.get("/XObject"))
    if not hasattr(xobjects, "items"):
        return {}
    forms = {}
    for name, ref in xobjects.items():
        xobject = _resolve(ref)
        if hasattr(xobject, "get_data") and xobject.get("/Subtype") == "/Form":
            forms[str(name).lstrip("/").encode("utf-8", "surrogateescape")] = xobject
    return forms


def _limit_self(limits: Limits, parent: int) -> None:
    """Bound this process before it reads anything: CPU seconds (SIGXCPU ends it, no core
    file), address space, and its life (it dies with the thread that started it)."""
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    cpu_s = int(limits.cpu_s)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    memory = limits.memory_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the parent's wall-clock bound still ends it
    if os.getppid() != parent:  # the parent was gone before the line above
        sys.exit(1)


def main(argv: list[str]) -> int:
    limits = Limits.from_argument(argv[0])
    _limit_self(limits, int(argv[1]))
    data = sys.stdin.buffer.read()
    import logging

    logging.disable(logging.WARNING)  # pypdf's notes on a malformed file: not the answer
    try:
        answer = {"text": pdf_text(data, limits)}
    except Refused as exc:
        answer = {"refused": str(exc)}
    except MemoryError:
        answer = {"refused": f"needs more than {limits.memory_mb:,} MB of memory to read"}
    except RecursionError:
        answer = {"refused": "could not be read as a PDF (it nests too deeply)"}
    except Exception as exc:  # noqa: BLE001 - pypdf on a broken file: any kind of error
        answer = {"refused": f"could not be read as a PDF ({exc})"}
    sys.stdout.write(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

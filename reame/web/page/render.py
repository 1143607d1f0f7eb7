"""Chat messages -> what the page shows: markdown with HTML made inert, and the stats line."""

from __future__ import annotations

import html
import re

from reame.chats.chat_keeper import being_written, unfinished
from reame.chats.documents import Document, compose, split
from reame.chats.messages import ChatMessage, ChatTree, Role
from reame.inference.cache_state import FROM_FILES
from reame.inference.turn import TurnStats, TurnUpdate

# Fenced code blocks and inline code spans: markdown shows their content literally already.
_CODE = re.compile(r"(```.*?(?:```|\Z)|`[^`\n]+`)", re.DOTALL)


def inert_html(text: str) -> str:
    """Escape HTML outside code so that markdown renders but no tag ever reaches the page."""
    parts = _CODE.split(text)
    return "".join(
        part if n % 2 else html.escape(part, quote=False).replace("&gt;", ">")
        for n, part in enumerate(parts)
    )


# A document in a message, folded (its text on one line of HTML: a blank line inside it would
# end markdown's HTML block).
_FOLDED = re.compile(r'<details class="reame-doc" title="([^"]*)">.*?<pre>(.*?)</pre></details>\n*',
                     re.DOTALL)


def user_html(text: str) -> str:
    """A user's message as shown: its documents folded (their names, their text on demand),
    then what they typed with HTML made inert."""
    documents, rest = split(text)
    folded = "".join(
        f'<details class="reame-doc" title="{html.escape(d.name)}"><summary>Attached: '
        f'{html.escape(d.name)} · {counted_lines(d.text)}</summary><pre>'
        f'{html.escape(d.text, quote=False).replace(chr(10), "&#10;")}</pre></details>\n\n'
        for d in documents)
    return folded + inert_html(rest)


def counted_lines(text: str) -> str:
    """A document's size in lines: "1 line", "12 lines"."""
    n = text.count("\n") + 1
    return f"{n:,} line{'' if n == 1 else 's'}"


def user_text(shown: str) -> str:
    """user_html's inverse for the documents, as an edit of a message sends it back: each
    folded document becomes the document again."""
    documents, at = [], 0
    while (found := _FOLDED.match(shown, at)) is not None:
        documents.append(Document(html.unescape(found.group(1)), html.unescape(found.group(2))))
        at = found.end()
    return compose(documents, shown[at:])


def reply_markdown(text: str, stats: dict | TurnStats | None = None, *,
                   writing: bool = False, calls: str = "") -> str:
    """A reply as shown: HTML made inert, its tool calls folded (calls: called_tools'), then
    its stats line (if any).

    A reply cut by max_tokens or by stop can end inside a code fence; close it first, or the
    fence swallows the stats line, which then shows as raw HTML in a code block.
    """
    shown = inert_html(text)
    unclosed = _CODE.findall(shown)
    if unclosed and unclosed[-1].startswith("```") and (
            len(unclosed[-1]) < 6 or not unclosed[-1].endswith("```")):
        shown += "\n```"
    return shown + calls + stats_line(stats, text, writing=writing)


def called_tools(message: ChatMessage, results: dict[str, ChatMessage]) -> str:
    """A reply's tool calls, each folded with its result inside ("Called get_weather(city=
    "Paris")"; results: the tool messages by the call they answer). Each on one line of HTML,
    as a folded document is (a blank line would end markdown's HTML block)."""
    folded = []
    for call in message.tool_calls:
        result = results.get(call.id)
        inside = ('<p class="reame-call-waiting">No result yet.</p>' if result is None else
                  f'<pre>{html.escape(result.content, quote=False).replace(chr(10), "&#10;")}'
                  "</pre>")
        folded.append(f'<details class="reame-call"><summary>Called '
                      f"{html.escape(call.shown, quote=False)}</summary>{inside}</details>")
    return ("\n\n" if message.content.strip() else "") + "\n\n".join(folded) if folded else ""


def shown_rows(messages: list[ChatMessage]) -> list[ChatMessage]:
    """The messages the Chatbot shows as its rows: a tool's result is folded under the reply
    that called it, not a row of its own."""
    return [m for m in messages if m.role != Role.TOOL]


def shown_reply(update: TurnUpdate) -> str:
    """A streamed update as the page shows it: the reply so far (with its stats line once
    done), or, while the turn waits for a free slot, its place in line, or, while a long
    message is read, how far."""
    if update.queued:
        return (f'<span class="reame-queued">Waiting for a free slot: '
                f"{ordinal(update.queued)} in line…</span>")
    if update.reading is not None:
        done, total = update.reading
        left = (f", about {seconds(update.reading_left_s)} left"
                if update.reading_left_s >= 1 else "")
        return (f'<span class="reame-reading" role="status">Reading your message: {done:,} of '
                f"{total:,} tokens{left}…</span>")
    return reply_markdown(update.text, update.stats if update.done else None)


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, ..., 21st."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


# Under a reply whose turn never ended: the server stopped (a crash, a kill) while writing it.
CUT_BY_RESTART = ("Cut off: the server stopped while writing this reply. It is kept as far as "
                  "it had been saved; Continue goes on from there.")
# Under a reply still being written (by an API client's turn in this chat), as far as it got.
BEING_WRITTEN = "Being written: this is the reply so far."


def stats_line(stats: dict | TurnStats | None, text: str = "", *, writing: bool = False) -> str:
    """The stats line as the page shows it under a reply (stats as stored, or of a turn; text:
    the reply's): what happened in words (stats_words), the figures under Details
    (stats_text). One line of HTML, no div inside (page.js's copy cuts at the first </div>)."""
    if not stats:
        return ""
    if isinstance(stats, dict):
        if unfinished(stats):  # written as it streams: still (writing), or cut by a stop
            words = BEING_WRITTEN if writing else CUT_BY_RESTART
            return ('\n\n<div class="reame-stats"><span class="reame-stats-words">'
                    f"{html.escape(words)}</span></div>")
        stats = TurnStats.from_dict(stats)
    return (f'\n\n<div class="reame-stats"><span class="reame-stats-words">'
            f"{html.escape(stats_words(stats, text))}</span> "
            f'<details class="reame-stats-more"><summary>Details</summary>'
            f'<span class="reame-stats-tech">{html.escape(stats_text(stats))}</span>'
            "</details></div>")


def seconds(s: float) -> str:
    """A time as people say it: 22 ms, 0.4 s, 13 s, 2 min 5 s."""
    if s < 0.1:
        return f"{round(s * 1000):,} ms"
    if s < 10:
        return f"{s:.1f} s"
    if s < 90:
        return f"{s:.0f} s"
    minutes, rest = divmod(round(s), 60)
    return f"{minutes} min {rest} s" if rest else f"{minutes} min"


def counted(n: int, word: str) -> str:
    """1 word, 2 words, 2,026 words."""
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def stats_words(stats: TurnStats, text: str = "") -> str:
    """What a turn did, in words a person reads at a glance: where the chat's history came
    from and what recomputing it would have cost, the wait for the first words, what was
    written, and how it ended. text: the reply (its words are counted; a Continue's only
    from where it went on)."""
    sentences = []
    history = stats.reused - stats.typed_ahead  # reused before the message was typed
    if history > 0:
        saved = (f" (recomputing them would take about {seconds(history / stats.prefill_rate)})"
                 if stats.prefill_rate > 0 else "")
        earlier = counted(history, "earlier token")
        if stats.earlier_messages == 0 and stats.source not in FROM_FILES:
            sentences.append(f"Started from the chat's opening, {counted(history, 'token')} "
                             f"already in memory{saved}")
        elif stats.source in FROM_FILES:
            quick = " instantly" if stats.restore_ms < 1000 else ""
            if stats.source == "prefix":
                sentences.append(f"Started from {counted(history, 'token')} read before "
                                 "for another chat (the same opening), reloaded from disk in "
                                 f"{seconds(stats.restore_ms / 1000)}{saved}")
            else:
                where = ("the chat it branched from" if stats.source == "branch"
                         else "disk")
                sentences.append(f"Continued{quick}: {earlier} reloaded from {where} in "
                                 f"{seconds(stats.restore_ms / 1000)}{saved}")
        else:
            sentences.append(f"Continued instantly: {earlier} still in memory{saved}")
    if stats.read_again:
        sentences.append(f"{counted(stats.read_again, 'earlier token')} read again: this "
                         "model's memory can go back only to a saved checkpoint")
    wait = stats.waited_s or stats.first_token_s
    written = len(text[stats.continued_chars:].split()) if text else stats.generated
    what = "word" if text else "token"
    if stats.continued_chars:
        start = f"Went on in {seconds(wait)}"
        more = f"more {what}"
    else:
        start = f"Read your message in {seconds(wait)}"
        if stats.typed_ahead:
            start += " (most of it while you typed)"
        more = what
    if stats.generated == 0:
        wrote = "wrote nothing"
        start = start if wait else ""
    elif stats.generated == 1 or stats.tokens_per_s <= 0:
        wrote = f"wrote {counted(written, more)}"
    else:
        wrote = (f"wrote {counted(written, more)} in "
                 f"{seconds((stats.generated - 1) / stats.tokens_per_s)}")
    sentences.append(f"{start}, {wrote}" if start else wrote[0].upper() + wrote[1:])
    if stats.shifted:
        sentences.append("The chat outgrew the model's memory: its oldest part was let go, "
                         "nothing recomputed")
    elif stats.window_recomputed:
        sentences.append("The chat outgrew the model's memory: its oldest messages were left "
                         "out and the rest read again")
    if stats.stopped:
        sentences.append("You stopped it")
    elif stats.at_limit:
        sentences.append(f"Cut at the limit of {stats.generated:,} tokens (Max tokens, in the "
                         "chat's settings)")
    return ". ".join(sentences) + "."


def stats_text(stats: TurnStats) -> str:
    """The figures under a reply's Details: where its history came from, and how fast."""
    history = stats.reused - stats.typed_ahead  # reused before the message was typed
    if stats.source in FROM_FILES:
        where = {"disk": "from disk", "branch": "from the chat it branched from"}.get(
            stats.source, "from a shared prefix")
        head = f"restored {history:,} tokens {where} in {stats.restore_ms:,.0f} ms"
    elif history:
        head = f"reused {history:,} tokens in memory"
    else:
        head = "no cached history"
    parts = [head] + ([f"{stats.typed_ahead:,} evaluated while typing"]
                      if stats.typed_ahead else []) + [
             *([f"back to a checkpoint: {stats.read_again:,} read again"]
               if stats.read_again else []),
             f"prefilled {stats.prefilled:,} in {stats.prefill_ms:,.0f} ms",
             # What the person waited: from the message's arrival, when known.
             f"first token {stats.waited_s or stats.first_token_s:.2f} s",
             # One token has no rate ("1 tokens at 0.0 tok/s" said nothing).
             f"{stats.generated} tokens at {stats.tokens_per_s:.1f} tok/s"
             if stats.generated != 1 else "1 token"]
    if stats.shifted:
        parts.append(f"context shifted: {stats.shifted:,} oldest tokens dropped, "
                     "nothing recomputed")
    elif stats.window_recomputed:
        parts.append("context full: oldest messages dropped, kept window re-evaluated")
    if stats.stopped:
        parts.append("stopped")
    elif stats.at_limit:
        parts.append(f"cut at the limit of {stats.generated:,} tokens (Max tokens, in the "
                     "chat's settings)")
    return " · ".join(parts)


WINDOW_MARKER = ('\n\n<div class="reame-window">⋯ earlier messages are outside the model\'s '
                 'memory ⋯</div>')


def window_marker(outside: list[ChatMessage]) -> str:
    """The marker under the last reply outside the model's window, naming the documents
    attached to the messages outside it: the model no longer reads them (without a word, it
    made up answers from them)."""
    names = list(dict.fromkeys(d.name for m in outside if m.role == Role.USER
                               for d in m.parts[0]))
    if not names:
        return WINDOW_MARKER
    listed = ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]
    return ('\n\n<div class="reame-window">⋯ earlier messages are outside the model\'s memory: '
            f"it no longer reads {html.escape(listed)} ⋯</div>")


def when_marker(created_at: float) -> str:
    """When a message was written, for the page to show on hover in the person's own time
    (page.js): an empty div whose class says it (the Chatbot's sanitizer keeps classes)."""
    return f'\n\n<div class="reame-at-{created_at:.0f}"></div>'


# What to_chatbot adds after a message's own text: its tools, then when it was written.
_ADDED = re.compile(r'(?:\n*<div class="reame-tools">[^\n]*</div>)?'
                    r'\n*<div class="reame-at-\d+"></div>\s*\Z')


def without_added(shown: str) -> str:
    """A message as the Chatbot holds it (e.g. an edit's text), without what to_chatbot added
    after its text."""
    return _ADDED.sub("", shown)


def to_chatbot(messages: list[ChatMessage], window_start: int = 0,
               tree: ChatTree | None = None) -> list[dict]:
    """Messages in the Chatbot's format; each reply carries its stats line, and the last reply
    before the model's window (window_start, a message position) carries a quiet marker.
    With the chat's tree, each message also carries its tools (message_tools). Each ends with
    when it was written (when_marker)."""
    results = {m.tool_call_id: m for m in messages if m.role == Role.TOOL}
    last_outside = max((n for n, m in enumerate(messages) if m.position < window_start),
                       default=None)
    shown = []
    for n, m in enumerate(messages):
        if m.role == Role.TOOL:
            continue  # folded under the reply that called it (called_tools)
        if m.role == Role.ASSISTANT:
            content = reply_markdown(m.content, m.stats, writing=being_written(m.id),
                                     calls=called_tools(m, results))
            if n == last_outside:
                content += window_marker(messages[:n])
        else:
            content = user_html(m.content)
        if tree is not None:
            content += message_tools(m, tree)
        content += when_marker(m.created_at)
        shown.append({"role": m.role, "content": content})
    if tree is not None and messages and messages[-1].role in (Role.USER, Role.TOOL):
        shown.append({"role": Role.ASSISTANT, "content": UNANSWERED})
    return shown


# Under the chat's last message when it has no reply (a Stop while it was still being read):
# in the Chatbot's place of a reply, so that its Retry answers it.
UNANSWERED = ('<div class="reame-unanswered">No reply: it was stopped before the reply began. '
              "Retry answers it.</div>")


def answered(shown: list[dict]) -> list[dict]:
    """The chat as to_chatbot showed it, without its note of a message left unanswered (a
    message sent after it, or its retry, is answered)."""
    return shown[:-1] if shown and shown[-1]["content"] == UNANSWERED else shown


def message_tools(message: ChatMessage, tree: ChatTree) -> str:
    """The buttons under a message: ‹ 2/3 › between its versions (when it was edited or
    retried), and "Branch from here" under a reply. The Chatbot's sanitizer keeps only
    classes and titles, so a button's action is its class, reame-act-KIND-ID, which the
    page's script sends (page.js); users' text never carries a class (inert_html)."""
    version, versions, ids = message.version, message.versions, message.version_ids
    buttons = []
    if versions > 1:
        buttons += [
            _tool("‹", "Previous version", f"show-{ids[version - 2]}" if version > 1 else None),
            f'<span class="reame-version-of">{version}/{versions}</span>',
            _tool("›", "Next version", f"show-{ids[version]}" if version < versions else None)]
    if message.role == Role.ASSISTANT:
        stats = message.stats
        if message.id == tree.leaf_id and not message.tool_calls and (stats.get("at_limit") or (
                unfinished(stats) and not being_written(message.id))):
            # Cut at Max tokens, or by the server's stop: the same reply goes on
            # (ChatService.continue_reply).
            buttons.append(_tool("Continue", "Continue", f"continue-{message.id}"))
        buttons.append(_tool("Branch from here", "Branch from here", f"branch-{message.id}"))
    if not buttons:
        return ""
    return f'\n\n<div class="reame-tools">{"".join(buttons)}</div>'


def _tool(label: str, name: str, action: str | None) -> str:
    """A button of message_tools; a symbol's name is said to screen readers. No action: a
    greyed symbol (the first or last version), not a button."""
    spoken = f'<span class="reame-sr"> {name}</span>' if name != label else ""
    if action is None:
        return f'<span class="reame-tool reame-off" title="{name}">{label}{spoken}</span>'
    return (f'<button class="reame-tool reame-act-{action}" title="{name}">'
            f"{label}{spoken}</button>")

"""Sending from the page: a message sent (checked, shown as sent, its reply started and
followed), a reply followed in a chat just shown, Stop, a retry, Continue and an edit, the
message being typed prepared ahead, and the chat drawn as kept once the reply has ended. The
page's handlers (PageHandlers) are these on top of showing a chat (showing.py, ChatView);
layout.py wires them to the page's events. Every handler that touches a chat passes on the
logged-in user (gr.Request): the service answers for another user's chat as if it did not
exist."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import aclosing

import anyio.to_thread
import gradio as gr

from reame.admin.live_settings import Settings
from reame.chats.messages import Role
from reame.chats.service import ChatService
from reame.chats.turns import kept_on_regenerate
from reame.config.chat_settings import FIELD
from reame.config.refusals import ChatError, ChatNotFound, EmptyMessage, NoModel
from reame.web.http.uploads import Uploads
from reame.web.http.user import user_of
from reame.web.page.attachments import strip_html, with_documents
from reame.web.page.live_replies import LiveReplies
from reame.web.page.parts import flatten
from reame.web.page.render import (
    answered,
    shown_rows,
    user_html,
    user_text,
    without_added,
)
from reame.web.page.settings_tab import cache_markdown, loading_text
from reame.web.page.showing import ChatView, settings_values

log = logging.getLogger(__name__)


async def in_thread(fn, *args):
    """fn(*args) in a worker thread: an async handler's database reads leave the event loop
    free."""
    return await anyio.to_thread.run_sync(fn, *args)


class PageHandlers(ChatView):
    """The handlers of one page (layout.py wires them): showing a chat (ChatView) and sending.
    live: the replies being written, which go on whatever the page shows."""

    def __init__(self, service: ChatService, live: LiveReplies, *,
                 settings: Settings | None, can_configure: Callable[[str | None], bool],
                 uploads: Uploads | None):
        super().__init__(service, live, settings=settings, can_configure=can_configure,
                         uploads=uploads)
        # When each tab's message being sent reached begin_send: the first token's wait is
        # counted from there (stream_reply, the next event, starts the turn).
        self._sent_at: dict[str, float] = {}
        # Each tab's own wait from Enter to its reply's first words, as its browser measured
        # it (page.js, waited): the stats say at least that.
        self._waits: dict[str, float] = {}

    def loading_model(self):
        """The model being loaded (from the Settings tab or the API), if any."""
        return self.settings.loading_model if self.settings is not None else None

    def check_send(self, text, _chat_id, _in_progress, _words, _docs, _prompt, _temp, _top,
                   _max_tok):
        """Runs before begin_send; a refusal shows on the textbox and changes nothing else."""
        try:
            self.service.check_message(text or "")
            problem = ""
        except EmptyMessage:
            problem = "Type a message first."
        except NoModel as exc:
            problem = f"The model could not be loaded. {exc}"
        return (gr.validate(not problem, problem),
                *(gr.validate(True, "") for _ in range(4 + len(FIELD))))

    def begin_send(self, text, chat_id, in_progress, words, docs, prompt, temp, top, max_tok,
                   request: gr.Request):
        """The message (with the documents attached to it: attachments.py) shown as sent;
        stream_reply sends it."""
        user = user_of(request)
        if in_progress or self.live.get(user, chat_id) is not None:
            # A toast: the streaming reply's updates would wipe a validation message.
            raise gr.Error("A reply is still being written: wait for it, or press stop.",
                           print_exception=False)
        if chat_id is None:
            try:
                chat_id = self.service.new_chat(user=user).id
            except ChatError as exc:  # the text stays in the box
                raise gr.Error(str(exc), print_exception=False) from None
        # The chat's settings as the panel shows them: a value typed just before sending
        # counts even if its own save (on blur) has not arrived yet.
        values = (prompt, temp, top, max_tok)
        if values != tuple(settings_values(self.service, chat_id, user)):
            self.save_settings(chat_id, *values, request)
        self.live.showing(request.session_hash, chat_id)
        self._sent_at[request.session_hash] = time.perf_counter()  # for the stats' wait
        self._waits.pop(request.session_hash, None)  # an earlier reply's, said late
        text = with_documents(docs, text)
        history = answered(self.shown(chat_id, user))
        history.append({"role": Role.USER, "content": user_html(text)})
        self.live.drew(request.session_hash, chat_id, list(history))  # stream_reply's base
        loading = self.loading_model()
        if loading is not None:
            # The reply waits for the model: say so where the reply will be.
            history.append({"role": Role.ASSISTANT, "content": loading_text(loading)})
        return (chat_id, text, history, gr.Textbox(value="", submit_btn=False, stop_btn=True),
                self.listing(user, chat_id, words), [], strip_html([]), "", str(chat_id))

    async def follow_reply(self, user, chat_id, tab):
        """The Chatbot (and, once, the message box with its Stop) while the chat's reply is
        written; nothing if none is. Cancelling this (another chat chosen, the tab closed)
        stops the following, not the reply."""
        first = True
        async with aclosing(self.live.follow(user, chat_id, tab)) as updates:
            async for reply in updates:
                # Before its first update the page shows the reply's chat already (begin_send,
                # with a model load's notice; or show()). Leave the textbox's text alone: the
                # user may be typing the next message.
                view = self.live_view(reply) if reply.latest is not None else gr.skip()
                yield view, (gr.Textbox(submit_btn=False, stop_btn=True) if first
                             else gr.skip())
                first = False

    async def write_reply(self, user, chat_id, request, base, begin, text=None, draw=False):
        """Start a reply in the background and follow it. A refusal (e.g. MessageTooLong:
        nothing was stored) is a toast rather than gr.Error — on an error the Chatbot keeps an
        "Error" badge over the conversation — and a sent text goes back to the box, so that
        the user loses nothing; so does a Stop that came before the reply started.
        draw: show base at once (a retry, an edit: the chat as the reply will follow it),
        rather than the old reply, until the new one's first words (the page said "Writing…"
        over the old one, and an Esc then met a reply not yet begun)."""
        try:
            started = self.live.start(user, chat_id, request.session_hash, base, begin)
            if started is None:
                yield await in_thread(self.shown, chat_id, user), text if text else gr.skip()
                return
            if draw:
                yield base, gr.Textbox(submit_btn=False, stop_btn=True)
            async with aclosing(self.follow_reply(user, chat_id, request.session_hash)) as updates:
                async for update in updates:
                    yield update
        except (ChatError, ChatNotFound) as exc:
            gr.Warning(str(exc))
            yield await in_thread(self.shown, chat_id, user), text if text else gr.skip()

    async def stream_reply(self, text, chat_id, request: gr.Request):
        base = self.live.drawn(request.session_hash, chat_id)  # by begin_send, just before
        if not text:
            return
        user = user_of(request)
        if base is None:
            base = answered(await in_thread(self.shown, chat_id, user))
            base.append({"role": Role.USER, "content": user_html(text)})
        arrived = self._sent_at.pop(request.session_hash, None)
        tab = request.session_hash
        send = lambda: self.service.send(chat_id, text, user=user,  # noqa: E731
                                         arrived=arrived, seen=lambda: self._waits.get(tab))
        async with aclosing(self.write_reply(user, chat_id, request, base, send,
                                             text)) as updates:
            async for update in updates:
                yield update

    async def follow(self, chat_id, words, request: gr.Request):
        """Once a chat is shown: follow the reply being written in it, if any, then show the
        chat as kept (as end_send does for the tab that sent it, but without end_send's reset
        of the message being sent: run late, after nothing to follow, it would lose a message
        sent meanwhile). And the list's timer on while replies are written in other chats."""
        user = user_of(request)
        extra = (gr.skip(),) * 4
        followed = False
        async with aclosing(self.follow_reply(user, chat_id, request.session_hash)) as updates:
            async for update in updates:
                followed = True
                yield *update, *extra
        now, watched, timer = self.watch(user, chat_id)
        if chat_id in now:  # a new reply began meanwhile: its own following shows it
            yield gr.skip(), gr.skip(), gr.skip(), gr.skip(), watched, timer
            return
        # Send back. The chat itself only after a following: show() drew it as kept just
        # before, and drawing it again here, late on a busy machine, undid what the user did
        # meanwhile (a version chosen with ‹). No chunk of the chat left comes after show():
        # its following ends once the tab shows another chat (LiveReplies.showing).
        ready = gr.Textbox(submit_btn=True, stop_btn=False)
        if not followed:
            yield gr.skip(), ready, gr.skip(), gr.skip(), watched, timer
            return
        if not self.live.shows(request.session_hash, chat_id):
            # The following ended because the tab shows another chat now (a new chat, another
            # one chosen): drawing this one here would cover it.
            yield gr.skip(), gr.skip(), gr.skip(), gr.skip(), watched, timer
            return
        try:
            messages = await in_thread(self.shown, chat_id, user) if chat_id is not None else []
        except ChatNotFound:
            messages = gr.skip()
        yield (messages, ready, await in_thread(self.listing, user, chat_id, words),
               await in_thread(lambda: cache_markdown(
                   self.service, user, whole_server=self.can_configure(user))), watched, timer)

    def waited(self, seconds, request: gr.Request):
        """The browser's own wait from Enter to the first words of the reply it sent (page.js
        measures it: what the person saw), for that reply's stats."""
        try:
            seconds = float(seconds)
        except (TypeError, ValueError):
            return
        if 0 < seconds < 24 * 3600:
            self._waits[request.session_hash] = seconds

    def stop_reply(self, chat_id, in_progress, request: gr.Request):
        """Stop: the reply of the chat shown ends at its next step and is kept."""
        self.live.stop(user_of(request), chat_id, starting=bool(in_progress))

    async def tab_closed(self, request: gr.Request):
        self._waits.pop(request.session_hash, None)
        self.live.leave(request.session_hash)

    def type_ahead(self, text, chat_id, docs, request: gr.Request):
        """The message as it would be sent — the documents attached, then what is typed —
        evaluated while it is written (Turns.type_ahead): a document is read while its
        question is typed."""
        draft = with_documents(docs, text or "") if docs else text
        if chat_id is not None and draft and draft.strip():
            try:
                self.service.type_ahead(chat_id, draft, user_of(request))
            except (ChatError, ChatNotFound):  # deleted meanwhile: nothing to prepare
                pass

    def end_send(self, chat_id, words, request: gr.Request):
        """After following a reply, however it ended: done, failed, stopped, or another chat
        chosen (the reply goes on). Shows the chat as stored — the stream's last chunks, which
        can arrive after another chat was chosen, are replaced by that chat — unless a reply
        is being written in the chat shown: then the last output asks the page to follow it
        again (REFOLLOW_JS), for the event that followed it may have ended before it did (a
        failed or lost event: the page took in none of its end and kept showing it as being
        written). While replies are written in other chats, the list's timer watches for
        their end."""
        user = user_of(request)
        # The reply this tab started in this chat, if it ended: its messages as it left them.
        tree = self.live.ended(request.session_hash, user, chat_id)
        now, watched, timer = self.watch(user, chat_id)
        cache = cache_markdown(self.service, user, whole_server=self.can_configure(user))
        if chat_id in now:
            again = "yes" if self.live.shows(request.session_hash, chat_id) else ""
            return (gr.skip(), gr.skip(), self.listing(user, chat_id, words), gr.skip(), cache,
                    watched, timer, again)
        try:
            messages = self.shown(chat_id, user, tree=tree) if chat_id is not None else []
        except ChatNotFound:
            messages = []
        return (messages, gr.Textbox(submit_btn=True, stop_btn=False),
                self.listing(user, chat_id, words), "", cache, watched, timer, "")

    async def regenerate(self, chat_id, request: gr.Request):
        if chat_id is None:
            return
        user = user_of(request)

        def prepare():
            kept = kept_on_regenerate(self.service.messages(chat_id, user))
            return self.shown(chat_id, user, kept)

        with self.live.expect(user, chat_id):  # a Stop while the chat is read counts
            async with aclosing(self.write_reply(
                    user, chat_id, request, await in_thread(prepare),
                    lambda: self.service.regenerate(chat_id, user=user), draw=True)) as ups:
                async for update in ups:
                    yield update

    async def continue_reply(self, action, chat_id, request: gr.Request):
        """Continue (under a reply cut at Max tokens): the same reply goes on, streamed like
        a retry; action is "continue:ID", the reply's id, which must be the chat's last."""
        if chat_id is None:
            return
        user = user_of(request)

        def prepare():
            messages = self.service.messages(chat_id, user)
            if not messages or f"continue:{messages[-1].id}" != action:
                raise ChatError("This reply is no longer the chat's last: nothing to continue.")
            return self.shown(chat_id, user, messages[:-1])

        with self.live.expect(user, chat_id):  # a Stop while the chat is read counts
            try:
                base = await in_thread(prepare)
            except (ChatError, ChatNotFound) as exc:
                gr.Warning(str(exc))
                yield await in_thread(self.shown, chat_id, user), gr.skip()
                return
            async with aclosing(self.write_reply(
                    user, chat_id, request, base,
                    lambda: self.service.continue_reply(chat_id, user=user))) as ups:
                async for update in ups:
                    yield update

    async def edit(self, chat_id, data: gr.EditData, request: gr.Request):
        if chat_id is None:
            return
        user = user_of(request)
        index = data.index if isinstance(data.index, int) else data.index[0]
        text = user_text(without_added(flatten(data.value)))

        def prepare():
            """The messages kept before the edited one; the turn, refused (not the user's
            message, empty, ...) before anything changes."""
            messages = self.service.messages(chat_id, user)
            rows = shown_rows(messages)  # the Chatbot's rows (tool results folded)
            if not 0 <= index < len(rows):
                raise ChatError("This message is no longer in the chat.")
            updates = self.service.edit_message(chat_id, rows[index].id, text, user=user)
            return self.shown(chat_id, user, messages[:messages.index(rows[index])]), updates

        with self.live.expect(user, chat_id):  # a Stop while the edit is stored counts
            try:
                kept, updates = await in_thread(prepare)
            except ChatError as exc:
                gr.Warning(str(exc))
                yield await in_thread(self.shown, chat_id, user), gr.skip()
                return
            base = kept + [{"role": Role.USER, "content": user_html(text)}]
            # A Stop before its reply began: the edit is not made, its text goes to the box.
            async with aclosing(self.write_reply(user, chat_id, request, base,
                                                 lambda: updates, text, draw=True)) as stream:
                async for update in stream:
                    yield update

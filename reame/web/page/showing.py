"""Showing a chat on the page: the chat asked for (or the latest), its messages as the Chatbot
draws them (a reply being written, as far as it got), the chat list and what its buttons and
the buttons inside messages do, search, import and export, the chat's own settings. sending.py
adds the send flow to these (PageHandlers); layout.py wires both to the page's events. Every
handler that touches a chat passes on the logged-in user (gr.Request): the service answers for
another user's chat as if it did not exist."""

from __future__ import annotations

import threading
from collections.abc import Callable

import gradio as gr

from reame.admin.live_settings import Settings
from reame.chats.messages import Role
from reame.chats.service import ChatService
from reame.config.chat_settings import FIELD, ChatSettings
from reame.config.refusals import ChatError, ChatNotFound
from reame.web.http.uploads import UploadRefused, Uploads, session_key
from reame.web.http.user import user_of
from reame.web.page.chat_list import archived_listing_html, latest_chat_id, listing_html
from reame.web.page.live_replies import LiveReplies, LiveReply
from reame.web.page.parts import download_payload
from reame.web.page.render import shown_reply, to_chatbot
from reame.web.page.settings_tab import cache_markdown

# What show() gives the page: the chat id, the list, the Chatbot, the chat settings, the
# search, the note over the chat, and the chat the address bar names.
VIEW = 6 + len(FIELD)
# A chat asked for (the address bar's ?chat=ID, Back, a stale link) that the user cannot see:
# the same words whether no chat has that id or another user's has (nothing told apart).
NOT_HERE = '<p class="reame-note" role="status">That chat is not here.</p>'
# To an admin, a chat asked for that is from before accounts (nobody's until adopted): the
# page they had open before turning accounts on and logging in.
BEFORE_ACCOUNTS = ('<p class="reame-note" role="status">That chat is from before accounts: '
                   "“Adopt them” brings it into your list.</p>")


def settings_values(service: ChatService, chat_id: int | None, user: str | None) -> tuple:
    """The chat settings panel's values: the chat's, or the defaults of a new one."""
    settings = (service.defaults if chat_id is None
                else ChatSettings.of(service.get_chat(chat_id, user)))
    return tuple(settings.as_dict().values())


class ChatView:
    """Showing a chat, and the list's and messages' own actions, for one page. live: the
    replies being written, which go on whatever the page shows."""

    def __init__(self, service: ChatService, live: LiveReplies, *,
                 settings: Settings | None, can_configure: Callable[[str | None], bool],
                 uploads: Uploads | None):
        self.service, self.live, self.settings = service, live, settings
        self.can_configure, self.uploads = can_configure, uploads

    # Every handler that touches a chat passes on the logged-in user (gr.Request): the
    # service answers for another user's chat as if it did not exist.

    def shown(self, chat_id, user, messages=None, *, tree=None):
        """The chat as the Chatbot shows it, marked where the model's window starts; the
        whole branch shown with its tools (versions, branch), or only messages, without.
        tree: the chat's messages, known already (not read again)."""
        if messages is None and tree is None:
            chat, tree = self.service.tree(chat_id, user)
        else:
            chat = self.service.get_chat(chat_id, user)
        if messages is not None:
            return to_chatbot(messages, chat.window_start)
        return to_chatbot(tree.branch, chat.window_start, tree)

    def writing(self, user):
        return frozenset(self.live.chats_of(user))

    def watch(self, user, chat_id):
        """The chats being written in; what the list's timer watches (those, and the chats
        whose title the model is still to write: the list is drawn again when it lands), as
        a state to compare; and the timer, on while there is something to watch."""
        now = self.writing(user)
        titling = self.service.titles.pending(user)
        return now, (now, titling), gr.Timer(active=bool(now - {chat_id} or titling))

    def listing(self, user, chat_id, words=""):
        return listing_html(self.service, user, chat_id, words, self.writing(user))

    def show(self, chat_id, request: gr.Request, *, note: str = ""):
        """Everything that depends on which chat is shown; a reply being written in it is
        shown as far as it got (FOLLOW_JS then follows it). A chat the user cannot see (none
        has its id, or another user's) shows the latest chat instead, with NOT_HERE; the
        address bar names the chat shown (page.js), none while it is empty."""
        user = user_of(request)
        reply = self.live.get(user, chat_id)
        if reply is not None:
            messages = self.live_view(reply)
        elif chat_id is not None:
            try:
                messages = self.shown(chat_id, user)
            except ChatNotFound:
                if note:  # the latest chat, gone meanwhile too
                    chat_id, messages = None, []
                else:
                    return self.show(latest_chat_id(self.service, user), request,
                                     note=self.not_here(chat_id, user))
            else:  # restore its KV while the user reads and types
                threading.Thread(target=self.service.restore_ahead, args=(chat_id, user),
                                 daemon=True).start()
        else:
            messages = []
        self.live.showing(request.session_hash, chat_id)  # a following of another chat ends
        return (chat_id, self.listing(user, chat_id), messages,
                *settings_values(self.service, chat_id, user), "", note,
                str(chat_id) if chat_id is not None and messages else "")

    def not_here(self, chat_id: int, user: str | None) -> str:
        """The note for a chat the user cannot see: NOT_HERE, or, to an admin, where a chat
        from before accounts went (the admin sees how many there are anyway)."""
        if user is None or not self.can_configure(user):
            return NOT_HERE
        return BEFORE_ACCOUNTS if self.service.from_before_accounts(chat_id) else NOT_HERE

    def on_load(self, asked: str, request: gr.Request):
        """The page as it opens: the chat the address bar names (asked, from ?chat=), or the
        latest. Anything but an id of the user's own chats is NOT_HERE, told apart by
        nothing."""
        asked = (asked or "").strip()
        if not asked:
            return self.show(latest_chat_id(self.service, user_of(request)), request)
        if asked.isascii() and asked.isdigit() and len(asked) <= 18:
            return self.show(int(asked), request)
        return self.show(latest_chat_id(self.service, user_of(request)), request, note=NOT_HERE)

    def on_new_chat(self, request: gr.Request):
        try:
            chat = self.service.empty_chat(user=user_of(request))
        except ChatError as exc:  # e.g. TooManyChats: the chat shown stays
            gr.Warning(str(exc))
            return tuple(gr.skip() for _ in range(VIEW))
        return self.show(chat.id, request)

    def live_view(self, reply: LiveReply) -> list[dict]:
        """A reply being written as the Chatbot shows it: under the chat as it was when it
        started, the reply so far (or its place in line)."""
        if reply.latest is None:
            return reply.base
        return reply.base + [{"role": Role.ASSISTANT, "content": shown_reply(reply.latest)}]

    def check_list(self, chat_id, words, shown_writing, request: gr.Request):
        """While replies are written in other chats: the list again once one has ended
        (its "writing" mark gone) or a chat's title has come, and the timer off once nothing
        is left to watch."""
        user = user_of(request)
        _, watched, timer = self.watch(user, chat_id)
        listed = self.listing(user, chat_id, words) if watched != shown_writing else gr.skip()
        return listed, watched, timer

    def act(self, action, chat_id, request: gr.Request):
        """A button of the chat list or inside a message (chat_list.py, render.message_tools):
        "KIND:ID[:TEXT]". open, pin, archive, rename, delete, export and markdown name a chat;
        archived and chats (ID 0) list the archived chats or all the others; show
        (a version) and branch (from here) a message of the chat shown. The view, and an
        export's file for the browser to save ("" for none), and the Cache panel."""
        kind, _, rest = (action or "").partition(":")
        target, _, text = rest.partition(":")
        skip = tuple(gr.skip() for _ in range(VIEW)) + ("", gr.skip())
        if not target.isdigit():
            return skip
        target, user = int(target), user_of(request)
        try:
            if kind == "open":
                chat_id = target
            elif kind == "pin":
                self.service.toggle_pin(target, user)
            elif kind == "archive":
                self.service.toggle_archive(target, user)
            elif kind in ("archived", "chats"):  # the archived chats, or back to the list
                listed = (archived_listing_html(self.service, user, chat_id, self.writing(user))
                          if kind == "archived" else self.listing(user, chat_id))
                return skip[:1] + (listed,) + skip[2:]
            elif kind == "rename":
                self.service.rename_chat(target, text, user)
            elif kind == "delete":
                self.live.stop(user, target)  # its reply first: nothing is written into it after
                self.service.delete_chat(target, user)
                if target == chat_id:
                    chat_id = latest_chat_id(self.service, user)
            elif kind in ("export", "markdown"):
                return skip[:-2] + (download_payload(self.service.export_file(
                    target, user, markdown=kind == "markdown")), gr.skip())
            elif kind == "show" and chat_id is not None:
                self.service.show_version(chat_id, target, user)
            elif kind == "branch" and chat_id is not None:
                chat_id = self.service.branch(chat_id, target, user).id
            else:
                return skip
        except (ChatError, ChatNotFound) as exc:
            gr.Warning(str(exc))
            return skip
        return (*self.show(chat_id, request), "",
                cache_markdown(self.service, user, whole_server=self.can_configure(user)))

    def find(self, words, chat_id, request: gr.Request):
        """The chat list as the search box asks: the chats found, or all of them."""
        user = user_of(request)
        return self.listing(user, chat_id, words)

    def export_all(self, request: gr.Request):
        return download_payload(self.service.export_file(None, user_of(request)))

    def import_chats(self, upload, chat_id, request: gr.Request):
        """Chats from a file: Reame's export or ChatGPT's conversations.json."""
        user = user_of(request)
        if self.uploads is None:
            raise gr.Error("Nothing was imported: this server takes no uploads",
                           print_exception=False)
        try:
            data = self.uploads.take(upload, session_key(request.headers.get("cookie", "")))
            made = self.service.import_chats(data, user)
        except (ChatError, UploadRefused) as exc:
            raise gr.Error(f"Nothing was imported: {exc}", print_exception=False) from None
        here = getattr(made, "skipped", 0)
        gr.Info(f"Imported {len(made):,} chat{'s' if len(made) != 1 else ''}."
                + (f" {here:,} {'was' if here == 1 else 'were'} here already (the same title "
                   "and date), so not again." if here else ""))
        return self.show(made[0].id if made else chat_id, request)

    def save_settings(self, chat_id, prompt, temp, top, max_tok, request: gr.Request):
        if chat_id is None:
            return
        try:
            self.service.update_settings(chat_id, system_prompt=prompt, temperature=temp,
                                    top_p=top, max_tokens=int(max_tok) if max_tok else None,
                                    user=user_of(request))
        except ChatError as exc:
            raise gr.Error(str(exc)) from None

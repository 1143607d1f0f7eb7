"""The admin's Users tab, and the note that tells an admin where the chats from before accounts
went: thin handlers over reame/accounts/manage.py, the functions `python app.py adduser` and
its friends call (the same rules, the same words).

Only an admin sees the tab (the page hides its button from others, as the Settings tab's) and
the note; every event checks again, so that a call made past the page (the Gradio API, with a
non-admin's login) is refused before anything is read or changed. A password is never sent
back to the page (its field is emptied by the answer); a new API key is shown once.
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable
from pathlib import Path

import gradio as gr

from reame.accounts import manage
from reame.accounts.live import LiveAccounts
from reame.accounts.users import MIN_PASSWORD, AccountError, Accounts
from reame.chats.service import ChatService
from reame.web.http.user import user_of
from reame.web.page.parts import HIDDEN
from reame.web.page.render import inert_html

# The Users tab's styles, with the page's (page.css).
USERS_CSS = (Path(__file__).parent / "users.css").read_text(encoding="utf-8")
_BUTTON = dict(scale=0, min_width=150)  # the tab's buttons: beside their field, not filling
ACCOUNTS_OFF = """**Accounts are off.** Anyone who can open this page can read, change and delete every chat and change the settings: that is fine on your own computer. To share this server, turn accounts on: you become its first admin, everyone then logs in and sees only their own chats, and you add the others here. The chats made so far are then shown to nobody until you adopt them (one click, once logged in)."""
NOT_ADMIN = "Only an admin can manage users."
BEFORE_ACCOUNTS = "before-accounts"  # the adopt source meaning "made without accounts"
# Remove asks first; no: the event goes on with no name, and nothing is done.
CONFIRM_REMOVE_JS = """(name) => [name && window.confirm(
    `Remove the user ${name}? They are logged out at once and can no longer log in. `
    + `Their chats stay, owned by nobody, until an admin adopts them.`) ? name : ""]"""


def _chats(n: int) -> str:
    return f"{n:,} chat{'' if n == 1 else 's'}"


def note_text(n: int) -> str:
    """The admin's note about the chats from before accounts."""
    return (f"**{_chats(n)} from before accounts {'is' if n == 1 else 'are'} not shown**: "
            f"{'it belongs' if n == 1 else 'they belong'} to nobody yet. Adopt "
            f"{'it' if n == 1 else 'them'} into your account, or give "
            f"{'it' if n == 1 else 'them'} to another user in the Users tab.")


def users_table(rows: list[manage.UserRow]) -> str:
    """The users, one row each: name, admin, chats, API keys (their ids, never the keys)."""
    body = "".join(
        f"<tr><th scope=\"row\">{html.escape(r.name)}</th><td>{'yes' if r.admin else 'no'}</td>"
        f"<td>{r.chats:,}</td><td>{len(r.keys)}"
        f"{' (' + ', '.join(html.escape(k) for k in r.keys) + ')' if r.keys else ''}</td></tr>"
        for r in rows)
    return ('<table class="reame-users"><caption>Users</caption><thead><tr>'
            '<th scope="col">Name</th><th scope="col">Admin</th><th scope="col">Chats</th>'
            f'<th scope="col">API keys</th></tr></thead><tbody>{body}</tbody></table>')


class UsersPanel:
    """The Users tab (build_tab, inside a gr.Tab) and the note (build_note, in the sidebar),
    over the server's accounts and chats."""

    def __init__(self, live: LiveAccounts, service: ChatService):
        self.live, self.service = live, service
        self.moved_chats: list = []  # the events that give chats: the page then lists them

    @property
    def accounts(self) -> Accounts | None:
        """The server's accounts (None: off, and this tab offers to turn them on)."""
        return self.live.current

    # who may

    def admin_name(self, request: gr.Request | None) -> str:
        """The admin asking, by name; gr.Error for anyone else (also past the page)."""
        accounts = self.accounts
        name = accounts.name_of(user_of(request)) if accounts is not None else None
        if name is None or not accounts.is_admin(name):
            raise gr.Error(NOT_ADMIN, print_exception=False)
        return name

    def is_admin(self, request: gr.Request | None) -> bool:
        """An admin is logged in (never without accounts: then nobody's chats are hidden)."""
        accounts = self.accounts
        return accounts is not None and accounts.is_admin(accounts.name_of(user_of(request)))

    # the sidebar's note

    def build_note(self) -> None:
        """The note about the chats from before accounts (call in the sidebar); hidden unless
        an admin is logged in and such chats exist."""
        with gr.Column(visible=False, elem_id="old-chats", elem_classes=["reame-old-chats"]
                       ) as self.note:
            self.note_text = gr.Markdown(elem_id="old-chats-text")
            self.note_adopt = gr.Button("Adopt them", size="sm", variant="primary",
                                        elem_id="adopt-old-chats")

    def note_update(self, request: gr.Request | None) -> dict:
        n = manage.ownerless(self.service.store) if self.is_admin(request) else 0
        return {self.note: gr.Column(visible=n > 0), self.note_text: note_text(n) if n else ""}

    # the tab

    def build_tab(self, *, settings_group: str) -> None:
        """The Users tab's content (call inside a gr.Tab): without accounts, the form that
        turns them on (in settings_group: it writes reame.conf, as Apply does); with them,
        an admin's management of users."""
        with gr.Column(visible=False, elem_id="accounts-off") as self.off:
            gr.Markdown(ACCOUNTS_OFF)
            with gr.Row():
                first_name = gr.Textbox(label="Your user name", elem_id="first-admin-name",
                                        max_lines=1)
                first_password = gr.Textbox(
                    label=f"Password (at least {MIN_PASSWORD} characters)", type="password",
                    elem_id="first-admin-password", max_lines=1)
                first_again = gr.Textbox(label="Password again", type="password",
                                         elem_id="first-admin-again", max_lines=1)
            turn_on = gr.Button("Turn accounts on", variant="primary",
                                elem_id="turn-accounts-on", **_BUTTON)
            turned = gr.Markdown(elem_id="accounts-off-status")
            log_in = gr.Button("Log in", variant="primary", visible=False, elem_id="log-in-now",
                               **_BUTTON)
        log_in.click(None, None, None, js="() => { location.reload(); }", **HIDDEN)
        turn_on.click(self.turn_on, [first_name, first_password, first_again],
                      [turned, first_password, first_again, log_in],
                      concurrency_id=settings_group,
                      concurrency_limit=1, show_progress_on=[turned], **HIDDEN)
        with gr.Column(visible=False, elem_id="accounts-on") as self.on:
            self._build_management()
        self.outputs = [self.off, *self._common]  # what show() fills

    def _build_management(self) -> None:
        gr.Markdown("Users log in with their name and password; an admin also changes the "
                    "settings and manages users here. API keys are for `/v1` "
                    "(`Authorization: Bearer <key>`).")
        self.status = gr.Markdown(elem_id="users-status")
        self.table = gr.HTML(elem_id="users-table", padding=False)
        gr.Markdown("#### Add a user")
        with gr.Row():
            new_name = gr.Textbox(label="User name", elem_id="new-user-name", max_lines=1)
            new_password = gr.Textbox(label=f"Password (at least {MIN_PASSWORD} characters)",
                                      type="password", elem_id="new-user-password", max_lines=1)
            new_admin = gr.Checkbox(label="Admin (settings and users)", elem_id="new-user-admin")
        add = gr.Button("Add user", variant="primary", elem_id="add-user", **_BUTTON)
        gr.Markdown("#### A user")
        self.pick = gr.Dropdown(label="User", elem_id="user-pick", choices=[])
        with gr.Row(elem_classes=["reame-user-row"]):
            password = gr.Textbox(label="New password", type="password", elem_id="reset-password",
                                  max_lines=1)
            set_password = gr.Button("Set password", elem_id="set-password", **_BUTTON)
        with gr.Row(elem_classes=["reame-user-row"]):
            self.key_pick = gr.Dropdown(label="API keys", elem_id="key-pick", choices=[])
            revoke = gr.Button("Revoke key", elem_id="revoke-key", **_BUTTON)
            new_key = gr.Button("New API key", elem_id="new-key", **_BUTTON)
        self.key = gr.Textbox(label="New API key (shown once: copy it now)", interactive=False,
                              elem_id="new-key-value", buttons=["copy"], visible=False)
        with gr.Row(elem_classes=["reame-user-row"]):
            self.source = gr.Dropdown(label="Chats to adopt into this user", elem_id="adopt-source",
                                      choices=[])
            adopt = gr.Button("Adopt", elem_id="adopt-chats", **_BUTTON)
        remove = gr.Button("Remove user", variant="stop", elem_id="remove-user", **_BUTTON)

        common = [self.on, self.status, self.table, self.pick, self.key_pick, self.key, self.source,
                  self.note, self.note_text]
        # Progress on the status line alone: not over the fields and buttons. One event at a
        # time, in the order they came: a choice's view must not land after, and wipe, what a
        # click right after it said (the page's queue runs up to 8 of a kind at once).
        one_by_one = dict(concurrency_id="users-panel", concurrency_limit=1)
        quiet = dict(show_progress_on=[self.status], **one_by_one, **HIDDEN)
        add.click(self.add, [new_name, new_password, new_admin],
                  [*common, new_name, new_password, new_admin], **quiet)
        set_password.click(self.set_password, [self.pick, password], [*common, password],
                           **quiet)
        new_key.click(self.new_key, [self.pick], common, **quiet)
        revoke.click(self.revoke, [self.pick, self.key_pick], common, **quiet)
        remove.click(self.remove, [self.pick], common, js=CONFIRM_REMOVE_JS, **quiet)
        self._fields = [new_name, new_password, new_admin, password]
        self.pick.input(self.picked, [self.pick], common, **quiet)
        self.moved_chats += [
            adopt.click(self.adopt, [self.pick, self.source], common, **quiet),
            self.note_adopt.click(self.adopt_old, None, common,
                                  show_progress_on=[self.note_text], **one_by_one,
                                  **HIDDEN)]
        self._common = common

    def view(self, request: gr.Request | None, said: str = "", *, pick: str | None = None,
             key: str = "") -> dict:
        """Every part of the tab and the note as they are now; said: what was just done (or
        refused); pick: the user to select (else the one selected stays, if still there);
        key: a new API key to show, once."""
        rows = manage.users(self.accounts, self.service.store)
        names = [r.name for r in rows]
        chosen = pick if pick in names else None
        keys = [] if chosen is None else self.accounts.keys(chosen)
        ownerless = manage.ownerless(self.service.store)
        sources = ([(f"{_chats(ownerless)} from before accounts", BEFORE_ACCOUNTS)]
                   if ownerless else [])
        sources += [(f"{_chats(n)} of a removed user ({old})", old)
                    for old, n in manage.left_behind(self.accounts, self.service.store).items()]
        return {
            self.on: gr.Column(visible=True),
            self.status: said,
            self.table: users_table(rows),
            self.pick: gr.Dropdown(choices=names, value=chosen),
            self.key_pick: gr.Dropdown(
                choices=[(f"{k['id']} (made {_day(k['created'])})", k["id"]) for k in keys],
                value=keys[-1]["id"] if keys else None),
            self.key: gr.Textbox(value=key, visible=bool(key)),
            self.source: gr.Dropdown(choices=sources, value=sources[0][1] if sources else None),
            **self.note_update(request),
        }

    def show(self, request: gr.Request | None) -> tuple:
        """For the page's load, in the order of `outputs`: an admin's tab and note; nothing
        of them to anyone else."""
        if not self.is_admin(request):
            return (gr.Column(visible=self.accounts is None),
                    *(gr.skip() for _ in self.outputs[1:-2]),
                    *self.note_update(request).values())
        view = self.view(request)
        return (gr.Column(visible=False), *(view[part] for part in self.outputs[1:]))

    def _do(self, request, change: Callable[[], str], *, pick: str | None,
            key_of: Callable[[], str] | None = None) -> dict:
        """Run change (after checking the admin); the view saying what it did or why not."""
        self.admin_name(request)
        try:
            said, key = change(), key_of() if key_of is not None else ""
        except AccountError as exc:
            gr.Warning(str(exc))
            return self.view(request, f"**Not done:** {inert_html(str(exc))}", pick=pick)
        gr.Info(said.split(";")[0].split(": copy")[0])
        return self.view(request, _sentence(said), pick=pick, key=key)

    # the events

    def add(self, name, password, admin, request: gr.Request):
        name = (name or "").strip()
        view = self._do(request, lambda: manage.add_user(self.accounts, name, password or "",
                                                         admin=bool(admin)), pick=name)
        done = not view[self.status].startswith("**Not done")
        # The password field is emptied either way: it never comes back.
        return {**view, **dict(zip(self._add_fields, ("" if done else name, "",
                                                      False if done else admin)))}

    def set_password(self, name, password, request: gr.Request):
        view = self._do(request, lambda: manage.set_password(self.accounts, _named(name),
                                                             password or ""), pick=name)
        return {**view, self._password: ""}

    def new_key(self, name, request: gr.Request):
        made: list[str] = []

        def add() -> str:
            made.append(manage.add_key(self.accounts, _named(name)))
            return (f"new API key for {name} made: copy it now, it is not shown again "
                    "(its id is in the list)")
        return self._do(request, add, pick=name, key_of=lambda: made[0])

    def revoke(self, name, key_id, request: gr.Request):
        return self._do(request, lambda: manage.revoke_key(
            self.accounts, _named(name), key_id or _refuse("choose a key to revoke")),
            pick=name)

    def remove(self, name, request: gr.Request):
        self.admin_name(request)
        if not name:  # not confirmed (or none chosen): nothing is done
            return {}

        def remove() -> str:
            said = manage.remove_user(self.accounts, name)
            return f"{said}; here: choose that user, then Chats to adopt into this user"
        return self._do(request, remove, pick=None)

    def picked(self, name, request: gr.Request):
        self.admin_name(request)
        return self.view(request, pick=name)

    def adopt(self, name, source, request: gr.Request):
        return self._do(request, lambda: manage.adopt(
            self.accounts, self.service.store, _named(name),
            None if source in (None, "", BEFORE_ACCOUNTS) else source), pick=name)

    def adopt_old(self, request: gr.Request):
        """The note's button: the chats from before accounts, into the admin's own account."""
        me = self.admin_name(request)
        return self._do(request, lambda: manage.adopt(self.accounts, self.service.store, me),
                        pick=me)

    def turn_on(self, name, password, again, request: gr.Request):
        """Without accounts: make the first admin, and accounts are on at once (anyone who
        can open this page may: they can change everything already)."""
        try:
            if (password or "") != (again or ""):
                raise AccountError("the passwords differ")
            said = self.live.turn_on((name or "").strip(), password or "",
                                     page=request.session_hash if request else None)
        except AccountError as exc:
            gr.Warning(str(exc))
            return f"**Not done:** {inert_html(str(exc))}", "", "", gr.skip()
        return (f"{_sentence(said)} From now on everyone logs in: log in as "
                f"{html.escape(name.strip())} to add users and adopt the chats made so far "
                "(until then, they are shown to nobody).", "", "", gr.Button(visible=True))

    # the fields some events empty (build_tab sets them)

    @property
    def _add_fields(self):
        return self._fields[:3]

    @property
    def _password(self):
        return self._fields[3]


def _named(name: str | None) -> str:
    return name or _refuse("choose a user first")


def _refuse(why: str):
    raise AccountError(why)


def _sentence(said: str) -> str:
    """A manage.py sentence for the page: capitalized, the command inert, ended."""
    return inert_html(said[:1].upper() + said[1:] + ".")


def _day(created: float | None) -> str:
    return time.strftime("%Y-%m-%d", time.localtime(created)) if created else "?"

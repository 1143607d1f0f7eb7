"""reame/web/page/live_replies.py on the real service, without a browser: what the page relies
on when it shows another chat, reloads or closes (tests/web/page/test_page_live.py does it in Chromium).

A reply is written whoever follows it; each follower sees it from where it is; Stop keeps it
as far as it got; a reply no tab watches is stopped after the bound, unless a tab follows it
again first; a Stop that overtakes its reply's start still stops it; replies never cross users.
"""

from __future__ import annotations

import asyncio

import pytest

from reame.chats.service import ChatError
from reame.web.page.live_replies import LiveReplies

LONG = "Write the numbers from 1 to 500, separated by commas."


async def stop(live, *args, **kwargs) -> bool:
    """live.stop waits for the reply to be kept: from a worker thread, as the page calls it."""
    return await asyncio.to_thread(live.stop, *args, **kwargs)


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 120))


def long_chat(service, user=None) -> int:
    chat = service.new_chat(user=user)
    service.update_settings(chat.id, max_tokens=400, user=user)
    return chat.id


async def until(condition, seconds: float = 60) -> None:
    for _ in range(int(seconds / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("not within the time")


def test_a_reply_is_written_without_followers_and_followed_from_where_it_is(service):
    chat = long_chat(service)
    live = LiveReplies(unwatched_s=60)

    async def scenario():
        reply = live.start(None, chat, "tab", [], lambda: service.send(chat, LONG))
        assert live.chats_of(None) == {chat} and live.chats_of("someone else") == set()
        # Nobody follows: it is written all the same.
        await until(lambda: reply.latest is not None and len(reply.latest.text) > 40)
        seen = []
        async for followed in live.follow(None, chat, "another tab"):
            seen.append(followed.latest.text)
            if len(seen) == 3:
                break
        assert len(seen[0]) > 40  # not from its start: from where it is
        assert seen == sorted(seen, key=len)  # each from where the reply is
        assert "another tab" in reply.tabs
        assert await stop(live, None, chat) is True  # kept as far as it got
        return seen[-1]

    last_seen = run(scenario())
    kept = service.messages(chat)[-1]
    assert kept.role == "assistant" and kept.stopped and kept.content.startswith(last_seen)
    assert live.chats_of(None) == set() and live.get(None, chat) is None


def test_a_reply_no_tab_watches_is_stopped_after_the_bound_unless_followed_again(service):
    first, second = long_chat(service), long_chat(service)
    live = LiveReplies(unwatched_s=0.5)

    async def scenario():
        # One slot: the first reply is written, the second waits in line for it (started
        # together, either could have got the slot, and a reply stopped while it waits
        # stores nothing).
        left = live.start(None, first, "closed tab", [], lambda: service.send(first, LONG))
        await until(lambda: left.latest is not None and left.latest.text)
        kept = live.start(None, second, "reloaded tab", [],
                          lambda: service.send(second, LONG))
        await until(lambda: kept.latest is not None)
        live.leave("closed tab")
        live.leave("reloaded tab")
        # The reloaded tab (a new session) follows its reply again within the bound.
        follower = aiter(live.follow(None, second, "the new tab"))
        await anext(follower)
        await until(left.ended.is_set, seconds=30)
        await until(lambda: kept.latest.text)  # its turn now: the slot is free
        await asyncio.sleep(1.0)  # past the bound for the second one too
        assert not kept.ended.is_set(), "a followed reply was stopped"
        assert await stop(live, None, second) is True
        await follower.aclose()

    run(scenario())
    for chat in (first, second):
        reply = service.messages(chat)[-1]
        assert reply.role == "assistant" and reply.stopped, (chat, reply)


def test_a_stop_that_overtakes_the_start_of_its_reply_still_stops_it(service):
    chat = long_chat(service)
    live = LiveReplies(unwatched_s=60)

    async def scenario():
        assert await stop(live, None, chat, starting=True) is False  # the reply had not started
        assert live.start(None, chat, "tab", [], lambda: service.send(chat, LONG)) is None
        # Only that once, and not for a Stop that came after a reply had ended.
        await stop(live, None, chat)
        reply = live.start(None, chat, "tab", [], lambda: service.send(chat, LONG))
        assert reply is not None
        await until(lambda: reply.latest is not None)
        await stop(live, None, chat)

    run(scenario())
    assert [m.role for m in service.messages(chat)] == ["user", "assistant"]


def test_a_stop_while_a_retry_is_prepared_stops_it_and_only_it(service):
    """A retry, an edit or a Continue reads the chat before its reply starts (expect): a Stop
    from the page meanwhile (no `starting`: only a send has a message pending) still counts,
    for that chat and user only, and not once the preparing is over."""
    chat, other = long_chat(service), long_chat(service)
    live = LiveReplies(unwatched_s=60)

    async def scenario():
        with live.expect(None, chat):
            assert await stop(live, None, chat) is False  # nothing under way yet
            assert await stop(live, "someone else", other) is False
        assert live.start(None, chat, "tab", [], lambda: service.send(chat, LONG)) is None
        reply = live.start(None, other, "tab", [], lambda: service.send(other, LONG))
        assert reply is not None, "another chat's Stop stopped this one"
        await until(lambda: reply.latest is not None)
        await stop(live, None, other)
        # Preparing over (its reply started and ended): a late Stop is not kept.
        with live.expect(None, chat):
            pass
        await stop(live, None, chat)
        reply = live.start(None, chat, "tab", [], lambda: service.send(chat, LONG))
        assert reply is not None, "a Stop after the preparing was kept"
        await until(lambda: reply.latest is not None)
        await stop(live, None, chat)

    run(scenario())
    assert [m.role for m in service.messages(chat)] == ["user", "assistant"]


def test_one_reply_per_chat_and_never_another_user_s(service):
    chat = long_chat(service, user="alice")
    live = LiveReplies(unwatched_s=60)

    async def scenario():
        reply = live.start("alice", chat, "tab", [], lambda: service.send(chat, LONG,
                                                                          user="alice"))
        with pytest.raises(ChatError, match="still being written"):
            live.start("alice", chat, "tab", [], lambda: service.send(chat, LONG, user="alice"))
        # Bob names alice's chat: he neither sees, follows nor stops her reply.
        assert live.get("bob", chat) is None and live.chats_of("bob") == set()
        assert [r async for r in live.follow("bob", chat, "bob's tab")] == []
        assert await stop(live, "bob", chat) is False
        await until(lambda: reply.latest is not None and len(reply.latest.text) > 10)
        assert not reply.ended.is_set()
        await stop(live, "alice", chat)

    run(scenario())


def test_a_refused_turn_ends_its_followers_with_the_refusal(service):
    chat = long_chat(service)
    live = LiveReplies(unwatched_s=60)

    async def scenario():
        live.start(None, chat, "tab", [], lambda: service.send(chat, "   "))
        with pytest.raises(ChatError):
            async for _ in live.follow(None, chat, "tab"):
                pass

    run(scenario())
    assert service.messages(chat) == []


def test_a_tab_that_shows_another_chat_gets_nothing_more_of_the_one_it_left(service):
    """However late the browser cancels the following of the chat left, that following ends at
    the reply's next update: no chunk of it is drawn over the chat shown now."""
    left, other = long_chat(service), long_chat(service)
    live = LiveReplies(unwatched_s=60)

    async def scenario():
        live.showing("tab", left)
        reply = live.start(None, left, "tab", [], lambda: service.send(left, LONG))
        following = live.follow(None, left, "tab")
        first = await anext(following)
        assert first is reply
        live.showing("tab", other)  # the page shows another chat; its cancel has not come
        with pytest.raises(StopAsyncIteration):
            await anext(following)
        assert live.get(None, left) is reply and not reply.ended.is_set()  # still written
        assert [r async for r in live.follow(None, left, "tab")] == []  # not while elsewhere
        live.showing("tab", left)  # back: followed again, from where it is
        again = live.follow(None, left, "tab")
        assert (await anext(again)) is reply
        await again.aclose()
        assert await stop(live, None, left) is True

    run(scenario())
    assert service.messages(left)[-1].stopped


def test_the_page_reads_a_chat_s_messages_once_per_message_sent(service):
    """A message sent from the page: begin_send reads the chat's messages and draws them;
    stream_reply starts the reply from that drawing, and end_send shows the messages as the
    turn kept them, without reading them again. The turn reads them once itself (after its
    slot: the history as the chat's previous turn left it). So does a regenerate."""
    from types import SimpleNamespace

    from reame.config.chat_settings import ChatSettings
    from reame.web.page.sending import PageHandlers

    handlers = PageHandlers(service, LiveReplies(unwatched_s=60), settings=None,
                            can_configure=lambda user: True, uploads=None)
    request = SimpleNamespace(username=None, session_hash="tab", headers={})
    chat = service.new_chat().id
    panel = tuple(ChatSettings.of(service.get_chat(chat)).as_dict().values())
    reads = []
    read = service.store.tree
    service.store.tree = lambda chat_id: reads.append(chat_id) or read(chat_id)

    async def send(text):
        chat_id, pending, *_ = handlers.begin_send(text, chat, False, "", [], *panel, request)
        async for _ in handlers.stream_reply(pending, chat_id, request):
            pass
        return handlers.end_send(chat_id, "", request)[0]

    async def regenerate():
        async for _ in handlers.regenerate(chat, request):
            pass
        return handlers.end_send(chat, "", request)[0]

    for text in ("Name a colour.", "Name another one."):
        reads.clear()
        shown = run(send(text))
        assert reads == [chat, chat], "the page's read and the turn's"
        assert shown == handlers.shown(chat, None), "the chat as stored"
        assert [m["role"] for m in shown][-2:] == ["user", "assistant"]
    reads.clear()
    shown = run(regenerate())
    assert reads == [chat, chat, chat], "the page's, regenerate's check and the turn's"
    assert shown == handlers.shown(chat, None)
    assert "2/2" in shown[-1]["content"], "the new version, with its tools"


def test_a_reply_whose_following_failed_is_followed_again_to_its_end(service):
    """The stuck page once seen in a fresh-clone CI run: the event that followed a reply ended
    before the reply did (it failed, or the page lost it) and the chat shown went on saying
    "writing a reply…" with the old reply under it. end_send, run after every reply's event
    however it ended, now asks the page to follow the reply again while the chat it shows
    still has one (its last output; the page's REFOLLOW_JS clicks Follow), and only then: the
    following that results shows the reply to its end, drawn as kept."""
    from types import SimpleNamespace

    from reame.config.chat_settings import ChatSettings
    from reame.web.page.sending import PageHandlers

    handlers = PageHandlers(service, LiveReplies(unwatched_s=60), settings=None,
                            can_configure=lambda user: True, uploads=None)
    request = SimpleNamespace(username=None, session_hash="tab", headers={})
    chat = service.new_chat().id
    service.update_settings(chat, max_tokens=48)
    panel = tuple(ChatSettings.of(service.get_chat(chat)).as_dict().values())

    async def scenario():
        chat_id, pending, *_ = handlers.begin_send(LONG, chat, False, "", [], *panel, request)
        # The event that follows the reply ends after two of its updates (as if it failed).
        updates = handlers.stream_reply(pending, chat_id, request)
        await anext(updates)
        await anext(updates)
        await updates.aclose()
        assert handlers.live.get(None, chat) is not None, "the reply goes on"
        ended = handlers.end_send(chat_id, "", request)
        assert ended[-1] == "yes", "follow it again"
        assert "writing a reply" in ended[2]  # the list says so meanwhile
        followed = [update async for update in handlers.follow(chat_id, "", request)]
        assert handlers.live.get(None, chat) is None
        drawn = followed[-1][0]
        assert drawn == handlers.shown(chat, None), "the end, drawn as kept"
        assert drawn[-1]["role"] == "assistant" and not service.messages(chat)[-1].stopped
        # Once it has ended: nothing to follow again.
        assert handlers.end_send(chat_id, "", request)[-1] == ""

    handlers.live.showing("tab", chat)
    run(scenario())

"""Fair shares: with accounts, one user holds at most their share of the slots and of the line.

The real model on a 4-slot engine, real SQLite. alice sends more than her share: the rest of her
turns wait (or are refused past her share of the line) while bob's turn gets a free slot at once.
"""

from __future__ import annotations

import pytest

from reame.chats.service import ServerBusy
from reame.inference.engine import Engine
from reame.inference.tasks import Limits
from reame.runtime import service_over

from tests.conftest import GREEDY, THREADS

LONG = "Write a long story about a dragon who learns to sing."


@pytest.fixture(scope="module")
def engine4(model_path) -> Engine:
    engine = Engine(model_path, n_ctx=1024, slots=4, n_threads=THREADS)
    yield engine
    engine.close()


@pytest.fixture
def service(tmp_path, engine4):
    service = service_over(tmp_path, engine4, GREEDY.changed(max_tokens=300), max_waiting=4,
                           share=0.5)
    yield service
    service.close()


def started(stream):
    """The stream's first update: a token of the reply, or its place in line."""
    return next(stream)


def test_limits_per_user():
    assert Limits(max_waiting=16, share=0.5).per_user(4) == (2, 8)
    assert Limits(max_waiting=0, share=0.25).per_user(2) == (1, 1)  # never nothing


def test_one_user_holds_at_most_their_share_of_the_slots(service):
    alice = [service.send(service.new_chat(user="alice").id, LONG, user="alice")
             for _ in range(3)]
    firsts = [started(s) for s in alice]
    assert [f.queued for f in firsts] == [0, 0, 1]  # two slots of four; the third waits
    bob = service.send(service.new_chat(user="bob").id, LONG, user="bob")
    assert started(bob).queued == 0  # a free slot, although alice's turn waits before him
    assert service.scheduler.load() == (3, 1)
    alice[0].close()  # one of hers ends: her waiting turn takes its slot
    assert next(alice[2]).queued == 0
    for stream in (*alice[1:], bob):
        stream.close()
    assert service.scheduler.busy == 0


def test_past_their_share_of_the_line_a_user_is_refused_and_others_are_not(service):
    # share 0.5 of 4 slots and of a line of 4: 2 writing and 2 waiting, then refused.
    alice = [service.send(service.new_chat(user="alice").id, LONG, user="alice")
             for _ in range(4)]
    assert [started(s).queued for s in alice] == [0, 0, 1, 2]
    refused = service.new_chat(user="alice")
    with pytest.raises(ServerBusy, match="one user"):
        started(service.send(refused.id, LONG, user="alice"))
    assert service.messages(refused.id, user="alice") == []  # nothing kept: send again
    bob = service.send(service.new_chat(user="bob").id, LONG, user="bob")
    assert started(bob).queued == 0
    for stream in (*alice, bob):
        stream.close()
    assert service.scheduler.busy == 0


def test_without_accounts_everyone_may_use_every_slot(service):
    streams = [service.send(service.new_chat().id, LONG) for _ in range(4)]
    assert [started(s).queued for s in streams] == [0, 0, 0, 0]
    for stream in streams:
        stream.close()

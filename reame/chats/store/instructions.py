"""Each user's custom instructions in the store's database: one row per user (owner "" on a
server without accounts), none for a user who set none."""

from __future__ import annotations

import time

from sqlmodel import Session

from reame.chats.store.tables import UserInstructions


class InstructionsStore:
    """Custom instructions in the store's database (store.db); writes through its write gate."""

    def __init__(self, store):
        self.store = store

    def get(self, owner: str | None) -> tuple[str, str]:
        """(how to answer, about me) of owner; two empty texts if none are set."""
        with Session(self.store.db) as session:
            row = session.get(UserInstructions, owner or "")
        return ("", "") if row is None else (row.how_to_answer, row.about_me)

    def put(self, owner: str | None, how_to_answer: str, about_me: str) -> None:
        """Set owner's instructions; both empty: none."""
        with self.store._gate.write(), Session(self.store.db) as session:
            row = session.get(UserInstructions, owner or "")
            if not (how_to_answer or about_me):
                if row is not None:
                    session.delete(row)
            elif row is None:
                session.add(UserInstructions(owner=owner or "", how_to_answer=how_to_answer,
                                             about_me=about_me))
            else:
                row.how_to_answer, row.about_me = how_to_answer, about_me
                row.updated_at = time.time()
                session.add(row)
            session.commit()

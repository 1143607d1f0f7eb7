"""The responses of /v1/responses kept for previous_response_id: each row a response's new
input items, its output items and its reply's text (JSON), the response it follows and whose it
is. A user keeps at most MAX_PER_USER responses (the oldest go first) for at most MAX_AGE_S;
another user's id is as if it did not exist. A chain is walked back from its last response, at
most MAX_CHAIN responses."""

from __future__ import annotations

import json
import time

from sqlmodel import Session, delete, func, select

from reame.chats.store.tables import StoredResponse

MAX_PER_USER = 1000
MAX_AGE_S = 30 * 24 * 3600  # 30 days
MAX_CHAIN = 1000


class ResponseNotFound(LookupError):
    pass


class StoredResponses:
    """Stored responses in the store's database (store.db); writes through its write gate."""

    def __init__(self, store, *, max_per_user: int = MAX_PER_USER,
                 max_age_s: float = MAX_AGE_S):
        self.store, self.max_per_user, self.max_age_s = store, max_per_user, max_age_s

    def _session(self) -> Session:
        return Session(self.store.db, expire_on_commit=False)

    def save(self, response_id: str, owner: str | None, previous_id: str | None,
             data: dict) -> None:
        text = json.dumps(data, ensure_ascii=False)
        with self.store._gate.write(), self._session() as session:
            session.add(StoredResponse(id=response_id, owner=owner, previous_id=previous_id,
                                       size=len(text.encode()), data=text))
            session.flush()
            # The bounds: expired ones, then this user's oldest beyond the count.
            session.exec(delete(StoredResponse).where(
                StoredResponse.created_at < time.time() - self.max_age_s))
            kept = session.exec(select(func.count()).select_from(StoredResponse).where(
                _owned(owner))).one()
            if kept > self.max_per_user:
                oldest = session.exec(select(StoredResponse.id).where(_owned(owner)).order_by(
                    StoredResponse.created_at, StoredResponse.id).limit(
                    kept - self.max_per_user)).all()
                session.exec(delete(StoredResponse).where(StoredResponse.id.in_(oldest)))
            session.commit()

    def get(self, response_id: str, owner: str | None) -> tuple[str | None, dict]:
        """(the response it follows, its data); ResponseNotFound for another user's, an
        expired or an unknown id."""
        with self._session() as session:
            row = session.get(StoredResponse, response_id)
        if (row is None or row.owner != owner
                or row.created_at < time.time() - self.max_age_s):
            raise ResponseNotFound(response_id)
        return row.previous_id, json.loads(row.data)

    def chain(self, response_id: str, owner: str | None) -> list[dict]:
        """The data of every response of the chain that ends at response_id, oldest first."""
        found, at = [], response_id
        while at is not None and len(found) < MAX_CHAIN:
            at, data = self.get(at, owner)
            found.append(data)
        return found[::-1]

    def delete(self, response_id: str, owner: str | None) -> None:
        self.get(response_id, owner)
        with self.store._gate.write(), self._session() as session:
            session.exec(delete(StoredResponse).where(StoredResponse.id == response_id))
            session.commit()


def _owned(owner: str | None):
    return (StoredResponse.owner.is_(None) if owner is None
            else StoredResponse.owner == owner)

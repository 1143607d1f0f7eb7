"""The responses of /v1/responses kept for previous_response_id: each row a response's new
input items, its output items and its reply's text (JSON), the response it follows and whose it
is. A user keeps at most MAX_PER_USER responses and MAX_BYTES_PER_USER bytes of them (the oldest
go first) for at most MAX_AGE_S;
another user's id is as if it did not exist. A chain is walked back from its last response, at
most MAX_CHAIN responses."""

from __future__ import annotations

import json
import time

from sqlmodel import Session, delete, func, select

from reame.chats.store.tables import StoredResponse

MAX_PER_USER = 1000
MAX_BYTES_PER_USER = 64 << 20  # 64 MiB of items and replies (a request's body is at most 1 MB)
MAX_AGE_S = 30 * 24 * 3600  # 30 days
MAX_CHAIN = 1000


class ResponseNotFound(LookupError):
    pass


class StoredResponses:
    """Stored responses in the store's database (store.db); writes through its write gate."""

    def __init__(self, store, *, max_per_user: int = MAX_PER_USER,
                 max_bytes_per_user: int = MAX_BYTES_PER_USER, max_age_s: float = MAX_AGE_S):
        self.store, self.max_per_user, self.max_age_s = store, max_per_user, max_age_s
        self.max_bytes_per_user = max_bytes_per_user

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
            count, size = session.exec(select(func.count(), func.sum(StoredResponse.size)).where(
                _owned(owner))).one()
            if count > self.max_per_user or (size or 0) > self.max_bytes_per_user:
                self._drop_oldest(session, owner)
            session.commit()

    def _drop_oldest(self, session: Session, owner: str | None) -> None:
        """Keep a user's newest responses within both bounds; the newest stays in any case."""
        rows = session.exec(select(StoredResponse.id, StoredResponse.size).where(
            _owned(owner)).order_by(StoredResponse.created_at.desc(),
                                    StoredResponse.id.desc())).all()
        total, cut = 0, len(rows)
        for n, (_, size) in enumerate(rows):
            total += size
            if n and (n >= self.max_per_user or total > self.max_bytes_per_user):
                cut = n
                break
        oldest = [row_id for row_id, _ in rows[cut:]]
        for at in range(0, len(oldest), 500):
            session.exec(delete(StoredResponse).where(StoredResponse.id.in_(oldest[at:at + 500])))

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

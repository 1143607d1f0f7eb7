"""Chats and messages through sqlmodel, in SQLite (one file, the default) or PostgreSQL
([storage] database_url: several Reame nodes share it). The only package that knows SQL.

The tables (tables.py), the queries (database.py: Store) and the migrations (migrations.py,
which has Alembic run the revisions in alembic/versions/) are the same on both; what differs is
said where it does: SQLite's PRAGMAs (WAL), and search (search.py: SQLite's FTS5 tables kept by
triggers; PostgreSQL's tsvector columns with GIN indexes). A dialect-specific step names its
dialect. Its users import from here.
"""

from reame.chats.store.database import Store
from reame.chats.store.message_tree import MessageTree
from reame.chats.store.migrations import revisions
from reame.chats.store.search import END_MARK, MARK, Found
from reame.chats.store.tables import Chat, DatabaseUnavailable, Message, MessageNotFound

__all__ = ["END_MARK", "MARK", "Chat", "DatabaseUnavailable", "Found", "Message",
           "MessageNotFound", "MessageTree", "Store", "revisions"]

"""Alembic's environment for Reame's schema (reame/chats/store/migrations.py: migrate).

The app hands its connection in config.attributes["connection"] (no alembic.ini); a
developer's `alembic` command (a config naming this folder and a sqlalchemy.url) gets an
engine of its own, e.g. to write the next revision with --autogenerate against the models."""

from alembic import context
from sqlalchemy import create_engine
from sqlmodel import SQLModel

from reame.chats.store import tables  # noqa: F401 - the models, into SQLModel.metadata
from reame.chats.store.migrations import schema_object


def run(connection) -> None:
    applied = context.config.attributes.setdefault("applied", [])
    context.configure(
        connection=connection,
        target_metadata=SQLModel.metadata,
        include_object=schema_object,
        on_version_apply=lambda step, **_: applied.append(step.up_revision_id),
    )
    with context.begin_transaction():
        context.run_migrations()


given = context.config.attributes.get("connection")
if given is not None:
    run(given)
else:
    with create_engine(context.config.get_main_option("sqlalchemy.url")).connect() as own:
        run(own)

"""007_archive: a chat can be archived: out of the chat list, still found by search and
opened as any other.
"""

import sqlalchemy as sa
from alembic import op

revision = "007_archive"
down_revision = "006_ids_never_reused"


def upgrade() -> None:
    if "archived" not in {column["name"]
                          for column in sa.inspect(op.get_bind()).get_columns("chat")}:
        op.add_column("chat", sa.Column("archived", sa.Boolean(), nullable=False,
                                        server_default=sa.false()))


def downgrade() -> None:
    raise NotImplementedError("forward only, as Reame's migrations always were")

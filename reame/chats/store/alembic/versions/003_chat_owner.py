"""003_chat_owner: the user a chat belongs to (NULL: made without accounts)."""

import sqlalchemy as sa
from alembic import op

revision = "003_chat_owner"
down_revision = "002_chat_window_start"


def upgrade() -> None:
    columns = {column["name"] for column in sa.inspect(op.get_bind()).get_columns("chat")}
    if "owner" not in columns:
        op.add_column("chat", sa.Column("owner", sa.String(), nullable=True))
    op.create_index("ix_chat_owner", "chat", ["owner"], if_not_exists=True)


def downgrade() -> None:
    raise NotImplementedError("forward only, as Reame's migrations always were")

"""002_chat_window_start: where the model's window starts in a chat (the messages before it no
longer fit its context).
"""

import sqlalchemy as sa
from alembic import op

revision = "002_chat_window_start"
down_revision = "001_create_chat_and_message"


def upgrade() -> None:
    columns = {column["name"] for column in sa.inspect(op.get_bind()).get_columns("chat")}
    if "window_start" not in columns:
        op.add_column("chat", sa.Column("window_start", sa.Integer(), nullable=False,
                                        server_default="0"))


def downgrade() -> None:
    raise NotImplementedError("forward only, as Reame's migrations always were")

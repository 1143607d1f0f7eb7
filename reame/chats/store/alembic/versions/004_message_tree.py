"""004_message_tree: messages become a tree (parent_id) and a chat shows one branch of it
(leaf_id); a chat stored as a list is that list's one branch. branched_from: the chat a
chat was branched from.
"""

import sqlalchemy as sa
from alembic import op

revision = "004_message_tree"
down_revision = "003_chat_owner"

ID = sa.Integer().with_variant(sa.BigInteger(), "postgresql")


def _columns(table: str) -> set[str]:
    return {column["name"] for column in sa.inspect(op.get_bind()).get_columns(table)}


def upgrade() -> None:
    if "parent_id" not in _columns("message"):
        op.add_column("message", sa.Column("parent_id", ID, nullable=True))
        op.execute("UPDATE message SET parent_id = (SELECT before.id FROM message AS before "
                   "WHERE before.chat_id = message.chat_id AND before.position "
                   "= message.position - 1)")
    op.create_index("ix_message_parent_id", "message", ["parent_id"], if_not_exists=True)
    chat_columns = _columns("chat")
    if "leaf_id" not in chat_columns:
        op.add_column("chat", sa.Column("leaf_id", ID, nullable=True))
        op.execute("UPDATE chat SET leaf_id = (SELECT id FROM message WHERE "
                   "message.chat_id = chat.id ORDER BY position DESC LIMIT 1)")
    if "branched_from" not in chat_columns:
        op.add_column("chat", sa.Column("branched_from", ID, nullable=True))


def downgrade() -> None:
    raise NotImplementedError("forward only, as Reame's migrations always were")

"""010_user_instructions: each user's custom instructions (how to answer, about me), which the
chats they start take into their system prompt (reame/chats/instructions.py).
"""

import sqlalchemy as sa
from alembic import op

revision = "010_user_instructions"
down_revision = "009_tool_calls"


def upgrade() -> None:
    if "user_instructions" not in sa.inspect(op.get_bind()).get_table_names():
        op.create_table(
            "user_instructions",
            sa.Column("owner", sa.String(), nullable=False),
            sa.Column("how_to_answer", sa.String(), nullable=False),
            sa.Column("about_me", sa.String(), nullable=False),
            sa.Column("updated_at", sa.Float(), nullable=False),
            sa.PrimaryKeyConstraint("owner"))


def downgrade() -> None:
    raise NotImplementedError("forward only, as Reame's migrations always were")

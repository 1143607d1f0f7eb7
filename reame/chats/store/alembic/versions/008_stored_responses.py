"""008_stored_responses: the responses of /v1/responses kept for previous_response_id, each
its user's, bounded per user and expiring (stored_responses.py).
"""

import sqlalchemy as sa
from alembic import op

revision = "008_stored_responses"
down_revision = "007_archive"


def upgrade() -> None:
    if "stored_response" not in sa.inspect(op.get_bind()).get_table_names():
        op.create_table(
            "stored_response",
            sa.Column("id", sa.String(), nullable=False),
            sa.Column("owner", sa.String(), nullable=True),
            sa.Column("previous_id", sa.String(), nullable=True),
            sa.Column("created_at", sa.Float(), nullable=False),
            sa.Column("size", sa.Integer(), nullable=False),
            sa.Column("data", sa.String(), nullable=False),
            sa.PrimaryKeyConstraint("id"))
    op.create_index("ix_stored_response_owner", "stored_response", ["owner"],
                    if_not_exists=True)
    op.create_index("ix_stored_response_created_at", "stored_response", ["created_at"],
                    if_not_exists=True)


def downgrade() -> None:
    raise NotImplementedError("forward only, as Reame's migrations always were")

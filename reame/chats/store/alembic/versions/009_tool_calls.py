"""009_tool_calls: a stored chat holds tool calls and their results (X-Reame-Chat with
tools): an assistant message's calls (JSON: id, name, arguments of each), and a message of
role "tool" names the call it answers.
"""

import sqlalchemy as sa
from alembic import op

revision = "009_tool_calls"
down_revision = "008_stored_responses"


def upgrade() -> None:
    have = {column["name"] for column in sa.inspect(op.get_bind()).get_columns("message")}
    for name in ("tool_calls", "tool_call_id"):
        if name not in have:
            op.add_column("message", sa.Column(name, sa.String(), nullable=True))


def downgrade() -> None:
    raise NotImplementedError("forward only, as Reame's migrations always were")

"""${up_revision}: ${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}

Forward only and idempotent, as every revision here (see 001): what exists already is left
as it is. A step that differs between SQLite and PostgreSQL names its dialect.
"""

import sqlalchemy as sa
from alembic import op
${imports if imports else ""}
revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = ${repr(branch_labels)}
depends_on = ${repr(depends_on)}


def upgrade() -> None:
    ${upgrades if upgrades else "pass"}


def downgrade() -> None:
    raise NotImplementedError("forward only, as Reame's migrations always were")

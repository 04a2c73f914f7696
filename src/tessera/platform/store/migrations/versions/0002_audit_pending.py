"""Audit entries are written before the change they record: `pending` until it is made (or, after a crash,
until the next start settles it), and `ref`, the id of the run a submit or clone makes, to check it by.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("audit") as batch:
        batch.add_column(sa.Column("pending", sa.Boolean, nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("ref", sa.String(64), nullable=True))
        batch.create_index("ix_audit_pending", ["pending"])


def downgrade() -> None:
    with op.batch_alter_table("audit") as batch:
        batch.drop_index("ix_audit_pending")
        batch.drop_column("ref")
        batch.drop_column("pending")

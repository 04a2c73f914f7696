"""The runs list's filtered indexes cover only runs not (soft-)deleted, as the list and its total do.

Since 0004 every list and count of runs also asks `deleted IS NULL`, a column the (team, status, created,
id) and (team, user, created, id) indexes did not hold: a page's total by status (`SELECT count(*) ...
WHERE team = ? AND status = ? AND deleted IS NULL`) then read every matching row from the table (13.6 ms
for 1,829 of 10,000 runs on PostgreSQL, by `EXPLAIN ANALYZE`) instead of counting index entries. As
partial indexes over the live runs they answer those counts from the index alone and keep serving the
pages, and deleted runs no longer take room in them. (team, created, id) stays whole: it also serves the
list with `includeDeleted`.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

LIVE = sa.text("deleted IS NULL")
INDEXES = {"ix_runs_team_status_created": ["team", "status", "created", "id"],
           "ix_runs_team_user_created": ["team", "user", "created", "id"]}


def upgrade() -> None:
    for name, columns in INDEXES.items():
        op.drop_index(name, "runs")
        op.create_index(name, "runs", columns, sqlite_where=LIVE, postgresql_where=LIVE)


def downgrade() -> None:
    for name, columns in INDEXES.items():
        op.drop_index(name, "runs")
        op.create_index(name, "runs", columns)

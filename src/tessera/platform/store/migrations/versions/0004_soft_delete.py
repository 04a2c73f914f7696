"""Soft delete of runs (MCLI's deleteRuns, `includeDeleted`): runs.deleted, the time a run was deleted
(NULL: it is not), and the unique run name per team becomes a partial unique index over the runs that
are not deleted, so the name of a deleted run can be given to a new one.

SQLite cannot drop a table's UNIQUE constraint: the table is rebuilt (Alembic's batch mode). db.migrate
runs migrations on SQLite with foreign keys off, so dropping the old table does not cascade into the
runs' resumptions, events, metrics and leases.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

LIVE = sa.text("deleted IS NULL")


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("deleted", sa.Float))
        batch.drop_constraint("uq_runs_team_name", type_="unique")
    op.create_index("uq_runs_team_name", "runs", ["team", "name"], unique=True, sqlite_where=LIVE,
                    postgresql_where=LIVE)


def downgrade() -> None:
    """Deleted runs are forgotten (their rows, with what cascades from them): the older schema has no
    place for them, and their names may be taken by runs made since."""
    for table in ("resumptions", "events", "metrics", "run_leases"):   # no cascade: foreign keys are off
        op.execute(f"DELETE FROM {table} WHERE run_id IN (SELECT id FROM runs WHERE deleted IS NOT NULL)")
    op.execute("DELETE FROM runs WHERE deleted IS NOT NULL")
    op.drop_index("uq_runs_team_name", "runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("deleted")
        batch.create_unique_constraint("uq_runs_team_name", ["team", "name"])

"""One store: every team's clusters, runs, resumptions, events, node faults, metrics and secrets join the
accounts and the audit log, with the replicas, the run leases and a settings table. The audit entry of a
change now commits with the change, so entries are no longer pending.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

NAME = 255
RUN_ID = 32


def _run_fk() -> sa.Column:
    return sa.Column("run_id", sa.String(RUN_ID), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False)


def upgrade() -> None:
    # Entries a server of the previous version left pending (it was killed mid-change) stay, marked as
    # that version's own start-up would have marked them (its audit.py).
    op.execute("UPDATE audit SET detail = detail || ' (unconfirmed: the server stopped during this request)' "
               "WHERE pending")
    with op.batch_alter_table("audit") as batch:
        batch.drop_index("ix_audit_pending")
        batch.drop_column("ref")
        batch.drop_column("pending")
        batch.create_index("ix_audit_team_id", ["team", "id"])
    op.create_table(
        "clusters",
        sa.Column("team", sa.String(63), primary_key=True),
        sa.Column("name", sa.String(NAME), primary_key=True),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("config", sa.Text, nullable=False),
        sa.Column("created", sa.Float, nullable=False),
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.String(RUN_ID), primary_key=True),
        sa.Column("team", sa.String(63), nullable=False),
        sa.Column("name", sa.String(NAME), nullable=False),
        sa.Column("spec", sa.Text, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("cluster", sa.String(NAME), nullable=False),
        sa.Column("created", sa.Float, nullable=False),
        sa.Column("updated", sa.Float, nullable=False),
        sa.Column("ended", sa.Float),
        sa.Column("request", sa.String(16)),
        sa.Column("request_arg", sa.Text),
        sa.Column("retries_used", sa.Integer, nullable=False),
        sa.Column("system_retries", sa.Integer, nullable=False),
        sa.Column("failure_kind", sa.String(64)),
        sa.Column("first_error", sa.Text),
        sa.Column("not_before", sa.Float),
        sa.Column("folder", sa.Text, nullable=False),
        sa.Column("workdir", sa.Text),
        sa.Column("next_cause", sa.Text),
        sa.Column("user", sa.String(NAME)),
        sa.Column("metrics_next", sa.Integer, nullable=False),
        sa.UniqueConstraint("team", "name", name="uq_runs_team_name"),
    )
    op.create_index("ix_runs_team_created", "runs", ["team", "created", "id"])
    op.create_index("ix_runs_team_status_created", "runs", ["team", "status", "created", "id"])
    op.create_index("ix_runs_team_user_created", "runs", ["team", "user", "created", "id"])
    op.create_index("ix_runs_status", "runs", ["status"])
    op.create_table(
        "resumptions",
        sa.Column("run_id", sa.String(RUN_ID), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("idx", sa.Integer, primary_key=True),
        sa.Column("cluster", sa.String(NAME), nullable=False),
        sa.Column("cause", sa.Text, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("job_id", sa.Text),
        sa.Column("handle", sa.Text),
        sa.Column("nodes", sa.Text, nullable=False),
        sa.Column("folder", sa.Text, nullable=False),
        sa.Column("submitted", sa.Float, nullable=False),
        sa.Column("start", sa.Float),
        sa.Column("end", sa.Float),
        sa.Column("exit_code", sa.Integer),
        sa.Column("outcome", sa.String(64)),
        sa.Column("detail", sa.Text),
        sa.Column("last_beat", sa.Text),
        sa.Column("last_progress", sa.Float),
        sa.Column("stop_sent", sa.Float),
        sa.Column("kill_sent", sa.Float),
        sa.Column("stop_reason", sa.String(32)),
        sa.Column("first_beat", sa.Text),
        sa.Column("events_offset", sa.Integer, nullable=False),
    )
    op.create_table(
        "events",
        sa.Column("id", sa.Integer, primary_key=True),
        _run_fk(),
        sa.Column("team", sa.String(63), nullable=False),
        sa.Column("time", sa.Float, nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("data", sa.Text),
    )
    op.create_index("ix_events_run", "events", ["run_id", "id"])
    op.create_index("ix_events_team", "events", ["team", "id"])
    op.create_table(
        "node_faults",
        sa.Column("team", sa.String(63), primary_key=True),
        sa.Column("cluster", sa.String(NAME), primary_key=True),
        sa.Column("node", sa.String(255), primary_key=True),
        sa.Column("faults", sa.Integer, nullable=False),
        sa.Column("excluded", sa.Integer, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("updated", sa.Float, nullable=False),
    )
    op.create_table(
        "metrics",
        sa.Column("id", sa.Integer, primary_key=True),
        _run_fk(),
        sa.Column("step", sa.Integer),
        sa.Column("data", sa.Text, nullable=False),
    )
    op.create_index("ix_metrics_run", "metrics", ["run_id", "id"])
    op.create_table(
        "secrets",
        sa.Column("team", sa.String(63), primary_key=True),
        sa.Column("name", sa.String(NAME), primary_key=True),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("created", sa.Float, nullable=False),
        sa.Column("token", sa.LargeBinary, nullable=False),
    )
    op.create_table(
        "replicas",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("boot_id", sa.String(64), nullable=False),
        sa.Column("url", sa.Text),
        sa.Column("started", sa.Float, nullable=False),
        sa.Column("beat", sa.Float, nullable=False),
    )
    op.create_table(
        "run_leases",
        sa.Column("run_id", sa.String(RUN_ID), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("owner", sa.String(64)),
        sa.Column("token", sa.Integer, nullable=False),
        sa.Column("heartbeat", sa.Float, nullable=False),
        sa.Column("expires", sa.Float, nullable=False),
    )
    op.create_index("ix_run_leases_expires", "run_leases", ["expires"])
    op.create_table(
        "settings",
        sa.Column("key", sa.String(255), primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
    )


def downgrade() -> None:
    for table in ("settings", "run_leases", "replicas", "secrets", "metrics", "node_faults", "events",
                  "resumptions", "runs", "clusters"):
        op.drop_table(table)
    with op.batch_alter_table("audit") as batch:
        batch.drop_index("ix_audit_team_id")
        batch.add_column(sa.Column("pending", sa.Boolean, nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("ref", sa.String(64), nullable=True))
        batch.create_index("ix_audit_pending", ["pending"])

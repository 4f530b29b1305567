"""Services and replicas.

Revision ID: 0002_services
"""

import sqlalchemy as sa
from alembic import op

revision = "0002_services"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "services",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("team", sa.String(64), sa.ForeignKey("teams.name"), nullable=False),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("manual_replicas", sa.Integer, nullable=True),
        sa.Column("deleting", sa.Boolean, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.UniqueConstraint("team", "name", name="uq_services_team_name"),
    )
    op.create_index("ix_services_team", "services", ["team"])
    op.create_table(
        "replicas",
        sa.Column("id", sa.String(96), primary_key=True),
        sa.Column("service_seq", sa.Integer, sa.ForeignKey("services.seq"), nullable=False),
        sa.Column("team", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reason", sa.String(32), nullable=True),
        sa.Column("message", sa.Text, nullable=True),
        sa.Column("node_id", sa.String(64), nullable=True),
        sa.Column("url", sa.String(256), nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("ready_at", sa.Float, nullable=True),
        sa.Column("finished_at", sa.Float, nullable=True),
    )
    op.create_index("ix_replicas_service_seq", "replicas", ["service_seq"])
    op.create_index("ix_replicas_team", "replicas", ["team"])
    op.create_index("ix_replicas_status", "replicas", ["status"])


def downgrade() -> None:
    op.drop_table("replicas")
    op.drop_table("services")

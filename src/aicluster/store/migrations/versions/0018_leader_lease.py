"""The leader lease (one row per lease name: holder, epoch, expiry) and one heartbeat row
per control-plane replica (store.lease).

Revision ID: 0018_leader_lease
"""

import sqlalchemy as sa
from alembic import op

revision = "0018_leader_lease"
down_revision = "0017_portable_types"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "leader_lease",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("holder", sa.String(128), nullable=False),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.Column("acquired_at", sa.Float, nullable=False),
        sa.Column("renewed_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
    )
    op.create_table(
        "control_plane_replicas",
        sa.Column("holder", sa.String(128), primary_key=True),
        sa.Column("url", sa.String(256), nullable=True),
        sa.Column("host", sa.String(128), nullable=False),
        sa.Column("pid", sa.BigInteger, nullable=False),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("heartbeat_at", sa.Float, nullable=False),
        sa.Column("leading_epoch", sa.BigInteger, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("control_plane_replicas")
    op.drop_table("leader_lease")

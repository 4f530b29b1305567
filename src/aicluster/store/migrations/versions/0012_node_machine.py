"""Node identity that outlives a Ray node id: a node record is one incarnation of a
machine (`machine_id`, the machine's stable id), `incarnations` counts the machine's
incarnations up to this one, and `superseded_by` names the incarnation that replaced a
retired one.

Revision ID: 0012_node_machine
"""

import sqlalchemy as sa
from alembic import op

revision = "0012_node_machine"
down_revision = "0011_event_attempt"
branch_labels = None
depends_on = ("0003_nodes",)  # the nodes table lives on a branch of its own


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("machine_id", sa.Text(), nullable=True))
        batch.add_column(
            sa.Column("incarnations", sa.Integer(), nullable=False, server_default="1")
        )
        batch.add_column(sa.Column("superseded_by", sa.String(64), nullable=True))
        batch.create_index("ix_nodes_machine_id", ["machine_id"])


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_index("ix_nodes_machine_id")
        batch.drop_column("superseded_by")
        batch.drop_column("incarnations")
        batch.drop_column("machine_id")

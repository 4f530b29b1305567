"""A no-op step on the nodes branch, so that the merge (0016_linear_history) can join it.

The nodes branch (0003_nodes) is only a `depends_on` of 0012_node_machine; once 0012 is
applied Alembic drops 0003_nodes from the version table, so a merge naming 0003_nodes
itself would find no row to merge. This revision follows 0003_nodes: it takes 0003_nodes'
row where there is one, or gets a row of its own where 0012 absorbed it. It changes no
schema.

Revision ID: 0015_nodes_bridge
"""

revision = "0015_nodes_bridge"
down_revision = "0003_nodes"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass

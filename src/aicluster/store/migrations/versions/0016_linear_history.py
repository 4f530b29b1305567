"""Merge: one linear history from here on. Features once got a branch each off 0001 (and
two files were named 0002_*); this revision joins every head, so `upgrade head` (a single
head) replaces `upgrade heads`, and every later revision follows it in one chain. It
changes no schema.

Revision ID: 0016_linear_history
"""

revision = "0016_linear_history"
down_revision = (
    "0002_services",
    "0004_quotas",
    "0006_scoped_tokens",
    "0007_artifact_proofs",
    "0014_usage_ledger",
    "0015_nodes_bridge",
)
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass

"""Artifact blob proofs: which team has shown it holds which blob's bytes.

Revision ID: 0007_artifact_proofs

Starts empty: a team re-sends a blob once (verified, a no-op on the stored bytes)
before an upload of its may reuse it.
"""

import sqlalchemy as sa
from alembic import op

revision = "0007_artifact_proofs"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "artifact_blob_proofs",
        sa.Column("team", sa.String(64), sa.ForeignKey("teams.name"), primary_key=True),
        sa.Column("sha256", sa.String(64), primary_key=True),
        sa.Column("created_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("artifact_blob_proofs")

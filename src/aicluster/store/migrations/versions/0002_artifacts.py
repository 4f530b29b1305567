"""Artifacts: names, versions, tags, shares and upload sessions.

Revision ID: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "artifacts",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("team", sa.String(64), sa.ForeignKey("teams.name"), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("next_version", sa.Integer, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.UniqueConstraint("team", "name", name="uq_artifacts_team_name"),
    )
    op.create_index("ix_artifacts_team", "artifacts", ["team"])
    op.create_table(
        "artifact_versions",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("artifact_id", sa.Integer, sa.ForeignKey("artifacts.id"), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("manifest_sha256", sa.String(64), nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("file_count", sa.Integer, nullable=False),
        sa.Column("producer_job", sa.String(80), nullable=True),
        sa.Column("meta", sa.JSON, nullable=False),
        sa.Column("created_by", sa.String(64), nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.UniqueConstraint("artifact_id", "version", name="uq_artifact_versions_version"),
    )
    op.create_index("ix_artifact_versions_artifact_id", "artifact_versions", ["artifact_id"])
    op.create_table(
        "artifact_tags",
        sa.Column("artifact_id", sa.Integer, sa.ForeignKey("artifacts.id"), primary_key=True),
        sa.Column("tag", sa.String(64), primary_key=True),
        sa.Column("version", sa.Integer, nullable=False),
    )
    op.create_table(
        "artifact_shares",
        sa.Column("artifact_id", sa.Integer, sa.ForeignKey("artifacts.id"), primary_key=True),
        sa.Column("team", sa.String(64), sa.ForeignKey("teams.name"), primary_key=True),
    )
    op.create_table(
        "artifact_uploads",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("team", sa.String(64), sa.ForeignKey("teams.name"), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("version", sa.Integer, nullable=True),
        sa.Column("tag", sa.String(64), nullable=True),
        sa.Column("files", sa.JSON, nullable=False),
        sa.Column("meta", sa.JSON, nullable=False),
        sa.Column("producer_job", sa.String(80), nullable=True),
        sa.Column("created_by", sa.String(64), nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_index("ix_artifact_uploads_team", "artifact_uploads", ["team"])


def downgrade() -> None:
    for table in (
        "artifact_uploads", "artifact_shares", "artifact_tags", "artifact_versions", "artifacts",
    ):
        op.drop_table(table)

"""An index for resolving a job's name: the newest job of NAME in a team (or in each team).

Revision ID: 0008_job_names
"""

from alembic import op

revision = "0008_job_names"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_jobs_name_team", "jobs", ["name", "team"])


def downgrade() -> None:
    op.drop_index("ix_jobs_name_team", table_name="jobs")

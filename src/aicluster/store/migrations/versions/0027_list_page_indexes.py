"""Indexes for the list routes' keyset pages (store.cursors): a status's and a team's jobs
newest first by seq, a team's and an object's events and a user's tokens by id.

Revision ID: 0027_list_page_indexes
"""

from alembic import op

revision = "0027_list_page_indexes"
down_revision = "0026_shared_job_files"
branch_labels = None
depends_on = None

INDEXES = [
    ("ix_jobs_status_seq", "jobs", ["status", "seq"]),
    ("ix_jobs_team_seq", "jobs", ["team", "seq"]),
    ("ix_events_team_id", "events", ["team", "id"]),
    ("ix_events_object_id_id", "events", ["object_id", "id"]),
    ("ix_tokens_user_id", "tokens", ["user", "id"]),
]


def upgrade() -> None:
    for name, table, columns in INDEXES:
        op.create_index(name, table, columns)


def downgrade() -> None:
    for name, table, _ in reversed(INDEXES):
        op.drop_index(name, table_name=table)

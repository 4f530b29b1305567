"""Tables of what a job brings and leaves that every control-plane replica must read
(store.jobfiles): the working-directory archives sent at submit, and the workers' logs as
the leader pulls them, in chunks.

A log chunk is the bytes of one pull of one rank at a byte offset: (job_id, attempt, rank,
offset) is its key, and a rank's log is its chunks in offset order with no gap or overlap.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Float, Integer, LargeBinary, String
from sqlalchemy.orm import Mapped, mapped_column

from aicluster.store.schema import Base


class WorkdirRow(Base):
    __tablename__ = "job_workdirs"
    ref: Mapped[str] = mapped_column(String(80), primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)  # a .tar.gz, at most MAX_WORKDIR_BYTES
    size: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[float] = mapped_column(Float)


class LogChunkRow(Base):
    __tablename__ = "job_log_chunks"
    job_id: Mapped[str] = mapped_column(String(80), primary_key=True)  # or a replica's gang
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    offset: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    size: Mapped[int] = mapped_column(Integer)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[float] = mapped_column(Float)

"""Where the working-directory archives of submitted jobs are kept until their jobs end.

`FolderWorkdirs` keeps them as files in one folder (one control plane, the unit tests);
`SharedWorkdirs` in the state store (store.jobfiles), so that a job submitted through any
control-plane replica, on any machine, is launched by whichever replica leads. Both give a
ref at `put` that the job records, and the archive back at `get`.

Invariants: an archive is stored completely before `put` returns its ref (the job that
names it is created after), so a launch always finds it; refs of the folder kind keep
being readable by the shared kind (an installation that moved keeps its queued jobs).
"""

from __future__ import annotations

import uuid
from pathlib import Path


class FolderWorkdirs:
    def __init__(self, folder: Path):
        self.folder = Path(folder)

    def put(self, blob: bytes) -> str:
        self.folder.mkdir(parents=True, exist_ok=True)
        ref = f"{uuid.uuid4().hex}.tar.gz"
        tmp = self.folder / f".{ref}.tmp"
        tmp.write_bytes(blob)
        tmp.replace(self.folder / ref)
        return ref

    def get(self, ref: str) -> bytes:
        return (self.folder / ref).read_bytes()

    def collect(self) -> int:
        return 0  # files of ended jobs stay (as they always have with one control plane)


class SharedWorkdirs:
    PREFIX = "db:"

    def __init__(self, files, legacy: Path | None = None):
        self.files = files  # store.jobfiles.JobFiles
        self.legacy = FolderWorkdirs(legacy) if legacy is not None else None

    def put(self, blob: bytes) -> str:
        ref = f"{self.PREFIX}{uuid.uuid4().hex}"
        self.files.put_workdir(ref, blob)
        return ref

    def get(self, ref: str) -> bytes:
        if ref.startswith(self.PREFIX):
            blob = self.files.workdir(ref)
            if blob is None:
                raise FileNotFoundError(f"working directory {ref} is not in the state store")
            return bytes(blob)
        if self.legacy is None:
            raise FileNotFoundError(f"working directory {ref}: no folder of older ones")
        return self.legacy.get(ref)

    def collect(self) -> int:
        """Delete the archives of jobs that ended; how many."""
        return self.files.delete_ended_workdirs()


def as_workdirs(where) -> FolderWorkdirs | SharedWorkdirs:
    """A folder's path, or one of the kinds above as is."""
    return FolderWorkdirs(where) if isinstance(where, (str, Path)) else where

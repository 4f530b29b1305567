"""Writing one artifact version's files into a folder.

Invariants:
- The folder appears under its name only when complete: it is built beside it
  (`.NAME.XXXXXXXX.partial`) and renamed; on any failure nothing is left behind.
- Every file's bytes are checked against its sha256 as they are written, and each
  distinct blob is fetched once (files with the same content are copied locally).
- Paths are the manifest's, checked again (`check_path`), so nothing is written
  outside the folder.
"""

from __future__ import annotations

import hashlib
import shutil
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

from aicluster.artifacts.manifest import Manifest, check_path

Progress = Callable[[int], None]
Fetch = Callable[[str], Iterable[bytes]]


def write_tree(
    manifest: Manifest, dest: Path, fetch: Fetch, progress: Progress | None = None
) -> Path:
    """Download every file of the manifest into a new folder `dest`, atomically.

    `fetch(digest)` streams one blob's bytes; `progress(n)` is told each chunk's size.
    Raises FileExistsError when `dest` exists, ValueError when bytes do not match.
    """
    dest = Path(dest)
    if dest.exists():
        raise FileExistsError(f"{dest} already exists")
    tmp = dest.parent / f".{dest.name}.{uuid.uuid4().hex[:8]}.partial"
    tmp.mkdir(parents=True)
    try:
        first: dict[str, Path] = {}
        for f in manifest.files:
            target = tmp / check_path(f.path)
            target.parent.mkdir(parents=True, exist_ok=True)
            if f.sha256 in first:
                shutil.copyfile(first[f.sha256], target)
                continue
            h = hashlib.sha256()
            with open(target, "wb") as out:
                for chunk in fetch(f.sha256):
                    h.update(chunk)
                    out.write(chunk)
                    if progress:
                        progress(len(chunk))
            if h.hexdigest() != f.sha256:
                raise ValueError(f"{f.path}: downloaded bytes do not match sha256 {f.sha256}")
            first[f.sha256] = target
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest

"""Manifests: the content of one artifact version, and folder scanning.

Invariants:
- A manifest lists regular files only, by relative POSIX path (no leading `/`,
  no `..`, no empty parts), sorted by path, each path once, with its size and
  sha256. Its JSON form is canonical (sorted keys, no spaces), so the same
  version always has the same manifest digest.
- `scan_folder` reads each file once to hash it; symlinks are followed only when
  they point inside the folder, anything else that is not a regular file is skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath

CHUNK = 1 << 20
FORMAT = 1
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


class ManifestError(ValueError):
    """A manifest or file list that breaks the rules above (message names the file)."""


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    team: str
    name: str
    kind: str
    version: int
    files: tuple[FileEntry, ...]
    metadata: dict = field(default_factory=dict)
    producer_job: str | None = None
    created_at: float = 0.0
    created_by: str | None = None

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def digests(self) -> set[str]:
        return {f.sha256 for f in self.files}

    def to_json(self) -> bytes:
        d = asdict(self)
        d["format"] = FORMAT
        d["files"] = [asdict(f) for f in self.files]
        return json.dumps(d, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        try:
            d = json.loads(data)
            files = tuple(FileEntry(**f) for f in d.pop("files"))
            d.pop("format", None)
            return cls(files=check_files(files), **d)
        except (ValueError, TypeError, KeyError) as exc:
            raise ManifestError(f"unreadable manifest: {exc}") from None


def is_digest(value: str) -> bool:
    return len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def check_path(path: str) -> str:
    p = PurePosixPath(path)
    if not path or p.is_absolute() or any(part in ("", ".", "..") for part in path.split("/")):
        raise ManifestError(f"file path {path!r}: must be relative, without '.' or '..' parts")
    return path


def check_files(files) -> tuple[FileEntry, ...]:
    """Validate and sort a file list (paths, sizes, digests; no duplicates)."""
    out, seen = [], set()
    for f in files:
        if not isinstance(f, FileEntry):
            f = FileEntry(**f)
        check_path(f.path)
        if not isinstance(f.size, int) or f.size < 0:
            raise ManifestError(f"file {f.path!r}: size must be a non-negative integer")
        if not is_digest(f.sha256):
            raise ManifestError(f"file {f.path!r}: sha256 must be 64 lowercase hex digits")
        if f.path in seen:
            raise ManifestError(f"file {f.path!r} is listed twice")
        seen.add(f.path)
        out.append(f)
    return tuple(sorted(out, key=lambda f: f.path))


def hash_file(path: Path, progress: Callable[[int], None] | None = None) -> tuple[str, int]:
    h, n = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            n += len(chunk)
            if progress:
                progress(len(chunk))
    return h.hexdigest(), n


def list_folder(root: Path) -> list[tuple[str, Path]]:
    """(relative POSIX path, absolute path) of every file to include, sorted."""
    root = Path(root).resolve()
    if root.is_file():
        return [(root.name, root)]
    if not root.is_dir():
        raise ManifestError(f"{root}: no such file or folder")
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not (here / d).is_symlink())
        for name in filenames:
            p = here / name
            real = p.resolve()
            if p.is_symlink() and root not in real.parents:
                continue
            if real.is_file():
                out.append((p.relative_to(root).as_posix(), p))
    return sorted(out)


def scan_folder(
    root: Path, progress: Callable[[int], None] | None = None
) -> list[tuple[FileEntry, Path]]:
    """Hash every file under root (or root itself when it is a file)."""
    entries = []
    for rel, path in list_folder(root):
        digest, size = hash_file(path, progress)
        entries.append((FileEntry(rel, size, digest), path))
    return entries

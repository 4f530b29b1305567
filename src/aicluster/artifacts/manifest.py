"""Manifests: the content of one artifact version, and folder scanning.

Invariants:
- A manifest lists regular files only, by relative POSIX path (no leading `/`,
  no `..`, no empty parts, no NUL), sorted by path, each path once, with its size
  and sha256. A declared upload is held to stricter rules (`check_files(strict=True)`:
  no control or format characters, length limits, no file that is also a folder,
  a file-count cap). Its JSON form is canonical (sorted keys, no spaces), so the same
  version always has the same manifest digest.
- `scan_folder` reads each file once to hash it; symlinks are followed only when
  they point inside the folder, anything else that is not a regular file is skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
import unicodedata
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from aicluster.artifacts.chunks import CHUNK_SIZE, CHUNKED_ABOVE, blob_sizes, chunk_root, spans

CHUNK = 1 << 20
FORMAT = 1
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


class ManifestError(ValueError):
    """A manifest or file list that breaks the rules above (message names the file)."""


@dataclass(frozen=True)
class FileEntry:
    """One file; `chunks` (artifacts.chunks) when it is stored as chunks, and then
    `sha256` is their chunk root."""

    path: str
    size: int
    sha256: str
    chunks: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        d = {"path": self.path, "size": self.size, "sha256": self.sha256}
        if self.chunks:
            d["chunks"] = list(self.chunks)
        return d


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
        """The blobs this version is stored as (chunks of chunked files)."""
        return set(blob_sizes(self.files))

    def to_json(self) -> bytes:
        d = asdict(self)
        d["format"] = FORMAT
        d["files"] = [f.as_dict() for f in self.files]
        return json.dumps(d, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        try:
            d = json.loads(data)
            files = tuple(_entry(i, f) for i, f in enumerate(d.pop("files")))
            d.pop("format", None)
            return cls(files=check_files(files), **d)
        except (ValueError, TypeError, KeyError) as exc:
            raise ManifestError(f"unreadable manifest: {exc}") from None


def is_digest(value: str) -> bool:
    hexdigits = "0123456789abcdef"
    return isinstance(value, str) and len(value) == 64 and all(c in hexdigits for c in value)


# Upload limits (declared file lists). Reading an existing manifest applies only the
# basic rules, so a version stored before a limit existed stays readable.
MAX_FILES = 100_000
MAX_PATH_CHARS = 1024
MAX_PART_BYTES = 255  # what common filesystems allow for one name
MAX_SIZE = 2**63 - 1  # SQL BIGINT
# control, format (bidi overrides, zero-width), surrogate and line/paragraph separators
_REFUSED_CATEGORIES = {"Cc", "Cf", "Cs", "Zl", "Zp"}


def shown(path: str, limit: int = 80) -> str:
    """`path` quoted for a message: escaped (repr) and cut to `limit` characters."""
    text = path if len(path) <= limit else path[:limit] + "..."
    return repr(text)


def check_path(path: str, strict: bool = False) -> str:
    """A relative POSIX path without empty, `.` or `..` parts (and without NUL).

    `strict` (declared uploads) also refuses control and format characters, paths
    over MAX_PATH_CHARS characters and parts over MAX_PART_BYTES bytes (UTF-8)."""
    if not isinstance(path, str):
        raise ManifestError(f"file path {path!r}: must be a string")
    if not path or path.startswith("/") or any(part in ("", ".", "..") for part in path.split("/")):
        raise ManifestError(f"file path {shown(path)}: must be relative, without '.' or '..' parts")
    if "\0" in path:
        raise ManifestError(f"file path {shown(path)}: contains a NUL character")
    if not strict:
        return path
    if len(path) > MAX_PATH_CHARS:
        raise ManifestError(
            f"file path {shown(path)}: {len(path)} characters, at most {MAX_PATH_CHARS}"
        )
    for ch in path:
        if unicodedata.category(ch) in _REFUSED_CATEGORIES:
            raise ManifestError(
                f"file path {shown(path)}: contains the control or format character U+{ord(ch):04X}"
            )
    for part in path.split("/"):
        if len(part.encode()) > MAX_PART_BYTES:
            raise ManifestError(
                f"file path {shown(path)}: the name {shown(part, 40)} is over "
                f"{MAX_PART_BYTES} bytes"
            )
    return path


def _entry(i: int, f) -> FileEntry:
    if isinstance(f, FileEntry):
        return f
    if not isinstance(f, dict) or not (
        {"path", "size", "sha256"} <= set(f) <= {"path", "size", "sha256", "chunks"}
    ):
        raise ManifestError(
            f"files[{i}]: expected an object with path, size and sha256 (and optional chunks)"
        )
    chunks = f.get("chunks") or ()
    if not isinstance(chunks, list | tuple):
        raise ManifestError(f"files[{i}]: chunks must be a list of sha256")
    return FileEntry(f["path"], f["size"], f["sha256"], tuple(chunks))


def _check_chunks(i: int, f: FileEntry, name: str) -> None:
    """A chunked file: one digest per CHUNK_SIZE slice, and its sha256 their root."""
    if not f.chunks:
        return
    if f.size <= CHUNKED_ABOVE:
        raise ManifestError(f"files[{i}] {name}: only files over {CHUNKED_ABOVE} bytes are chunked")
    want = len(spans(f.size))
    if len(f.chunks) != want:
        raise ManifestError(
            f"files[{i}] {name}: {len(f.chunks)} chunks, but {f.size} bytes make {want} "
            f"chunks of {CHUNK_SIZE}"
        )
    for j, c in enumerate(f.chunks):
        if not is_digest(c):
            raise ManifestError(f"files[{i}] {name}: chunks[{j}] must be 64 lowercase hex digits")
    if chunk_root(f.chunks) != f.sha256:
        raise ManifestError(f"files[{i}] {name}: sha256 is not the chunk root of its chunks")


def check_files(files, strict: bool = False) -> tuple[FileEntry, ...]:
    """Validate and sort a file list (paths, sizes, digests; no duplicates).

    `strict` (a declared upload) adds the limits: the path rules of check_path, at
    most MAX_FILES files, no file that is also a folder of another (`a` and `a/b`),
    one size per sha256, sizes and their total at most MAX_SIZE."""
    out, seen, sizes = [], {}, {}
    for i, f in enumerate(files):
        if strict and i >= MAX_FILES:
            raise ManifestError(f"files: more than {MAX_FILES} files in one upload")
        f = _entry(i, f)
        try:
            check_path(f.path, strict)
        except ManifestError as exc:
            raise ManifestError(f"files[{i}]: {exc}") from None
        name = shown(f.path)
        if isinstance(f.size, bool) or not isinstance(f.size, int) or f.size < 0:
            raise ManifestError(f"files[{i}] {name}: size must be a non-negative integer")
        if strict and f.size > MAX_SIZE:
            raise ManifestError(f"files[{i}] {name}: size {f.size} is over {MAX_SIZE}")
        if not is_digest(f.sha256):
            raise ManifestError(f"files[{i}] {name}: sha256 must be 64 lowercase hex digits")
        _check_chunks(i, f, name)
        if f.path in seen:
            raise ManifestError(f"files[{i}]: file {name} is listed twice")
        if strict:
            for digest, size in blob_sizes([f]).items():
                other = sizes.setdefault(digest, (size, f.path))
                if other[0] != size:
                    raise ManifestError(
                        f"files[{i}] {name}: size {size} differs from the size {other[0]} "
                        f"declared for the same sha256 {digest} by {shown(other[1])}"
                    )
        seen[f.path] = i
        out.append(f)
    if strict:
        for f in out:
            parts = f.path.split("/")
            for n in range(1, len(parts)):
                folder = "/".join(parts[:n])
                if folder in seen:
                    raise ManifestError(
                        f"files[{seen[f.path]}]: file path {shown(f.path)} needs a folder "
                        f"{shown(folder)}, which is also declared as a file (files[{seen[folder]}])"
                    )
        if sum(f.size for f in out) > MAX_SIZE:
            raise ManifestError(f"files: the total size is over {MAX_SIZE} bytes")
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

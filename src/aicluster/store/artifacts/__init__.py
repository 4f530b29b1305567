"""Artifacts: versioned, content-addressed datasets, checkpoints and models.

Vocabulary: a *blob* is file content stored under its sha256; a *manifest* lists
one version's files (path, size, sha256) with its metadata and producer job; the
*index* (SQL) maps `team/name:version` and tags to manifests. See repository.py
for the upload protocol and its invariants.
"""

from aicluster.store.artifacts.backend import (
    BlobBackend,
    BlobCorrupt,
    BlobSizeMismatch,
    StorageConfig,
    StorageError,
    load_storage_config,
    open_backend,
)  # fmt: skip
from aicluster.store.artifacts.index import ArtifactIndex, ArtifactRecord, VersionRecord
from aicluster.store.artifacts.manifest import (
    FileEntry,
    Manifest,
    ManifestError,
    scan_folder,
)
from aicluster.store.artifacts.names import KINDS, ArtifactRef, RefError, parse_ref
from aicluster.store.artifacts.repository import ArtifactStore, MissingBlobs, write_tree

__all__ = [
    "KINDS", "ArtifactIndex", "ArtifactRecord", "ArtifactRef", "ArtifactStore", "BlobBackend",
    "BlobCorrupt", "BlobSizeMismatch", "FileEntry", "Manifest", "ManifestError", "MissingBlobs", "RefError",
    "StorageConfig", "StorageError", "VersionRecord", "load_storage_config", "open_backend",
    "parse_ref", "scan_folder", "write_tree",
]  # fmt: skip

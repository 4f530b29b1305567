"""Artifact storage: the SQL index, the upload protocol and the blob backends.

Vocabulary (the format itself, names and manifests, is `aicluster.artifacts`):
a *blob* is file content stored under its sha256; the *index* (SQL) maps
`team/name:version` and tags to manifests; a *backend* holds blobs and manifests
(a local folder or fsspec object storage). See repository.py for the upload
protocol and its invariants.
"""

from aicluster.store.artifacts.backend import (
    BlobBackend,
    BlobCorrupt,
    BlobSizeMismatch,
    StorageConfig,
    StorageError,
    load_storage_config,
    open_backend,
)
from aicluster.store.artifacts.index import ArtifactIndex, ArtifactRecord, VersionRecord
from aicluster.store.artifacts.repository import ArtifactStore, MissingBlobs

__all__ = [
    "ArtifactIndex",
    "ArtifactRecord",
    "ArtifactStore",
    "BlobBackend",
    "BlobCorrupt",
    "BlobSizeMismatch",
    "MissingBlobs",
    "StorageConfig",
    "StorageError",
    "VersionRecord",
    "load_storage_config",
    "open_backend",
]

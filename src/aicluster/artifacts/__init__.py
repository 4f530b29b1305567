"""The artifact format: names, manifests and folder trees. No SQL, no HTTP.

Vocabulary: a *ref* (`team/name:version` or `team/name:tag`) names an artifact
and optionally one version of it; a *blob* is file content known by its sha256;
a *manifest* lists one version's files (path, size, sha256) with its metadata and
producer job. The store (`aicluster.store.artifacts`: the SQL index, the upload
protocol, storage backends), the client SDK (`aicluster.client`) and the node
runtime (`aicluster.runtime`) all build on these modules.
"""

from aicluster.artifacts.manifest import FileEntry, Manifest, ManifestError, scan_folder
from aicluster.artifacts.names import KINDS, ArtifactRef, RefError, parse_ref
from aicluster.artifacts.tree import write_tree

__all__ = [
    "KINDS",
    "ArtifactRef",
    "FileEntry",
    "Manifest",
    "ManifestError",
    "RefError",
    "parse_ref",
    "scan_folder",
    "write_tree",
]

"""Artifact calls of the Python client: functions that take a `Client`.

Bytes go between this process and the storage itself where the API grants it and
this machine can reach it (the direct data path, `client.transfer`), else through
the API's blob routes; names, manifests and the verified folder writing are the
artifact format's (`aicluster.artifacts`).

Invariants:
- `push` hashes every file locally, uploads only the blobs the server lacks
  (so pushing again after an interrupted push resumes it) and makes the version
  visible with one commit; a file that changes size while it is pushed fails the
  push. A same-size change between hashing and upload is refused at push through the
  API's blob routes, by S3's signed checksum and under `verify: read`; on a local
  folder's direct path without `verify: read` the publish checks sizes only, so it is
  found on read (every read hashes) and by `scrub`, not at push.
- `pull` checks every downloaded file against its sha256 and creates DEST only
  when complete; with a `BlobCache` it materialises a read-only folder of links
  into the cache and downloads only blobs the cache lacks.
- Failures raise ApiError (as the rest of the SDK) with a one-line message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from aicluster.artifacts.chunks import blob_sizes
from aicluster.artifacts.manifest import FileEntry, Manifest, ManifestError
from aicluster.artifacts.names import ArtifactRef, RefError, parse_ref
from aicluster.artifacts.tree import write_tree
from aicluster.client import transfer
from aicluster.client.api import ApiError, Client

Progress = Callable[[int], None]
CHUNK = 1 << 20
TRANSFER_TIMEOUT = httpx.Timeout(300.0, connect=10.0)


def resolve_ref(client: Client, name: str) -> ArtifactRef:
    """Parse `[team/]name[:version|tag]`; the team defaults to the caller's (whoami)."""
    try:
        if "/" in name.partition(":")[0]:
            return parse_ref(name)
        return parse_ref(name, default_team=client.whoami().get("team"))
    except RefError as exc:
        raise ApiError(400, str(exc)) from None


def _base(ref: ArtifactRef) -> str:
    return f"/v1/artifacts/{quote(ref.team)}/{quote(ref.name)}"


# --- push -----------------------------------------------------------------------------


def push(
    client: Client,
    path: str | Path,
    name: str,
    kind: str = "model",
    *,
    metadata: dict | None = None,
    producer_job: str | None = None,
    progress: Progress | None = None,
    hashing: Progress | None = None,
    on_plan: Callable[[int, int], None] | None = None,
    direct: bool = True,
) -> dict:
    """Upload a folder (or one file) as a new version of `name`; returns the version.

    `hashing(n)` and `progress(n)` receive byte counts while hashing and uploading;
    `on_plan(blobs, bytes)` is told how much will be uploaded once that is known.
    `direct`: stage the blobs in the storage itself where the API's grant lets this
    machine (client.transfer); otherwise, or when it cannot, send them to the API.
    """
    try:
        scanned = transfer.scan(Path(path), hashing)
    except (ManifestError, OSError) as exc:
        raise ApiError(400, f"PATH: {exc}") from None
    where = transfer.places(scanned)
    body = {
        "name": name,
        "kind": kind,
        "files": [e.as_dict() for e, _ in scanned],
        "metadata": metadata or {},
        "producer_job": producer_job,
    }
    if direct:
        body["direct"] = True
    up = client.request_json("POST", "/v1/artifacts/uploads", json=body)
    missing, grant = up["missing"], up.get("grant")
    if on_plan:
        on_plan(len(missing), sum(where[d][2] for d in missing))
    for _ in range(3):
        grant = _send(client, up["upload_id"], missing, where, grant, progress)
        try:
            return client.request_json("POST", f"/v1/artifacts/uploads/{up['upload_id']}/commit")
        except ApiError as exc:
            again = exc.detail.get("missing") if isinstance(exc.detail, dict) else None
            if exc.status_code != 409 or not again:
                raise
            missing = again  # collected meanwhile: send them again
            if grant is not None:
                grant = client.request_json(
                    "POST",
                    f"/v1/artifacts/uploads/{up['upload_id']}/grant",
                    json={"digests": missing},
                )["grant"]
    raise ApiError(409, f"could not commit {name}: blobs keep disappearing")


def _send(client: Client, upload_id: str, missing, where, grant, progress) -> dict | None:
    """Send the missing blobs: staged directly under `grant` and published, or (no
    grant, or one this machine cannot use) through the API. Returns the grant still
    worth using."""
    if grant is not None and missing:
        try:
            transfer.stage(grant, {d: where[d] for d in missing}, progress)
        except transfer.GrantUnusable:
            grant = None
        else:
            res = client.request_json(
                "POST", f"/v1/artifacts/uploads/{upload_id}/publish", json={"digests": missing}
            )
            missing = sorted(res["refused"])  # e.g. a file that changed size: the API says
    if grant is None or missing:
        for digest in missing:
            put_blob(client, upload_id, digest, where[digest], progress)
    return grant


def put_blob(
    client: Client,
    upload_id: str,
    digest: str,
    place: Path | transfer.Place,
    progress: Progress | None = None,
) -> dict:
    """Send one blob through the API: a whole file, or (file, offset, length)."""
    if not isinstance(place, tuple):
        place = (Path(place), 0, Path(place).stat().st_size)
    return client.request_json(
        "PUT",
        f"/v1/artifacts/uploads/{upload_id}/blobs/{digest}",
        content=transfer.read_place(place, progress),
        headers={"Content-Length": str(place[2]), "Content-Type": "application/octet-stream"},
        timeout=TRANSFER_TIMEOUT,
    )


# --- pull -----------------------------------------------------------------------------


def manifest_of(version: dict) -> Manifest:
    files = tuple(
        FileEntry(f["path"], f["size"], f["sha256"], tuple(f.get("chunks") or ()))
        for f in version["files"]
    )
    return Manifest(
        version["team"],
        version["name"],
        version["kind"],
        version["version"],
        files,
        version.get("metadata") or {},
        version.get("producer_job"),
        version.get("created_at") or 0.0,
        version.get("created_by"),
    )


def blob_fetcher(client: Client, version: dict) -> Callable[[str], Iterator[bytes]]:
    """digest -> streamed bytes of one file of this version, through the API."""
    base = f"/v1/artifacts/{quote(version['team'])}/{quote(version['name'])}"
    prefix = f"{base}/versions/{version['version']}/blobs/"

    def fetch(digest: str) -> Iterator[bytes]:
        try:
            with client.stream("GET", prefix + digest, timeout=TRANSFER_TIMEOUT) as resp:
                yield from resp.iter_bytes(CHUNK)
        except ApiError as exc:
            if exc.status_code:
                raise
            raise ApiError(0, f"download of blob {digest[:12]} failed: {exc}") from None

    return fetch


def pull(
    client: Client,
    name: str,
    dest: str | Path,
    *,
    cache=None,
    progress: Progress | None = None,
    on_plan: Callable[[int, int], None] | None = None,
    direct: bool = True,
) -> tuple[dict, Path]:
    """Download a version into the new folder `dest`; returns (version, path).

    With `cache` (a runtime.cache.BlobCache), `dest` is a read-only folder of links
    into the cache and only blobs missing from the cache are downloaded. `direct`:
    read the blobs from the storage itself where the API's grant lets this machine.
    """
    v = version(client, name)
    manifest = manifest_of(v)
    dest = Path(dest)
    sizes = blob_sizes(manifest.files) if cache is None else cache.wanted(manifest)
    if on_plan:
        on_plan(len(sizes), sum(sizes.values()))
    with ExitStack() as stack:
        fetch = blob_fetcher(client, v)
        grant = read_grant(client, v, sorted(sizes)) if direct and sizes else None
        if grant is not None:
            http = stack.enter_context(transfer.storage_http()) if grant["kind"] == "s3" else None
            fetch = transfer.fetcher(grant, fetch, http)
        try:
            if cache is not None:
                return v, cache.materialise(manifest, dest, fetch, progress).path
            return v, write_tree(manifest, dest, fetch, progress)
        except FileExistsError as exc:
            raise ApiError(400, f"DEST: {exc}") from None
        except ValueError as exc:  # hash mismatch
            raise ApiError(502, f"{name}: {exc}") from None


def read_grant(client: Client, version: dict, digests: list[str]) -> dict | None:
    """Where this version's blobs may be read directly (None: through the API)."""
    base = f"/v1/artifacts/{quote(version['team'])}/{quote(version['name'])}"
    try:
        return client.request_json(
            "POST", f"{base}/versions/{version['version']}/grant", json={"digests": digests}
        )["grant"]
    except ApiError as exc:
        if exc.status_code in (404, 405):  # an API without the direct data path
            return None
        raise


# --- the rest -------------------------------------------------------------------------


def list_artifacts(
    client: Client, team: str | None = None, limit: int | None = None, every: bool = True
) -> list[dict]:
    """Every artifact you can read (each page), or one page of `limit` without `every`."""
    params = {"team": team} if team else {}
    return client.listing("/v1/artifacts", "artifacts", params, limit, every)


def describe(client: Client, name: str) -> dict:
    """The artifact with every version; with `:VERSION` only that version and its files."""
    ref = resolve_ref(client, name)
    if ref.selector is None:
        return client.request_json("GET", _base(ref))
    return version(client, name)


def version(client: Client, name: str) -> dict:
    ref = resolve_ref(client, name)
    sel = quote(ref.selector or "latest")
    return client.request_json("GET", f"{_base(ref)}/versions/{sel}")


def tag(client: Client, name: str, tag_name: str) -> dict:
    ref = resolve_ref(client, name)
    return client.request_json(
        "PUT", f"{_base(ref)}/tags/{quote(tag_name)}", json={"version": ref.selector}
    )


def untag(client: Client, name: str, tag_name: str) -> None:
    ref = resolve_ref(client, name)
    client.request("DELETE", f"{_base(ref)}/tags/{quote(tag_name)}")


def delete(client: Client, name: str) -> dict:
    ref = resolve_ref(client, name)
    if ref.selector is None:
        raise ApiError(400, f"{ref}: name the version to delete (NAME:VERSION or NAME:TAG)")
    return client.request_json("DELETE", f"{_base(ref)}/versions/{quote(ref.selector)}")


def prune(client: Client, name: str, keep_last: int, keep_every: int = 0) -> dict:
    """Keep the `keep_last` newest versions and every `keep_every`-th (and tagged ones);
    delete the rest. Returns {"deleted": [versions], "gc": {...}}."""
    ref = resolve_ref(client, name)
    return client.request_json(
        "POST",
        f"{_base(ref)}/prune",
        json={"keep_last": keep_last, "keep_every": keep_every},
    )


def usage(client: Client, team: str | None = None) -> dict[str, dict]:
    """team -> {"bytes", "blobs", "versions", "quota_bytes"} of artifact storage (yours;
    admins: all); `quota_bytes` None: no storage quota."""
    params = {"team": team} if team else {}
    return client.request_json("GET", "/v1/artifacts/usage", params=params)["teams"]


def storage_quota(client: Client, team: str) -> dict:
    """The team's storage quota (`quota_bytes`, None: none) next to its `used_bytes`."""
    return client.request_json("GET", f"/v1/teams/{quote(team, safe='')}/storage-quota")


def set_storage_quota(client: Client, team: str, nbytes: int | None) -> dict:
    """Admins: set the team's storage quota in bytes; None removes it."""
    path = f"/v1/teams/{quote(team, safe='')}/storage-quota"
    if nbytes is None:
        return client.request_json("DELETE", path)
    return client.request_json("PUT", path, json={"bytes": nbytes})


def scrub(client: Client, repair: bool = False) -> dict:
    """Admins: re-hash every stored blob; `corrupt` lists those that do not match."""
    return client.request_json("POST", "/v1/artifacts/scrub", json={"repair": repair})


def share(client: Client, name: str, team: str, shared: bool = True) -> dict:
    ref = resolve_ref(client, name)
    return client.request_json("PUT" if shared else "DELETE", f"{_base(ref)}/shares/{quote(team)}")


def gc(client: Client) -> dict[str, Any]:
    return client.request_json("POST", "/v1/artifacts/gc")

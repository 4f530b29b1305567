"""Artifact routes: thin wrappers over control.artifacts.ArtifactService.

Upload protocol: POST /v1/artifacts/uploads (declare files; answers the missing
digests) -> PUT .../uploads/{id}/blobs/{sha256} for each missing one (streamed;
the server hashes as it writes and publishes the blob only if it matches) ->
POST .../uploads/{id}/commit (409 with `missing` when storage still lacks blobs).
Downloads stream through GET .../versions/{version}/blobs/{sha256}; the server
hashes the blob before it sends a byte (a corrupt one answers 409) and the client
checks each file's hash too.

The direct data path (store.artifacts.direct) carries no blob bytes here: with
`direct: true` the upload answer holds a `grant` (a staging folder, or presigned
PUT URLs) and the client stages the missing blobs itself, then POST .../publish;
POST .../versions/{version}/grant answers blob paths or presigned GET URLs. The
byte routes above stay for callers that cannot reach the storage (a sandboxed job).

Errors: every route answers `{"detail": {"message": ...}}` (ErrorBody) with the
statuses its OpenAPI entry lists; the message names the field, path or file at
fault. An upload that would take its team past its storage quota (store.artifacts.
quotas) answers 413 with `field: quota`, the team, `quota_bytes`, `used_bytes` and
`requested_bytes`, when it is declared (nothing stored) or at commit (the upload is
discarded). Request validation errors of these routes take that shape too (422, with
`issues`), and storage trouble answers 409 (a corrupt or missing stored blob) or
503 (storage unreachable), never 500.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict

from fastapi import APIRouter, Depends, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, StrictInt
from starlette.concurrency import run_in_threadpool

from aicluster.api.errors import ErrorBody
from aicluster.api.paging import CURSOR, LIMIT, page_body
from aicluster.artifacts.chunks import CHUNK_SIZE
from aicluster.artifacts.manifest import MAX_FILES, MAX_SIZE, ManifestError
from aicluster.artifacts.names import RefError
from aicluster.control.api_ops import BadRequest
from aicluster.control.artifacts import MAX_JOB_ID, ArtifactService
from aicluster.store.artifacts import (
    ArtifactRecord,
    BlobCorrupt,
    MissingBlobs,
    StorageError,
    VersionRecord,
)
from aicluster.store.artifacts.quotas import StorageQuotaExceeded
from aicluster.store.cursors import decode, page_of

WRITE_BATCH = 4 << 20


class FileBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str
    size: StrictInt = Field(ge=0, le=MAX_SIZE)
    sha256: str = Field(description="of the bytes; of a chunked file: its chunk root")
    chunks: list[str] | None = Field(
        default=None,
        max_length=MAX_SIZE // CHUNK_SIZE + 1,
        description="sha256 of each CHUNK_SIZE slice (files over CHUNKED_ABOVE bytes)",
    )


class UploadBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="[team/]name[:version|:tag]")
    kind: str = "model"
    files: list[FileBody] = Field(max_length=MAX_FILES)
    metadata: dict = Field(default_factory=dict)
    producer_job: str | None = Field(
        default=None, max_length=MAX_JOB_ID, description="a job of the artifact's team"
    )
    direct: bool = Field(
        default=False,
        description="answer a `grant` too: where to stage the missing blobs directly "
        "(then POST .../publish instead of PUT .../blobs)",
    )


class DigestsBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    digests: list[str] = Field(max_length=MAX_FILES, description="sha256 of blobs")


class ReadGrantBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    digests: list[str] | None = Field(
        default=None, max_length=MAX_FILES, description="blobs of the version (default: all)"
    )


class PruneBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    keep_last: StrictInt = Field(ge=1, le=1_000_000, description="keep the N newest versions")
    keep_every: StrictInt = Field(
        default=0, ge=0, le=1_000_000, description="and every version numbered a multiple of K"
    )


class ScrubBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    repair: bool = Field(default=False, description="delete the corrupt blobs found")


_WHY = {
    400: "Invalid name, version, tag, file list, metadata or producer_job",
    401: "Missing or invalid API token",
    403: "Not allowed (another team's artifact, or a viewer)",
    404: "No such artifact, version, tag, upload or blob (or not readable by the caller)",
    409: "Conflict: version taken, blobs missing (commit: `missing` lists them), or a stored "
    "blob is corrupt or gone",
    413: "Request body too large, or the upload would take its team past its storage quota "
    "(`field` quota; `quota_bytes`, `used_bytes`, `requested_bytes`)",
    422: "Request body or parameters of the wrong type",
    503: "Artifact storage unreachable or misconfigured",
}


def errors(*codes: int, params: bool = True) -> dict:
    """OpenAPI `responses` for these error statuses: 401 always (every route needs a
    token), 422 where the route has parameters (FastAPI would declare its own shape)."""
    codes = {401, *codes} | ({422} if params else set())
    return {c: {"model": ErrorBody, "description": _WHY[c]} for c in sorted(codes)}


def _error(status: int, message: str, **extra) -> JSONResponse:
    return JSONResponse({"detail": {"message": message, **extra}}, status_code=status)


def _text(value) -> str:
    """Printable and encodable: a client's key may hold lone surrogates or control bytes."""
    text = str(value)
    return text if text.isprintable() else repr(text)[1:-1]


def _field(loc) -> str:
    parts = [_text(p)[:80] for p in loc]
    if parts and parts[0] in ("body", "path", "query", "header"):
        parts = parts[1:] or parts
    return ".".join(parts)


def _validation_error(exc: RequestValidationError) -> JSONResponse:
    issues = [
        {"field": _field(e.get("loc", ())), "message": _text(e.get("msg", ""))}
        for e in exc.errors()[:20]
    ]
    message = "; ".join(f"{i['field']}: {i['message']}" for i in issues[:3]) or "invalid request"
    return _error(422, message, field=issues[0]["field"] if issues else None, issues=issues)


class ArtifactRoute(APIRoute):
    """Maps the artifact layer's errors to 4xx/503 answers of the ErrorBody shape."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as exc:
                return _validation_error(exc)
            except BlobCorrupt as exc:
                return _error(409, f"artifact storage: {exc}")
            except FileNotFoundError as exc:  # a stored blob or manifest is gone
                return _error(409, f"artifact storage: {exc}")
            except (ManifestError, RefError) as exc:
                return _error(400, str(exc))
            except StorageError as exc:
                return _error(503, f"artifact storage: {exc}")
            except StorageQuotaExceeded as exc:
                return _error(413, str(exc), **exc.detail())

        return handle


class TagBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: str | None = Field(default=None, description="version or tag; default latest")


def version_json(v: VersionRecord, manifest=None) -> dict:
    d = asdict(v)
    d["ref"] = f"{v.team}/{v.name}:{v.version}"
    d["tags"] = list(v.tags)
    if manifest is not None:
        d["files"] = [f.as_dict() for f in manifest.files]
    return d


def artifact_json(a: ArtifactRecord, versions: list[VersionRecord] | None = None) -> dict:
    d = asdict(a)
    d["latest"] = a.latest
    d["versions"] = list(a.versions)
    d["shared_with"] = list(a.shared_with)
    if versions is not None:
        d["versions"] = [version_json(v) for v in versions]
    return d


def artifact_router(svc: ArtifactService, principal) -> APIRouter:
    r = APIRouter(tags=["artifacts"], route_class=ArtifactRoute)

    @r.post(
        "/v1/artifacts/uploads",
        status_code=201,
        responses=errors(400, 403, 404, 409, 413, 422, 503),
    )
    def begin(body: UploadBody, who=Depends(principal)):
        files = [f.model_dump(exclude_none=True) for f in body.files]
        up, missing = svc.begin_upload(
            who, body.name, body.kind, files, body.metadata, body.producer_job
        )
        out = {"upload_id": up.id, "team": up.team, "name": up.name, "missing": missing}
        if body.direct:
            out["grant"] = svc.upload_grant(who, up.id, missing)
        return out

    @r.post("/v1/artifacts/uploads/{upload_id}/grant", responses=errors(400, 404, 413, 503))
    def upload_grant(upload_id: str, body: DigestsBody, who=Depends(principal)):
        """Where to stage these declared blobs directly (`grant` null: PUT them here)."""
        return {"upload_id": upload_id, "grant": svc.upload_grant(who, upload_id, body.digests)}

    @r.post("/v1/artifacts/uploads/{upload_id}/publish", responses=errors(400, 404, 413, 503))
    def publish(upload_id: str, body: DigestsBody, who=Depends(principal)):
        """Publish blobs staged under the upload's grant; `refused` says why others were not."""
        done, refused = svc.publish(who, upload_id, body.digests)
        return {"upload_id": upload_id, "published": done, "refused": refused}

    @r.get("/v1/artifacts/uploads/{upload_id}", responses=errors(404, 503))
    def missing(upload_id: str, who=Depends(principal)):
        return {"upload_id": upload_id, "missing": svc.missing(who, upload_id)}

    @r.put("/v1/artifacts/uploads/{upload_id}/blobs/{digest}", responses=errors(400, 404, 503))
    async def put_blob(upload_id: str, digest: str, request: Request, who=Depends(principal)):
        writer = await run_in_threadpool(svc.blob_writer, who, upload_id, digest)
        buf = bytearray()
        try:
            async for chunk in request.stream():
                buf += chunk
                if len(buf) >= WRITE_BATCH:
                    await run_in_threadpool(writer.write, bytes(buf))
                    buf.clear()
            if buf:
                await run_in_threadpool(writer.write, bytes(buf))
            size = await run_in_threadpool(writer.commit)
        except BlobCorrupt as exc:  # commit already discarded the bytes
            raise BadRequest(f"blob {digest}: {exc}") from None
        except BaseException:
            await run_in_threadpool(writer.abort)
            raise
        return {"sha256": digest, "size": size}

    @r.post(
        "/v1/artifacts/uploads/{upload_id}/commit",
        status_code=201,
        responses=errors(400, 404, 409, 413, 503),
    )
    def commit(upload_id: str, who=Depends(principal)):
        try:
            return version_json(svc.commit(who, upload_id))
        except MissingBlobs as exc:
            detail = {"message": str(exc), "missing": exc.digests}
            return JSONResponse({"detail": detail}, status_code=409)

    @r.delete("/v1/artifacts/uploads/{upload_id}", status_code=204, responses=errors(404))
    def abort(upload_id: str, who=Depends(principal)):
        svc.abort(who, upload_id)
        return Response(status_code=204)

    @r.get("/v1/artifacts", responses=errors(400, 422))
    def list_artifacts(
        team: str | None = None,
        limit: int = LIMIT,
        cursor: str | None = CURSOR,
        who=Depends(principal),
    ):
        """Artifacts by (team, name), a page at a time (api.paging)."""
        after = decode(cursor, "artifacts", str, str)
        rows = svc.list_artifacts(who, team, limit + 1, after)
        page, more = page_of(rows, limit, "artifacts", lambda a: (a.team, a.name))
        return page_body("artifacts", [artifact_json(a) for a in page], more)

    @r.post("/v1/artifacts/gc", responses=errors(403, 409, 503, params=False))
    def gc(who=Depends(principal)):
        return asdict(svc.gc(who))

    @r.get("/v1/artifacts/usage", responses=errors(400, 409, 503))
    def usage(team: str | None = None, who=Depends(principal)):
        """Bytes of storage each team's versions use (distinct blobs; admins: every team)
        and its storage quota, `quota_bytes` (null: none)."""
        return {"teams": svc.usage(who, team)}

    @r.post("/v1/artifacts/scrub", responses=errors(400, 403, 413, 503))
    def scrub(body: ScrubBody | None = None, who=Depends(principal)):
        """Admins: re-hash every stored blob; `corrupt` lists those that do not match."""
        report = svc.scrub(who, body.repair if body else False)
        return asdict(report) | {"corrupt": list(report.corrupt)}

    @r.get("/v1/artifacts/{team}/{name}", responses=errors(400, 404))
    def describe(team: str, name: str, who=Depends(principal)):
        art, versions = svc.get(who, f"{team}/{name}")
        return artifact_json(art, versions)

    @r.get("/v1/artifacts/{team}/{name}/versions/{selector}", responses=errors(400, 404, 409, 503))
    def describe_version(team: str, name: str, selector: str, who=Depends(principal)):
        v, manifest = svc.version(who, f"{team}/{name}:{selector}")
        return version_json(v, manifest)

    @r.get(
        "/v1/artifacts/{team}/{name}/versions/{selector}/blobs/{digest}",
        responses=errors(400, 404, 409, 503),
    )
    def get_blob(team: str, name: str, selector: str, digest: str, who=Depends(principal)):
        size, chunks = svc.blob(who, f"{team}/{name}:{selector}", digest)
        headers = {"Content-Length": str(size), "X-Sha256": digest}
        return StreamingResponse(chunks, media_type="application/octet-stream", headers=headers)

    @r.post(
        "/v1/artifacts/{team}/{name}/versions/{selector}/grant",
        responses=errors(400, 404, 409, 413, 503),
    )
    def read_grant(
        team: str, name: str, selector: str, body: ReadGrantBody, who=Depends(principal)
    ):
        """Where to fetch the version's blobs directly (`grant` null: GET them here)."""
        v, grant = svc.read_grant(who, f"{team}/{name}:{selector}", body.digests)
        return {"ref": f"{v.team}/{v.name}:{v.version}", "grant": grant}

    @r.delete(
        "/v1/artifacts/{team}/{name}/versions/{selector}", responses=errors(400, 403, 404, 409, 503)
    )
    def delete_version(team: str, name: str, selector: str, who=Depends(principal)):
        return version_json(svc.delete(who, f"{team}/{name}:{selector}"))

    @r.put("/v1/artifacts/{team}/{name}/tags/{tag}", responses=errors(400, 403, 404, 413, 422))
    def tag(team: str, name: str, tag: str, body: TagBody, who=Depends(principal)):
        sel = f":{body.version}" if body.version else ""
        return version_json(svc.tag(who, f"{team}/{name}{sel}", tag))

    @r.delete(
        "/v1/artifacts/{team}/{name}/tags/{tag}", status_code=204, responses=errors(400, 403, 404)
    )
    def untag(team: str, name: str, tag: str, who=Depends(principal)):
        svc.untag(who, f"{team}/{name}", tag)
        return Response(status_code=204)

    @r.post("/v1/artifacts/{team}/{name}/prune", responses=errors(400, 403, 404, 409, 413, 503))
    def prune(team: str, name: str, body: PruneBody, who=Depends(principal)):
        """Delete the versions a retention policy does not keep (tagged ones stay), then
        collect the blobs no remaining version names."""
        gone, report = svc.prune(who, f"{team}/{name}", body.keep_last, body.keep_every)
        return {"deleted": gone, "gc": asdict(report)}

    @r.put("/v1/artifacts/{team}/{name}/shares/{other}", responses=errors(400, 403, 404))
    def share(team: str, name: str, other: str, who=Depends(principal)):
        return artifact_json(svc.share(who, f"{team}/{name}", [other], True))

    @r.delete("/v1/artifacts/{team}/{name}/shares/{other}", responses=errors(400, 403, 404))
    def unshare(team: str, name: str, other: str, who=Depends(principal)):
        return artifact_json(svc.share(who, f"{team}/{name}", [other], False))

    return r

"""Artifact routes: thin wrappers over control.artifacts.ArtifactService.

Upload protocol: POST /v1/artifacts/uploads (declare files; answers the missing
digests) -> PUT .../uploads/{id}/blobs/{sha256} for each missing one (streamed;
the server hashes as it writes and publishes the blob only if it matches) ->
POST .../uploads/{id}/commit (409 with `missing` when storage still lacks blobs).
Downloads stream through GET .../versions/{version}/blobs/{sha256}; the client
checks each file's hash too.
"""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from aicluster.control.artifacts import ArtifactService
from aicluster.control.service import BadRequest
from aicluster.store.artifacts import (
    ArtifactRecord,
    BlobCorrupt,
    StorageError,
    VersionRecord,
)
from aicluster.store.artifacts.repository import MissingBlobs

WRITE_BATCH = 4 << 20


class FileBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str
    size: int = Field(ge=0)
    sha256: str


class UploadBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="[team/]name[:version|:tag]")
    kind: str = "model"
    files: list[FileBody]
    metadata: dict = Field(default_factory=dict)
    producer_job: str | None = None


class TagBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: str | None = Field(default=None, description="version or tag; default latest")


def version_json(v: VersionRecord, manifest=None) -> dict:
    d = asdict(v)
    d["ref"] = f"{v.team}/{v.name}:{v.version}"
    d["tags"] = list(v.tags)
    if manifest is not None:
        d["files"] = [asdict(f) for f in manifest.files]
    return d


def artifact_json(a: ArtifactRecord, versions: list[VersionRecord] | None = None) -> dict:
    d = asdict(a)
    d["latest"] = a.latest
    d["versions"] = list(a.versions)
    d["shared_with"] = list(a.shared_with)
    if versions is not None:
        d["versions"] = [version_json(v) for v in versions]
    return d


def _storage_error(exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": {"message": f"artifact storage: {exc}"}}, status_code=503)


def artifact_router(svc: ArtifactService, principal) -> APIRouter:
    r = APIRouter(tags=["artifacts"])

    @r.post("/v1/artifacts/uploads", status_code=201)
    def begin(body: UploadBody, who=Depends(principal)):
        files = [f.model_dump() for f in body.files]
        up, missing = svc.begin_upload(
            who, body.name, body.kind, files, body.metadata, body.producer_job
        )
        return {"upload_id": up.id, "team": up.team, "name": up.name, "missing": missing}

    @r.get("/v1/artifacts/uploads/{upload_id}")
    def missing(upload_id: str, who=Depends(principal)):
        return {"upload_id": upload_id, "missing": svc.missing(who, upload_id)}

    @r.put("/v1/artifacts/uploads/{upload_id}/blobs/{digest}")
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

    @r.post("/v1/artifacts/uploads/{upload_id}/commit", status_code=201)
    def commit(upload_id: str, who=Depends(principal)):
        try:
            return version_json(svc.commit(who, upload_id))
        except MissingBlobs as exc:
            detail = {"message": str(exc), "missing": exc.digests}
            return JSONResponse({"detail": detail}, status_code=409)

    @r.delete("/v1/artifacts/uploads/{upload_id}", status_code=204)
    def abort(upload_id: str, who=Depends(principal)):
        svc.abort(who, upload_id)
        return Response(status_code=204)

    @r.get("/v1/artifacts")
    def list_artifacts(team: str | None = None, who=Depends(principal)):
        return {"artifacts": [artifact_json(a) for a in svc.list_artifacts(who, team)]}

    @r.post("/v1/artifacts/gc")
    def gc(who=Depends(principal)):
        return asdict(svc.gc(who))

    @r.get("/v1/artifacts/{team}/{name}")
    def describe(team: str, name: str, who=Depends(principal)):
        art, versions = svc.get(who, f"{team}/{name}")
        return artifact_json(art, versions)

    @r.get("/v1/artifacts/{team}/{name}/versions/{selector}")
    def describe_version(team: str, name: str, selector: str, who=Depends(principal)):
        try:
            v, manifest = svc.version(who, f"{team}/{name}:{selector}")
        except StorageError as exc:
            return _storage_error(exc)
        return version_json(v, manifest)

    @r.get("/v1/artifacts/{team}/{name}/versions/{selector}/blobs/{digest}")
    def get_blob(team: str, name: str, selector: str, digest: str, who=Depends(principal)):
        size, chunks = svc.blob(who, f"{team}/{name}:{selector}", digest)
        headers = {"Content-Length": str(size), "X-Sha256": digest}
        return StreamingResponse(chunks, media_type="application/octet-stream", headers=headers)

    @r.delete("/v1/artifacts/{team}/{name}/versions/{selector}")
    def delete_version(team: str, name: str, selector: str, who=Depends(principal)):
        return version_json(svc.delete(who, f"{team}/{name}:{selector}"))

    @r.put("/v1/artifacts/{team}/{name}/tags/{tag}")
    def tag(team: str, name: str, tag: str, body: TagBody, who=Depends(principal)):
        sel = f":{body.version}" if body.version else ""
        return version_json(svc.tag(who, f"{team}/{name}{sel}", tag))

    @r.delete("/v1/artifacts/{team}/{name}/tags/{tag}", status_code=204)
    def untag(team: str, name: str, tag: str, who=Depends(principal)):
        svc.untag(who, f"{team}/{name}", tag)
        return Response(status_code=204)

    @r.put("/v1/artifacts/{team}/{name}/shares/{other}")
    def share(team: str, name: str, other: str, who=Depends(principal)):
        return artifact_json(svc.share(who, f"{team}/{name}", [other], True))

    @r.delete("/v1/artifacts/{team}/{name}/shares/{other}")
    def unshare(team: str, name: str, other: str, who=Depends(principal)):
        return artifact_json(svc.share(who, f"{team}/{name}", [other], False))

    return r

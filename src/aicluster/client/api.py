"""Python client for the aicluster HTTP API (used by the CLI, jobs, tests and benchmarks).

Invariants:
- Every failed call raises ApiError and nothing else from the transport:
  a non-2xx answer gives its status code, a failed connection gives status 0.
  The one exception is `send`, which hands back any answer, 4xx and 5xx included,
  for callers that inspect refusals themselves.
- `ApiError.message` is always a one-line, human-readable string; structured
  detail (e.g. spec issues) is kept in `ApiError.detail` / `ApiError.issues`.
- `follow_logs` yields every byte of the followed attempt exactly once, in order,
  and switches to a newer attempt only after draining the older one; it ends only
  when the job is terminal and the server has no more bytes for the final attempt.
- `pack_workdir` output is a gzip'd tar whose member names are relative to the
  packed folder (no leading "./", no absolute names, no links leaving the folder),
  so it extracts with tarfile's "data" filter; it is byte-identical for an
  unchanged folder.
"""

from __future__ import annotations

import base64
import gzip
import io
import os
import re
import tarfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from aicluster.specs import SpecError, load_spec
from aicluster.specs.errors import SpecIssue

TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})
EXCLUDED_NAMES = frozenset({".git"})  # skipped whether file or folder
EXCLUDED_DIRS = frozenset({".git", "__pycache__", ".venv", "checkpoints"})
MAX_WORKDIR_BYTES = 64 * 2**20  # the API refuses larger working dirs


class ApiError(Exception):
    """A failed API call. `status_code` is 0 when the API could not be reached."""

    def __init__(self, status_code: int, message: str, detail: Any = None):
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.detail = detail
        issues = detail.get("issues") if isinstance(detail, dict) else None
        self.issues: list = issues if isinstance(issues, list) else []

    def __str__(self) -> str:
        return self.message


class WorkdirError(ValueError):
    """The working_dir cannot be packed (missing, not a folder, too large)."""


def error_from(resp: httpx.Response) -> ApiError:
    """The ApiError for a non-2xx answer: its status, a one-line message, the detail."""
    detail: Any = None
    message = ""
    try:
        body = resp.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and "detail" in body:
        detail = body["detail"]
        if isinstance(detail, dict):
            message = str(detail.get("message") or "")
        elif isinstance(detail, str):
            message = detail
        elif isinstance(detail, list):  # e.g. FastAPI request validation errors
            parts = (d.get("msg", d) if isinstance(d, dict) else d for d in detail)
            message = "; ".join(str(p) for p in parts)
    if not message:
        text = resp.text.strip().splitlines()
        message = text[0] if text else (resp.reason_phrase or "request failed")
    return ApiError(resp.status_code, message, detail)


# --- working_dir packing -------------------------------------------------------


def _skip(name: str, is_dir: bool) -> bool:
    return name in EXCLUDED_NAMES or (is_dir and name in EXCLUDED_DIRS)


def _iter_members(root: Path) -> Iterator[Path]:
    """Paths under root in sorted order, excluded names pruned, symlinks not followed."""
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        keep = []
        for d in sorted(dirnames):
            if _skip(d, is_dir=not (here / d).is_symlink()):
                continue
            if (here / d).is_symlink():
                yield here / d  # stored as a link, never descended
            else:
                keep.append(d)
                yield here / d
        dirnames[:] = keep
        for f in sorted(filenames):
            if not _skip(f, is_dir=False):
                yield here / f


def _normalize(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def pack_workdir(folder: str | Path, limit: int = MAX_WORKDIR_BYTES) -> bytes:
    """Tar+gzip the folder's contents (names relative to it); raise WorkdirError.

    Skipped: anything named .git; folders named __pycache__, .venv, checkpoints;
    sockets, fifos and devices; symlinks whose target lies outside the folder.
    Symlinks inside the folder are kept as relative links.
    """
    root = Path(folder).resolve()
    if not root.exists():
        raise WorkdirError(f"folder not found: {folder}")
    if not root.is_dir():
        raise WorkdirError(f"not a folder: {folder}")
    buf = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for path in _iter_members(root):
            arcname = path.relative_to(root).as_posix()
            if path.is_symlink():
                target = (path.parent / os.readlink(path)).resolve()
                if target != root and root not in target.parents:
                    continue
                info = tarfile.TarInfo(arcname)
                info.type = tarfile.SYMTYPE
                info.linkname = os.path.relpath(target, path.parent.resolve())
                info.mtime = int(path.lstat().st_mtime)
                tar.addfile(_normalize(info))
                continue
            info = tar.gettarinfo(str(path), arcname)
            if info is None or not (info.isfile() or info.isdir()):
                continue
            if info.isfile():
                with open(path, "rb") as f:
                    tar.addfile(_normalize(info), f)
            else:
                tar.addfile(_normalize(info))
            if buf.tell() > limit:
                raise WorkdirError(f"{folder} is larger than {limit >> 20} MiB compressed")
    data = buf.getvalue()
    if len(data) > limit:
        raise WorkdirError(f"{folder} is larger than {limit >> 20} MiB compressed")
    return data


def _line_of(spec_path: Path, key: str) -> int | None:
    """The first line of the spec file that sets `key` (None: not found)."""
    try:
        lines = spec_path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for i, line in enumerate(lines, 1):
        if re.match(rf"\s*{re.escape(key)}\s*:", line):
            return i
    return None


def _packed_workdir(spec, spec_path: Path) -> bytes | None:
    """The spec's working_dir as a tar.gz (None without one); SpecError naming the file."""
    if not getattr(spec, "working_dir", None):
        return None
    try:
        return pack_workdir(spec_path.parent / spec.working_dir)
    except WorkdirError as exc:
        issue = SpecIssue("working_dir", str(exc), _line_of(spec_path, "working_dir"))
        raise SpecError(str(spec_path), [issue]) from None


def _with_requirements(spec, spec_path: Path) -> dict:
    """The spec to send: a job environment's `requirements` file (beside the spec) read
    here and sent as `pip` lines, since the server never reads the client's files."""
    doc = spec.model_dump(mode="json")
    env = doc.get("environment") if doc.get("kind") == "job" else None
    if not env or not env.get("requirements"):
        return doc
    from aicluster.specs.environment import read_requirements

    try:
        lines = read_requirements(spec_path.parent / env["requirements"])
    except ValueError as exc:
        line = _line_of(spec_path, "requirements")
        issue = SpecIssue("environment.requirements", str(exc), line)
        raise SpecError(str(spec_path), [issue]) from None
    env["pip"] = [*env["pip"], *lines]
    env["requirements"] = None
    return doc


# --- the client ----------------------------------------------------------------


class Client:
    """Synchronous client; one httpx connection pool, closed by `close()` or `with`."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout: float = 30,
        *,
        transport: httpx.BaseTransport | None = None,
    ):
        self.url = url.rstrip("/")
        self.token = token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(
            base_url=self.url, headers=headers, timeout=timeout, transport=transport
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # transport: `path` is relative to the API URL, `kw` are httpx request arguments

    def _unreachable(self, exc: httpx.TransportError) -> ApiError:
        if isinstance(exc, httpx.ConnectError):
            msg = f"cannot reach the aicluster API at {self.url}: is it running? (aicluster up)"
        elif isinstance(exc, httpx.TimeoutException):
            msg = f"the aicluster API at {self.url} did not answer in time"
        else:
            msg = f"request to {self.url} failed: {exc}"
        return ApiError(0, msg)

    def send(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """Any answer, whatever its status; ApiError (status 0) only when there is none."""
        try:
            return self._http.request(method, path, **kw)
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from None

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """A 2xx answer; anything else raises ApiError."""
        resp = self.send(method, path, **kw)
        if not resp.is_success:
            raise error_from(resp)
        return resp

    def request_json(self, method: str, path: str, **kw: Any) -> Any:
        """The JSON body of a 2xx answer; anything else raises ApiError."""
        resp = self.request(method, path, **kw)
        try:
            return resp.json()
        except ValueError:
            raise ApiError(resp.status_code, f"invalid JSON from {method} {path}") from None

    def page(
        self, path: str, key: str, params: Any = (), limit: int | None = None, cursor=None
    ) -> tuple[list, str | None]:
        """One page of a list route: its rows (under `key`) and the next page's cursor
        (None at the end). `limit` None: the route's default page size."""
        extra = [("limit", str(limit))] if limit is not None else []
        extra += [("cursor", cursor)] if cursor else []
        items = list(params.items()) if isinstance(params, dict) else list(params)
        body = self.request_json("GET", path, params=items + extra)
        return body[key], body.get("next_cursor")

    def listing(
        self, path: str, key: str, params: Any = (), limit: int | None = None, every=False
    ) -> list:
        """The first page of a list route (`limit` rows at most), or with `every` all of
        it, following `next_cursor` page after page (`limit` then sizes each page)."""
        rows, cursor = self.page(path, key, params, limit)
        while every and cursor:
            more, cursor = self.page(path, key, params, limit, cursor)
            rows += more
        return rows

    @contextmanager
    def stream(self, method: str, path: str, **kw: Any) -> Iterator[httpx.Response]:
        """A 2xx answer whose body is read as it arrives (`iter_bytes`); a failure,
        while connecting or while reading the body in the block, raises ApiError."""
        try:
            with self._http.stream(method, path, **kw) as resp:
                if not resp.is_success:
                    resp.read()
                    raise error_from(resp)
                yield resp
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from None

    # health and identity

    def health(self) -> dict:
        return self.request_json("GET", "/healthz")

    def whoami(self) -> dict:
        return self.request_json("GET", "/v1/whoami")

    # jobs

    def submit(self, spec: dict, workdir: bytes | None = None) -> dict:
        """Submit a spec dict; `workdir` is a tar.gz (see pack_workdir) or None."""
        encoded = base64.b64encode(workdir).decode("ascii") if workdir else None
        return self.request_json("POST", "/v1/jobs", json={"spec": spec, "workdir": encoded})

    def submit_batch(self, specs: list[dict], workdir: bytes | None = None) -> list[dict]:
        """Submit up to 1,000 spec dicts in one request: all stored, or none (the error
        names `specs[i]`); `workdir` (a tar.gz) is every job's working directory."""
        encoded = base64.b64encode(workdir).decode("ascii") if workdir else None
        body = {"specs": specs, "workdir": encoded}
        return self.request_json("POST", "/v1/jobs/batch", json=body)["jobs"]

    def submit_file(self, path: str | Path) -> dict:
        """Load a spec file (SpecError propagates), pack its working_dir, submit."""
        spec_path = Path(path)
        spec = load_spec(spec_path)
        workdir = _packed_workdir(spec, spec_path)
        return self.submit(_with_requirements(spec, spec_path), workdir)

    def submit_files(self, paths: Iterable[str | Path]) -> list[dict]:
        """Several spec files as one batch (all stored, or none): each loaded and checked
        here first; those with a working_dir must name the same folder, packed once."""
        docs, folders, workdir = [], set(), None
        for path in map(Path, paths):
            spec = load_spec(path)
            if getattr(spec, "working_dir", None):
                folder = (path.parent / spec.working_dir).resolve()
                if folders and folder not in folders:
                    issue = SpecIssue(
                        "working_dir",
                        f"{folder} differs from {next(iter(folders))}: a batch has one "
                        "working directory (submit such files one at a time)",
                        _line_of(path, "working_dir"),
                    )
                    raise SpecError(str(path), [issue])
                if not folders:
                    workdir = _packed_workdir(spec, path)
                folders.add(folder)
            docs.append(_with_requirements(spec, path))
        return self.submit_batch(docs, workdir)

    def jobs(
        self,
        status: Iterable[str] | None = None,
        team: str | None = None,
        limit: int | None = None,
        every: bool = False,
    ) -> list[dict]:
        """Jobs newest first: one page (`limit`, else the server's default), or every
        page with `every` (Client.listing)."""
        params: list[tuple[str, str]] = [("status", s) for s in status or ()]
        if team:
            params.append(("team", team))
        return self.listing("/v1/jobs", "jobs", params, limit, every)

    def job(self, job_id: str) -> dict:
        return self.request_json("GET", f"/v1/jobs/{job_id}")

    def cancel(self, job_id: str) -> dict:
        return self.request_json("POST", f"/v1/jobs/{job_id}/cancel")

    def logs(
        self, job_id: str, rank: int = 0, attempt: int | None = None, offset: int = 0
    ) -> tuple[bytes, int, str, int]:
        """One read: (bytes, next_offset, job_status, attempt the bytes belong to)."""
        params: dict[str, Any] = {"rank": rank, "offset": offset}
        if attempt is not None:
            params["attempt"] = attempt
        resp = self.request("GET", f"/v1/jobs/{job_id}/logs", params=params)
        data = resp.content
        h = resp.headers
        try:
            next_offset = int(h.get("X-Next-Offset") or offset + len(data))
            got_attempt = int(h.get("X-Attempt") or (attempt if attempt is not None else 0))
        except ValueError:
            raise ApiError(resp.status_code, "invalid X-Next-Offset/X-Attempt from logs") from None
        return data, next_offset, h.get("X-Job-Status", ""), got_attempt

    def follow_logs(
        self,
        job_id: str,
        rank: int = 0,
        poll: float = 0.5,
        timeout: float | None = None,
        attempt: int | None = None,
    ) -> Iterator[bytes]:
        """Yield log chunks until the job is terminal and no bytes remain.

        Without `attempt`, follows the latest attempt, draining each older one
        before moving on. With `attempt`, follows only that one. Raises
        TimeoutError when `timeout` seconds pass first.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        current, offset = attempt, 0
        while True:
            data, nxt, status, got = self.logs(job_id, rank, attempt, offset)
            if current is None:
                current = got
            if attempt is None and got != current:
                # A newer attempt started: `data` was read at the old offset, so drop
                # it, drain the old attempt, then start the new one from byte 0.
                yield from self._drain(job_id, rank, current, offset)
                current, offset = got, 0
                continue
            if data:
                offset = nxt
                yield data
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"job {job_id} still {status} after {timeout}s")
                continue
            if status in TERMINAL:
                return
            if attempt is not None and self.job(job_id).get("attempt", attempt) != attempt:
                return  # the pinned attempt is over and fully read
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id} still {status} after {timeout}s")
            left = poll if deadline is None else deadline - time.monotonic()
            time.sleep(max(0.0, min(poll, left)))

    def _drain(self, job_id: str, rank: int, attempt: int, offset: int) -> Iterator[bytes]:
        """Yield what is left of one attempt's log from `offset` on."""
        while True:
            data, offset, _, _ = self.logs(job_id, rank, attempt, offset)
            if not data:
                return
            yield data

    def wait(self, job_id: str, statuses: Iterable[str], timeout: float = 60.0) -> dict:
        """Poll the job every 0.2 s until its status is in `statuses`."""
        wanted = set(statuses)
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job.get("status") in wanted:
                return job
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"job {job_id} is {job.get('status')}, not {sorted(wanted)}, after {timeout}s"
                )
            time.sleep(0.2)

    # cluster

    def nodes(self, limit: int | None = None, every: bool = True) -> list[dict]:
        """Every node (each page of the route), or one page of `limit` without `every`."""
        return self.listing("/v1/nodes", "nodes", (), limit, every)

    def events(
        self,
        after: int = 0,
        object_id: str | None = None,
        limit: int | None = None,
        every: bool = False,
    ) -> list[dict]:
        """Events after id `after`, oldest first: one page, or every page with `every`."""
        params: dict[str, Any] = {"after": after}
        if object_id:
            params["object_id"] = object_id
        return self.listing("/v1/events", "events", params, limit, every)

    # administration

    def create_team(self, name: str) -> dict:
        return self.request_json("POST", "/v1/teams", json={"name": name})

    def teams(self) -> list[str]:
        return self.request_json("GET", "/v1/teams")["teams"]

    def create_token(
        self,
        user: str,
        team: str | None = None,
        role: str = "member",
        expires_in: str | None = None,
    ) -> dict:
        """A new token (admins); `expires_in`: a duration such as 30d (default: never)."""
        body = {"user": user, "team": team, "role": role}
        if expires_in is not None:
            body["expires_in"] = expires_in
        return self.request_json("POST", "/v1/tokens", json=body)

    def tokens(
        self,
        user: str | None = None,
        all_users: bool = False,
        limit: int | None = None,
        every: bool = True,
    ) -> list[dict]:
        """A user's tokens without their secrets (default: the caller's; admins: anyone's,
        or everyone's with `all_users`): every page, or one of `limit` without `every`."""
        params = {"user": user} if user else {}
        if all_users:
            params["all"] = "true"
        return self.listing("/v1/tokens", "tokens", params, limit, every)

    def revoke_token(self, token_id: int) -> dict:
        return self.request_json("POST", f"/v1/tokens/{token_id}/revoke")

    def audit(
        self, since: str | None = None, user: str | None = None, after: int = 0, limit: int = 500
    ) -> dict:
        """A page of the audit log (admins): `entries` oldest first, `next` the cursor."""
        params = {"after": after, "limit": limit, "since": since, "user": user}
        params = {k: v for k, v in params.items() if v is not None}
        return self.request_json("GET", "/v1/audit", params=params)

    # queue and quotas

    def queue(self, limit: int | None = None, every: bool = False) -> list[dict]:
        """Pending workloads in the order the scheduler considers them, each with its
        position and reason: one page (`limit`, else the server's default), or every page
        with `every` (a reorder between pages may repeat or skip an entry: GET /v1/queue)."""
        return self.listing("/v1/queue", "queue", (), limit, every)

    def quotas(self) -> list[dict]:
        return self.request_json("GET", "/v1/quotas")["quotas"]

    def set_quota(self, team: str, pool: str, quota: dict) -> dict:
        """Set a team's quota in a pool (admins); `quota`: gpus, borrow_gpus, lend_gpus, weight."""
        return self.request_json("PUT", f"/v1/teams/{team}/quotas/{pool}", json=quota)

    # -- services -------------------------------------------------------------------

    def deploy(self, spec: dict) -> dict:
        return self.request_json("POST", "/v1/services", json={"spec": spec})

    def deploy_file(self, path: str | Path) -> dict:
        """Load a `kind: service` spec file (SpecError propagates) and deploy it."""
        spec = load_spec(Path(path))
        if getattr(spec, "kind", None) != "service":
            raise SpecError(str(path), [SpecIssue("kind", "expected kind: service", None)])
        return self.deploy(spec.model_dump(mode="json"))

    def services(self, limit: int | None = None, every: bool = True) -> list[dict]:
        """Every service (each page), or one page of `limit` without `every`."""
        return self.listing("/v1/services", "services", (), limit, every)

    def service(self, name: str, team: str | None = None) -> dict:
        return self.request_json("GET", f"/v1/services/{name}", params=_team(team))

    def scale(self, name: str, replicas: int, team: str | None = None) -> dict:
        return self.request_json(
            "POST", f"/v1/services/{name}/scale", params=_team(team), json={"replicas": replicas}
        )

    def delete_service(self, name: str, team: str | None = None) -> dict:
        return self.request_json("DELETE", f"/v1/services/{name}", params=_team(team))


def _team(team: str | None) -> dict:
    return {"team": team} if team else {}


def node_action(client: Client, node: str, action: str, grace_s: float | None = None) -> dict:
    """cordon | drain | uncordon a node (admins); `node` is an id prefix or a name."""
    body = {"grace_s": grace_s} if grace_s is not None else None
    return client.request_json("POST", f"/v1/nodes/{node}/{action}", json=body)

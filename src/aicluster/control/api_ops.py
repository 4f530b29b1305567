"""ApiOps: the operations behind the API routes; every check of who may do what lives here.

Vocabulary: a Principal is the caller. Admins see every team; members and viewers
see only their team's jobs, and a job of another team is reported as not found,
never as forbidden, so that its existence does not leak. Viewers cannot change
anything.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from aicluster.control.logs import LogsRemoved, LogStore
from aicluster.control.queue_pages import QueuePages
from aicluster.control.workdirs import as_workdirs
from aicluster.core.lifecycle import TERMINAL, JobStatus, Reason
from aicluster.engine.protocol import Engine
from aicluster.specs.errors import SpecError, SpecIssue
from aicluster.specs.job import JobSpec
from aicluster.specs.limits import MAX_WORKDIR_BYTES
from aicluster.specs.loader import validate_spec
from aicluster.specs.names import check_name
from aicluster.specs.workdir import WorkdirInvalid, check_workdir_archive
from aicluster.store.cursors import DEFAULT_LIMIT
from aicluster.store.db import Store
from aicluster.store.identity import Principal, TokenInfo
from aicluster.store.jobs import JobRecord

# Where each other kind of spec goes instead of /v1/jobs.
_OTHER_KINDS = {"service": "deploy it with POST /v1/services (aicluster deploy)"}


class NotFoundError(Exception):
    pass


class ForbiddenError(Exception):
    pass


class AmbiguousJobName(Exception):
    """A job name an admin used matches the newest jobs of more than one team."""

    def __init__(self, name: str, candidates: list[JobRecord]):
        self.name = name
        self.candidates = candidates
        listed = ", ".join(f"{j.id} (team {j.team})" for j in candidates)
        super().__init__(
            f"job name {name!r} is ambiguous: the newest jobs of that name are {listed}; "
            f"use the job id or TEAM:NAME (e.g. {candidates[0].team}:{name})"
        )


class BadRequest(Exception):
    """A refused request; `field` names the part of it at fault, when one is."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(\d{1,9})([smhdw])")
MAX_DURATION_S = 100 * 366 * 86400.0


def parse_duration(text: str, field: str) -> float:
    """Seconds of `90s`, `30m`, `12h`, `30d` or `2w` (more than none, at most a century);
    BadRequest naming `field` otherwise."""
    m = _DURATION.fullmatch(text.strip())
    seconds = int(m.group(1)) * _DURATION_UNITS[m.group(2)] if m else 0
    if not 0 < seconds <= MAX_DURATION_S:
        raise BadRequest(
            f"{field}: {text[:40]!r} is not a duration such as 90s, 30m, 12h, 30d or 2w "
            "(more than none, at most 100 years)",
            field=field,
        )
    return float(seconds)


def _valid_name(value: str, what: str) -> str:
    try:
        return check_name(value, what)
    except ValueError as exc:
        raise BadRequest(f"{what}: {exc}", field=what) from None


@dataclass
class ApiOps:
    store: Store
    engine: Engine
    logs: LogStore
    workdirs: Path | object  # a folder, or control.workdirs.SharedWorkdirs
    notify: Callable[[], None] = field(default=lambda: None)  # wakes the reconcile loop
    # Admitted workloads that are not jobs (service replicas), for node allocation views.
    other_workloads: Callable[[], list] = field(default=lambda: [])
    node_loop: object | None = None  # control.nodes_loop.NodeLoop: states, cordon, drain
    quotas: object | None = None  # store.quotas.QuotaStore
    artifacts: object | None = None  # control.artifacts.ArtifactService (job inputs)
    queue: Callable[[], list] = field(default=lambda: [])  # last cycle's queue_pages.QueueEntry
    # node id -> resources held, as of a recent cycle of this process's loop, or None
    allocated: Callable[[], dict | None] = field(default=lambda: None)
    budgets: object | None = None  # control.budgets.BudgetOps: caps at submit, /v1/budgets

    def __post_init__(self) -> None:
        self._queue_pages = QueuePages(lambda: self.queue(), lambda ids: self.store.get_jobs(ids))

    # -- quotas and the queue --------------------------------------------------------

    def set_quota(self, who: Principal, quota) -> object:
        _admin_only(who)
        _valid_name(quota.team, "team")
        _valid_name(quota.pool, "pool")
        if self.quotas is None:
            raise BadRequest("quotas are not managed by this control plane")
        out = self.quotas.set(quota, actor=who.user)
        self.notify()
        return out

    def list_quotas(self, who: Principal) -> list:
        rows = self.quotas.all() if self.quotas is not None else []
        return rows if who.is_admin else [q for q in rows if q.team == who.team]

    def pending_queue(
        self, who: Principal, limit: int = DEFAULT_LIMIT, cursor: str | None = None
    ) -> tuple[list[dict], str | None]:
        """A page of the pending workloads in the order the scheduler considered them, with
        why each waits, and the next page's cursor (control.queue_pages). Other teams'
        entries count for position but are not shown."""
        return self._queue_pages.page(who, limit, cursor)

    # -- nodes ---------------------------------------------------------------------

    def node_states(self) -> dict:
        return self.node_loop.nodes.all() if self.node_loop is not None else {}

    def node_action(self, who: Principal, node: str, action: str, grace_s: float = 300.0):
        _admin_only(who)
        if self.node_loop is None:
            raise BadRequest("node states are not managed by this control plane")
        node_id = self._resolve_node(node)
        if action == "cordon":
            rec = self.node_loop.cordon(node_id, who.user)
        elif action == "drain":
            rec = self.node_loop.drain(node_id, who.user, grace_s)
        elif action == "retire":
            from aicluster.control.nodes_loop import NodeIsLive
            from aicluster.store.errors import Conflict

            # Ray's word that the node is alive wins over a record not yet caught up.
            alive = any(n.node_id == node_id and n.alive for n in self.engine.nodes())
            try:
                rec = self.node_loop.retire(node_id, who.user, alive=alive)
            except NodeIsLive as exc:
                raise Conflict(str(exc)) from None
        else:
            rec = self.node_loop.uncordon(node_id, who.user)
        self.notify()
        return rec

    def _resolve_node(self, node: str) -> str:
        """The current Ray node id of a node not retired, named by its name, a prefix of its
        Ray node id or a prefix of its machine id (stable across rejoins)."""
        states = self.node_states()
        matches = [
            n
            for n, rec in states.items()
            if not rec.state.retired
            and (
                n.startswith(node)
                or rec.name == node
                or (rec.machine_id is not None and rec.machine_id.startswith(node))
            )
        ]
        if len(matches) != 1:
            what = "no node" if not matches else f"{len(matches)} nodes"
            raise NotFoundError(f"{what} match {node!r}; use a longer node or machine id prefix")
        return matches[0]

    # -- jobs ----------------------------------------------------------------------

    def submit(self, who: Principal, spec_doc: dict, workdir_b64: str | None) -> JobRecord:
        spec = self._job_spec(who, spec_doc, "request body")
        if self.budgets is not None:
            self.budgets.check_queue(spec.team)  # QueueFull past its max_queued_jobs
        blob = _decode_workdir(workdir_b64)
        # stored before the job exists, so a launch always finds it
        ref = as_workdirs(self.workdirs).put(blob) if blob is not None else None
        job = self.store.create_job(spec, who.user, ref)
        self.notify()
        return job

    def submit_batch(
        self, who: Principal, spec_docs: list[dict], workdir_b64: str | None
    ) -> list[JobRecord]:
        """Many jobs at once, all or none: every spec is checked (an error names
        `specs[i]`) and every team's queue cap counted before one transaction stores them
        all, in order; `workdir`, when given, is every job's working directory."""
        teams: dict[str, bool] = {}  # each team looked up once
        specs = [self._batch_spec(who, i, d, teams) for i, d in enumerate(spec_docs)]
        if self.budgets is not None:
            for team, n in Counter(s.team for s in specs).items():
                self.budgets.check_queue(team, adding=n)
        blob = _decode_workdir(workdir_b64)
        ref = as_workdirs(self.workdirs).put(blob) if blob is not None else None
        jobs = self.store.create_jobs(specs, who.user, ref)
        self.notify()
        return jobs

    def _batch_spec(self, who: Principal, i: int, spec_doc: dict, teams: dict) -> JobSpec:
        """`_job_spec` of a batch's i-th spec; each issue's field is `specs[i].FIELD`."""
        where = f"specs[{i}]"
        try:
            return self._job_spec(who, spec_doc, where, teams)
        except SpecError as exc:
            issues = [replace(x, field=f"{where}.{x.field}") for x in exc.issues]
            raise SpecError(where, issues) from None

    def _job_spec(
        self, who: Principal, spec_doc: dict, source: str, teams: dict | None = None
    ) -> JobSpec:
        """The job spec of `spec_doc`, checked against who submits it (SpecError names
        `source` and the field); `teams` remembers which teams exist, within one call."""
        if who.role == "viewer":
            raise ForbiddenError("viewers cannot submit jobs")
        spec: JobSpec = validate_spec(spec_doc, source)
        if not isinstance(spec, JobSpec):
            raise SpecError(
                source,
                [
                    SpecIssue(
                        "kind", f"this is a {spec.kind} spec, not a job: {_OTHER_KINDS[spec.kind]}"
                    )
                ],
            )
        if not who.is_admin and spec.team != who.team:
            raise SpecError(
                source, [SpecIssue("team", f"you may submit only to your team {who.team!r}")]
            )
        teams = {} if teams is None else teams
        if spec.team not in teams:
            teams[spec.team] = self.store.team_exists(spec.team)
        if not teams[spec.team]:
            raise SpecError(source, [SpecIssue("team", f"team {spec.team!r} does not exist")])
        if spec.environment is not None and spec.environment.requirements:
            issue = SpecIssue(
                "environment.requirements",
                "a file that the client reads at submit (aicluster submit, "
                "Client.submit_file); send its lines in environment.pip",
            )
            raise SpecError(source, [issue])
        self._check_artifacts(who, spec, source)
        return spec

    def _check_artifacts(self, who: Principal, spec: JobSpec, source: str) -> None:
        """Inputs must be readable by the submitter, outputs must belong to the job's team."""
        if not spec.inputs and not spec.outputs:
            return
        from aicluster.artifacts.names import parse_ref

        issues = []
        for i, inp in enumerate(spec.inputs):
            try:
                self.artifacts.version(
                    who, inp.artifact if "/" in inp.artifact else f"{spec.team}/{inp.artifact}"
                )
            except Exception as exc:  # noqa: BLE001 - not found, not shared, bad name
                issues.append(SpecIssue(f"inputs.{i}.artifact", str(exc).strip("'\"")))
        for i, out in enumerate(spec.outputs):
            try:
                team = parse_ref(out.artifact, default_team=spec.team).team
            except Exception as exc:  # noqa: BLE001 - a malformed name
                issues.append(SpecIssue(f"outputs.{i}.artifact", str(exc)))
                continue
            if team != spec.team:
                issues.append(
                    SpecIssue(
                        f"outputs.{i}.artifact", f"outputs go to the job's team {spec.team!r}"
                    )
                )
        if issues:
            raise SpecError(source, issues)

    def list_jobs(
        self, who: Principal, statuses: list[str] | None, team: str | None
    ) -> list[JobRecord]:
        if not who.is_admin:
            team = who.team
        return self.store.list_jobs(team=team, statuses=_statuses(statuses))

    def page_jobs(
        self,
        who: Principal,
        statuses: list[str] | None,
        team: str | None,
        limit: int,
        cursor: str | None,
    ) -> tuple[list[JobRecord], str | None]:
        """A page of `list_jobs`, newest first, and the next page's cursor."""
        if not who.is_admin:
            team = who.team
        sts = _statuses(statuses)
        return self.store.page_jobs(team=team, statuses=sts, limit=limit, cursor=cursor)

    def get_job(self, who: Principal, job_id: str) -> JobRecord:
        """A job by its id or, when no job the caller may see has that id, by its name:
        `NAME` is the newest job of that name in the caller's team (an admin's: in any
        team, AmbiguousJobName when the newest ones are in several), `TEAM:NAME` the newest
        in TEAM. A name never reaches another team's job for a member (not found)."""
        job = self.store.get_job(job_id)
        if job is not None and (who.is_admin or job.team == who.team):
            return job
        job = self._job_by_name(who, job_id)
        if job is None:
            raise NotFoundError(f"job {job_id} not found")
        return job

    def _job_by_name(self, who: Principal, ref: str) -> JobRecord | None:
        head, colon, tail = ref.partition(":")  # names and ids never hold ':'
        team, name = (head, tail) if colon else (None, ref)
        if not who.is_admin:
            if team not in (None, who.team) or not who.team:
                return None  # another team's job is "not found", as by id
            team = who.team
        if not name or team == "":
            return None
        found = self.store.newest_jobs_named(name, team)
        if len(found) > 1:
            raise AmbiguousJobName(name, found)
        return found[0] if found else None

    def cancel(self, who: Principal, job_id: str) -> JobRecord:
        job = self.get_job(who, job_id)
        if who.role == "viewer":
            raise ForbiddenError("viewers cannot cancel jobs")
        while not job.status.terminal:
            done = self.store.transition(
                job.id,
                job.status,
                JobStatus.CANCELLED,
                Reason.CANCELLED_BY_USER,
                f"cancelled by {who.user}",
                actor=who.user,
            )
            if done is not None:
                if job.attempt > 0 and job.status != JobStatus.PENDING:
                    self._drain_and_stop(job)
                return done
            job = self.store.get_job(job.id)
        return job

    def _drain_and_stop(self, job: JobRecord) -> None:
        n = len(job.placement or [])
        offsets = [self.logs.offset(job.id, job.attempt, r) for r in range(n)]
        for s in self.engine.status(job.id, job.attempt, offsets):
            self.logs.append(job.id, job.attempt, s.rank, s.log, at=offsets[s.rank])
        self.engine.stop(job.id, job.attempt, n)

    def read_logs(
        self, who: Principal, job_id: str, rank: int, attempt: int | None, offset: int
    ) -> tuple[bytes, JobRecord, int, int]:
        """(bytes, the job, their attempt, the offset to read next). LogsRemoved when the
        logs retention deleted the job's logs (control.logs)."""
        job = self.get_job(who, job_id)
        workers = job.spec.workers
        if not 0 <= rank < workers:
            raise BadRequest(f"rank must be between 0 and {workers - 1}")
        attempt = job.attempt if attempt is None else attempt
        data, nxt = self.logs.read_from(job.id, attempt, rank, offset)
        if not data and job.status in TERMINAL and (why := self.logs.removed(job.id)):
            raise LogsRemoved(f"the logs of job {job.id} were removed: {why}")
        return data, job, attempt, nxt

    def events(
        self,
        who: Principal,
        after: int,
        object_id: str | None,
        limit: int = DEFAULT_LIMIT,
        cursor: str | None = None,
    ):
        """A page of the events `who` may see, oldest first, and the next page's cursor."""
        team = None if who.is_admin else who.team
        return self.store.page_events(team, object_id, after, limit, cursor)

    # -- teams and tokens ------------------------------------------------------------

    def create_team(self, who: Principal, name: str) -> None:
        _admin_only(who)
        _valid_name(name, "name")
        self.store.create_team(name, actor=who.user)

    def create_token(
        self,
        who: Principal,
        user: str,
        team: str | None,
        role: str,
        expires_in: str | None = None,
    ) -> tuple[str, TokenInfo]:
        """A new token of `user` (made with that team and role on first use), expiring
        `expires_in` (a duration) from now (None: never): its plaintext, shown once, and
        its record."""
        _admin_only(who)
        expires_in_s = None if expires_in is None else parse_duration(expires_in, "expires_in")
        _valid_name(user, "user")
        if team is not None:
            _valid_name(team, "team")
        if role not in ("admin", "member", "viewer"):
            raise BadRequest("role must be admin, member or viewer")
        if role != "admin" and not team:
            raise BadRequest("team is required for members and viewers")
        existing = self.store.get_user(user)
        if existing is None:
            self.store.create_user(user, team, role)
        elif (existing.team, existing.role) != (team, role):
            raise BadRequest(
                f"user {user!r} exists with team {existing.team!r} and role {existing.role!r}"
            )
        expires_at = None if expires_in_s is None else self.store.clock() + expires_in_s
        return self.store.issue_token(user, expires_at)


def _admin_only(who: Principal) -> None:
    if not who.is_admin:
        raise ForbiddenError("this needs an admin token")


def _decode_workdir(b64: str | None) -> bytes | None:
    if not b64:
        return None
    try:
        blob = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest("workdir must be a base64-encoded .tar.gz", field="workdir") from None
    if len(blob) > MAX_WORKDIR_BYTES:
        raise BadRequest(
            f"workdir is larger than {MAX_WORKDIR_BYTES // 2**20} MiB", field="workdir"
        )
    try:
        check_workdir_archive(blob)
    except WorkdirInvalid as exc:
        raise BadRequest(f"workdir: {exc}", field="workdir") from None
    return blob


def _statuses(statuses: list[str] | None) -> list[JobStatus] | None:
    try:
        return [JobStatus(s.upper()) for s in statuses] if statuses else None
    except ValueError:
        names = ", ".join(s.value for s in JobStatus)
        raise BadRequest(f"status must be one of {names}", field="status") from None

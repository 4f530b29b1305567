"""What goes into and out of a job's attempt, for the jobs loop (control.jobs_loop): the
launch request (command, environment, working directory, inputs) and the outputs pushed
as artifact versions when it succeeds.

Invariants: an attempt's token is scoped to that attempt and made only when the workers can
reach the API (`api_url`); inputs are resolved as the job's owner, so a job reads no
artifact its owner could not; outputs are committed only after rank 0's node wrote every
blob the storage lacked; an output that would take the team past its storage quota
(store.artifacts.quotas) is refused when its upload is declared, before the node writes a
byte, and the job fails (output_failed) with the quota's message.
"""

from __future__ import annotations

from pathlib import Path

from aicluster.engine.protocol import LaunchRequest
from aicluster.runtime import envs
from aicluster.store.jobs import JobRecord


def launch_request(
    rec: JobRecord, attempt: int, workdirs, store, api_url: str | None, inputs=(), storage=None
) -> LaunchRequest:
    """What the engine is given to start an attempt's gang: the command, its environment
    (torchrun's is added per rank on the node; here the job's own, its identity, the
    attempt's scoped token, its `environment`), the working directory and inputs."""
    spec = rec.spec
    env = dict(spec.env)
    env.update(
        AICLUSTER_JOB_ID=rec.id,
        AICLUSTER_JOB_NAME=rec.name,
        AICLUSTER_TEAM=rec.team,
        AICLUSTER_ATTEMPT=str(attempt),
        AICLUSTER_RESTARTS=str(rec.restarts),
    )
    env.update(spec.checkpoint.env() if spec.checkpoint else {})  # checkpoint.save
    env.update(envs.job_env(spec.environment) if spec.environment else {})  # on each node
    if api_url:  # a token scoped to this attempt: its team's artifacts, its checkpoints
        env.update(
            AICLUSTER_URL=api_url,
            AICLUSTER_TOKEN=store.create_job_token(rec.id, attempt),
        )
    workdir = workdirs.get(rec.workdir) if rec.workdir else None
    return LaunchRequest(
        job_id=rec.id,
        attempt=attempt,
        placement=tuple(rec.placement),
        cpus=spec.resources.cpus,
        memory=spec.resources.memory,
        gpus=spec.resources.gpus,
        command=spec.command,
        env=env,
        workdir=workdir,
        team=rec.team,
        launcher=spec.launcher,
        inputs=inputs,
        storage=storage,
    )


def resolve_inputs(
    rec: JobRecord, store, artifacts, home: Path
) -> tuple[tuple[dict, ...], object | None]:
    """Manifests of the job's inputs, read as its owner, and where blobs come from."""
    if not rec.spec.inputs:
        return (), None
    from aicluster.store.artifacts.backend import load_storage_config

    who = store.get_user(rec.owner)
    out = []
    for inp in rec.spec.inputs:
        name = inp.artifact if "/" in inp.artifact else f"{rec.team}/{inp.artifact}"
        _version, manifest = artifacts.version(who, name)
        out.append({"path": inp.path, "env": inp.env, "manifest": manifest.to_json()})
    return tuple(out), load_storage_config(home)


def push_outputs(job: JobRecord, engine, artifacts, home: Path) -> list[str]:
    """Push rank 0's outputs as new artifact versions: the control plane opens the
    upload, rank 0's node writes the blobs storage lacks, the control plane commits."""
    from aicluster.artifacts.names import parse_ref
    from aicluster.store.artifacts.backend import load_storage_config

    if not job.spec.outputs:
        return []
    repo, storage = artifacts.artifacts, load_storage_config(home)
    produced = []
    for out in job.spec.outputs:
        ref = parse_ref(out.artifact, default_team=job.team)
        files = engine.scan_output(job.id, job.attempt, out.path)
        up, missing = repo.begin_upload(
            ref, out.kind, files, producer_job=job.id, created_by=job.owner
        )
        engine.upload_output(job.id, job.attempt, out.path, missing, storage)
        v = repo.commit(up.id)
        produced.append(f"{v.team}/{v.name}:{v.version}")
    return produced

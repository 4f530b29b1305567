"""A job as the API shows it: the typed spec dumped back to the JSON it was stored as
(defaults included, as the dashboard and the CLI read them), the requeue cause and the
wait kind as text."""

from __future__ import annotations

import json

from aicluster.api.app import job_json
from aicluster.core.lifecycle import JobStatus, Reason, RequeueCause
from aicluster.core.model import WaitKind
from aicluster.specs.job import JobSpec

from fakes import open_test_store

P, A = JobStatus.PENDING, JobStatus.ADMITTED


def test_a_jobs_json_has_its_full_spec_and_its_requeue_cause_as_text(tmp_path, store_template):
    store = open_test_store(tmp_path, template=store_template)
    try:
        spec = JobSpec.model_validate({"name": "train", "command": ["python", "t.py"]})
        job = store.create_job(spec, "admin")
        d = job_json(job)
        assert d["spec"] == spec.model_dump(mode="json")
        assert d["spec"]["resources"] == {"cpus": 1.0, "memory": 0, "gpus": 0, "gpu_model": None}
        assert (d["spec"]["max_restarts"], d["spec"]["inputs"], d["spec"]["outputs"]) == (0, [], [])
        assert (d["workers"], d["status"], d["requeue_cause"]) == (1, "PENDING", None)
        assert d["wait_kind"] is None

        store.set_wait_message(job.id, "queued behind other-000001", WaitKind.QUEUED_BEHIND)
        d = job_json(store.get_job(job.id))
        assert d["wait_kind"] == "queued_behind" and type(d["wait_kind"]) is str
        assert d["message"] == "queued behind other-000001"

        store.transition(job.id, P, A, Reason.ADMITTED)
        assert job_json(store.get_job(job.id))["wait_kind"] is None  # cleared on leaving PENDING
        job = store.transition(
            job.id, A, P, Reason.REQUEUED, "preempted: x", requeue_cause=RequeueCause.PREEMPTED
        )
        d = job_json(job, store.list_events(object_id=job.id))
        assert d["requeue_cause"] == "preempted" and type(d["requeue_cause"]) is str
        assert d["events"][-1]["message"] == "preempted: x"
        assert json.loads(json.dumps(d)) == d
    finally:
        store.close()

"""A job's `environment` on the real cluster: a package that is not in the platform's venv,
shipped as a wheel in the job's working dir and named in a requirements file; built once
per node and user, found by the next job with the same environment; a requirement that
cannot be installed or a Python the node lacks fails the job as `environment_failed` with
the reason in words."""

from __future__ import annotations

import uuid

import pytest
import yaml
from wheels import make_wheel

from aicluster.client.api import ApiError

from harness import TERMINAL


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A job folder with a wheel of a module no venv here has (a fresh name each run, so
    the first build is a real one) and a requirements file naming it."""
    root = tmp_path_factory.mktemp("envjob")
    module = f"aicenv{uuid.uuid4().hex[:8]}"
    work = root / "work"
    (work / "wheels").mkdir(parents=True)
    wheel = make_wheel(work / "wheels", module)
    (root / "requirements.txt").write_text(f"# the job's own package\nwheels/{wheel.name}\n")
    return root, module


def _spec(root, name: str, module: str, **environment) -> str:
    doc = {
        "kind": "job",
        "name": name,
        "working_dir": "work",
        "command": f"python -c \"import {module}, sys; print('value', {module}.VALUE, sys.prefix)\"",
        "environment": environment or {"requirements": "requirements.txt"},
    }
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _env_events(admin, job_id: str) -> list[str]:
    return [e["reason"] for e in admin.events(object_id=job_id) if e["type"] == "JobEnvironment"]


def test_a_jobs_environment_is_built_once_and_found_by_the_next_job(admin, project):
    root, module = project
    first = admin.submit_file(_spec(root, "env-first", module))
    done = admin.wait(first["id"], TERMINAL, timeout=240)
    assert done["status"] == "SUCCEEDED", done
    out = admin.logs(first["id"])[0].decode()
    assert "value 1.0 " in out and "/aicluster-envs/" in out.split("value 1.0 ", 1)[1]
    assert _env_events(admin, first["id"]) == ["building", "ready"]
    assert done["spec"]["environment"]["requirements"] is None  # sent as pip lines
    assert done["spec"]["environment"]["pip"] == [f"wheels/{module}-1.0-py3-none-any.whl"]

    second = admin.submit_file(_spec(root, "env-second", module))
    again = admin.wait(second["id"], TERMINAL, timeout=120)
    assert again["status"] == "SUCCEEDED", again
    assert _env_events(admin, second["id"]) == ["ready"], "found in the cache, not built"
    log = admin.logs(second["id"])[0].decode()
    assert "(cached)" in log and "value 1.0" in log


def test_an_environment_that_cannot_be_built_fails_the_job_saying_why(admin, project):
    root, module = project
    missing = admin.submit_file(
        _spec(root, "env-missing", module, pip=["wheels/nope-1.0-py3-none-any.whl"])
    )
    job = admin.wait(missing["id"], TERMINAL, timeout=240)
    assert (job["status"], job["reason"]) == ("FAILED", "environment_failed"), job
    assert "pip install failed" in job["message"] and "nope-1.0-py3-none-any.whl" in job["message"]

    old = admin.submit_file(
        _spec(
            root, "env-python", module, pip=[f"wheels/{module}-1.0-py3-none-any.whl"], python="3.99"
        )
    )
    job = admin.wait(old["id"], TERMINAL, timeout=120)
    assert (job["status"], job["reason"]) == ("FAILED", "environment_failed"), job
    assert "python 3.99 is not on this node" in job["message"]


def test_the_api_refuses_a_requirements_file_it_cannot_read(admin):
    spec = {
        "kind": "job",
        "name": "env-file",
        "command": "true",
        "environment": {"requirements": "requirements.txt"},
    }
    with pytest.raises(ApiError) as err:
        admin.submit(spec, None)
    assert err.value.status_code == 422
    assert any(i["field"] == "environment.requirements" for i in err.value.issues), err.value.detail

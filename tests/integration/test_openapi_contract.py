"""The OpenAPI document tells the truth: schemathesis calls every operation of the real
control plane with generated input (valid and invalid), as an admin and as a member, and
no call answers 5xx or a status code the document does not declare for it.

It runs against its own control plane (own home and state, the session's Ray cluster), so
the teams, tokens and objects that generated admin calls create cannot reach other tests.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import status_code_conformance

from harness import ControlPlaneProc, free_port

pytestmark = pytest.mark.ray

EXAMPLES = 25  # per operation, mode and token: the whole test stays within ~3 minutes
# The gateway's OpenAI routes answer errors in OpenAI's format, not the API's ErrorBody.
OPENAI_ROUTES = {
    "GET /v1/models",
    "POST /v1/completions",
    "POST /v1/chat/completions",
    "POST /v1/embeddings",
}
# The artifacts layer's routes are exercised by schemathesis but declare their own errors.
UNDECLARED_PREFIXES = ("/v1/artifacts",)


@pytest.fixture(scope="module")
def contract_cp(session_home, ray_cluster):
    cluster, _ = ray_cluster
    cp = ControlPlaneProc(
        session_home / "cp-contract", cluster.address, free_port(), shared=session_home / "shared"
    )
    cp.start()
    yield cp
    cp.stop()


@pytest.fixture(scope="module")
def tokens(contract_cp):
    admin = contract_cp.client()
    admin.create_team("contract-a")
    member = admin.create_token("contract-member", team="contract-a")["token"]
    admin.submit(
        {"kind": "job", "name": "contract-job", "team": "contract-a", "command": "true"}, None
    )
    return {"admin": contract_cp.admin_token, "member": member}


def _operations(url: str):
    schema = schemathesis.openapi.from_url(url + "/openapi.json")
    for result in schema.get_all_operations():
        op = result.ok()
        label = f"{op.method.upper()} {op.path}"
        if not op.path.startswith("/v1/") and op.path not in ("/healthz", "/metrics"):
            continue  # the dashboard's static files
        yield label, op


def _exercise(op, url: str, token: str, failures: list) -> None:
    strategy = op.as_strategy(GenerationMode.POSITIVE) | op.as_strategy(GenerationMode.NEGATIVE)

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def run(case):
        headers = {"Authorization": f"Bearer {token}"}
        response = case.call(base_url=url, headers=headers, timeout=30)
        try:
            case.validate_response(
                response, checks=[not_a_server_error, status_code_conformance], headers=headers
            )
        except (Exception, BaseExceptionGroup) as exc:  # noqa: BLE001 - gather every failure
            failures.append(
                f"{op.method.upper()} {op.path} -> {response.status_code}: {str(exc)[:300]}"
            )

    run()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("role", ["admin", "member"])
def test_every_operation_keeps_the_documented_contract(contract_cp, tokens, role):
    failures: list[str] = []
    labels = []
    for label, op in _operations(contract_cp.url):
        labels.append(label)
        _exercise(op, contract_cp.url, tokens[role], failures)
    assert {
        "POST /v1/jobs",
        "POST /v1/services",
        "PUT /v1/budgets/{team}",
        "PUT /v1/limits/teams/{team}",
        "GET /v1/usage/tokens",
        "POST /v1/artifacts/uploads",
        "GET /metrics",
        "POST /v1/chat/completions",
    } <= set(labels)
    assert not failures, "\n".join(dict.fromkeys(failures))


def test_every_v1_route_declares_its_error_statuses(contract_cp):
    import httpx

    doc = httpx.get(contract_cp.url + "/openapi.json").json()
    for path, item in doc["paths"].items():
        if not path.startswith("/v1/") or path.startswith(UNDECLARED_PREFIXES):
            continue
        for method, op in item.items():
            codes = set(op["responses"])
            assert "401" in codes, f"{method} {path}"
            if f"{method.upper()} {path}" in OPENAI_ROUTES:
                continue
            if "requestBody" in op:
                assert {"400", "413", "422"} <= codes, f"{method} {path}"
            for code in codes - {"200", "201", "204"}:
                schema = op["responses"][code]["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/ErrorBody"}, f"{method} {path}"

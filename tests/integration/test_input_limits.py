"""Any input, however malformed or huge, gets a 4xx naming the field, never a 500, and
nothing is stored. Against the real control plane, over loopback."""

from __future__ import annotations

import base64
import io
import json
import socket
import tarfile

import httpx
import pytest

from aicluster.api.limits import DEFAULT_LIMIT

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def http(control_plane, admin):
    if "lim-a" not in admin.teams():
        admin.create_team("lim-a")
    with httpx.Client(
        base_url=control_plane.url,
        timeout=60,
        headers={"Authorization": f"Bearer {control_plane.admin_token}"},
    ) as c:
        yield c


def _raw(http, method: str, path: str, text: str | bytes) -> httpx.Response:
    return http.request(method, path, content=text, headers={"content-type": "application/json"})


def _detail(r: httpx.Response) -> dict:
    detail = r.json()["detail"]
    assert isinstance(detail, dict) and detail["message"], r.text
    return detail


def _job_names(http) -> set[str]:
    r = http.get("/v1/jobs")
    assert r.status_code == 200, r.text
    return {j["name"] for j in r.json()["jobs"]}


JOB = '{"spec": {"kind": "job", "name": "%s", "team": "lim-a", "command": "true", %s}}'


@pytest.mark.parametrize(
    "name,fields,field",
    [
        ("inf-cpus", '"resources": {"cpus": 1e309}', "spec.resources.cpus"),
        ("nan-cpus", '"resources": {"cpus": NaN}', "spec.resources.cpus"),
        ("inf-pending", '"max_pending_seconds": Infinity', "spec.max_pending_seconds"),
        ("big-gpus", '"resources": {"gpus": 18446744073709551616}', "spec.resources.gpus"),
    ],
)
def test_non_finite_job_numbers_are_refused_and_not_stored(http, name, fields, field):
    r = _raw(http, "POST", "/v1/jobs", JOB % (name, fields))
    assert r.status_code == 422, r.text
    assert _detail(r)["field"] == field
    assert name not in _job_names(http)  # and the listing still answers
    assert http.get("/v1/jobs", params={"team": "lim-a"}).status_code == 200


@pytest.mark.parametrize(
    "fields,field",
    [
        ('"resources": {"memory": 1e30}', "resources.memory"),
        ('"resources": {"cpus": 5000}', "resources.cpus"),
        ('"resources": {"gpus": 2000}', "resources.gpus"),
    ],
)
def test_resources_beyond_sane_maxima_are_refused_at_submit(http, fields, field):
    r = _raw(http, "POST", "/v1/jobs", JOB % ("too-big", fields))
    assert r.status_code == 422, r.text
    assert _detail(r)["field"] == field
    assert "too-big" not in _job_names(http)


def test_non_finite_service_timeout_is_refused_and_listing_answers(http):
    body = (
        '{"spec": {"kind": "service", "name": "inf-svc", "team": "lim-a", "model": "m", '
        '"readiness_timeout_s": 1e309}}'
    )
    r = _raw(http, "POST", "/v1/services", body)
    assert r.status_code == 422 and _detail(r)["field"] == "spec.readiness_timeout_s"
    r = http.get("/v1/services")
    assert r.status_code == 200 and "inf-svc" not in {s["name"] for s in r.json()["services"]}


def test_a_service_document_sent_to_jobs_says_where_it_goes(http):
    r = http.post("/v1/jobs", json={"spec": {"kind": "service", "name": "svc", "model": "m"}})
    assert r.status_code == 422, r.text
    assert _detail(r)["field"] == "kind" and "/v1/services" in r.text


def test_a_ten_megabyte_command_is_refused(http):
    r = http.post(
        "/v1/jobs",
        json={
            "spec": {
                "kind": "job",
                "name": "long-cmd",
                "team": "lim-a",
                "command": "x" * 10_000_000,
            }
        },
    )
    assert r.status_code == 422 and _detail(r)["field"] == "command"
    assert "long-cmd" not in _job_names(http)


def _tar(members) -> str:
    bio = io.BytesIO()
    with tarfile.open(fileobj=bio, mode="w:gz", compresslevel=1) as tar:
        for info, data in members:
            tar.addfile(info, data)
    return base64.b64encode(bio.getvalue()).decode()


class _Zeros(io.RawIOBase):
    def __init__(self, n: int):
        self.left = n

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = min(len(b), self.left)
        b[:n] = bytes(n)
        self.left -= n
        return n


def _bomb() -> str:
    """About 1 MiB of .tar.gz that unpacks to 1.1 GiB of zeros."""
    big = tarfile.TarInfo("zeros")
    big.size = int(1.1 * 2**30)
    return _tar([(big, io.BufferedReader(_Zeros(big.size), 2**20))])


def _outside_link() -> str:
    info = tarfile.TarInfo("escape")
    info.type, info.linkname = tarfile.SYMTYPE, "../../../../etc/passwd"
    return _tar([(info, None)])


@pytest.mark.parametrize(
    "make,why",
    [
        (lambda: base64.b64encode(b"plain text, not gzip").decode(), "not a gzip"),
        (lambda: "%%% not base64 %%%", "base64"),
        (_bomb, "unpacks to more than"),
        (_outside_link, "outside"),
    ],
)
def test_bad_workdirs_are_refused_at_submit(http, make, why):
    spec = {"kind": "job", "name": "bad-workdir", "team": "lim-a", "command": "true"}
    r = http.post("/v1/jobs", json={"spec": spec, "workdir": make()})
    assert r.status_code == 400, r.text
    assert _detail(r)["field"] == "workdir" and why in r.text
    assert "bad-workdir" not in _job_names(http)


@pytest.mark.parametrize("name", ["Bad", "a/b", "../x", "a\nb", "", "x" * 64, "a b", "é"])
def test_invalid_team_names_are_refused(http, name):
    r = http.post("/v1/teams", json={"name": name})
    assert r.status_code == 422, r.text
    assert _detail(r)["field"] == "name"
    assert name not in http.get("/v1/teams").json()["teams"]


@pytest.mark.parametrize("user", ["../../evil\nFAKE", "Root", "a/b", "a\x00b", "x" * 100])
def test_invalid_user_names_are_refused(http, user):
    r = http.post("/v1/tokens", json={"user": user, "team": "lim-a"})
    assert r.status_code == 422 and _detail(r)["field"] == "user", r.text


@pytest.mark.parametrize("pool", ["a%0Ab", "a%00b", "GPU", "a%1Bb", "a..b", "a%20b"])
def test_pool_names_with_control_characters_are_refused(http, pool):
    r = http.put(f"/v1/teams/lim-a/quotas/{pool}", json={"gpus": 1})
    assert r.status_code == 422 and _detail(r)["field"] == "pool", r.text
    assert all(q["pool"] != pool for q in http.get("/v1/quotas").json()["quotas"])


@pytest.mark.parametrize(
    "method,path,params,field",
    [
        ("GET", "/v1/events", {"after": 2**64}, "after"),
        ("GET", "/v1/events", {"after": 2**63}, "after"),
        ("GET", "/v1/jobs/x/logs", {"offset": 2**64}, "offset"),
        ("GET", "/v1/jobs/x/logs", {"rank": 2**64}, "rank"),
        ("GET", "/v1/jobs/x/logs", {"attempt": 2**64}, "attempt"),
        ("GET", "/v1/jobs/x/logs", {"rank": -1}, "rank"),
    ],
)
def test_integers_past_64_bits_in_queries_are_refused(http, method, path, params, field):
    r = http.request(method, path, params=params)
    assert r.status_code == 422 and _detail(r)["field"] == field, r.text


@pytest.mark.parametrize("gpus", ["18446744073709551616", "9223372036854775808", "1e400"])
def test_huge_quota_numbers_are_refused(http, gpus):
    r = _raw(http, "PUT", "/v1/teams/lim-a/quotas/p-huge", '{"gpus": %s}' % gpus)
    assert r.status_code == 422 and _detail(r)["field"] == "gpus", r.text
    assert all(q["pool"] != "p-huge" for q in http.get("/v1/quotas").json()["quotas"])


@pytest.mark.parametrize(
    "method,path",
    [
        ("POST", "/v1/jobs"),
        ("POST", "/v1/teams"),
        ("POST", "/v1/tokens"),
        ("PUT", "/v1/teams/lim-a/quotas/gpu"),
        ("POST", "/v1/services"),
        ("POST", "/v1/services/x/scale"),
        ("POST", "/v1/nodes/x/cordon"),
    ],
)
@pytest.mark.parametrize("depth", [100_000, 64])
def test_deeply_nested_json_is_a_400(http, method, path, depth):
    r = _raw(http, method, path, "[" * depth + "]" * depth)
    assert r.status_code == 400, r.text
    assert "nested" in _detail(r)["message"]
    r = _raw(http, method, path, '{"spec": ' + '{"a": ' * depth + "1" + "}" * depth + "}")
    assert r.status_code == 400, r.text


def _raw_request(url: str, head: str, chunks=(), read_first=False) -> tuple[int, int]:
    """Sends `head` and then `chunks` on a raw socket; returns (status, bytes of body sent).
    With read_first, nothing more is sent once the answer starts coming."""
    host, port = url.removeprefix("http://").split(":")
    sent = 0
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(head.encode())
        s.setblocking(False)
        for chunk in chunks:
            try:
                if s.recv(1, socket.MSG_PEEK):
                    break  # the answer came before the whole body was sent
            except BlockingIOError:
                pass
            try:
                s.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError, BlockingIOError):
                break
            sent += len(chunk)
        s.setblocking(True)
        data = b""
        while b"\r\n" not in data:
            more = s.recv(4096)
            if not more:
                break
            data += more
    return int(data.split(b" ", 2)[1]), sent


def test_an_anonymous_oversized_post_gets_413_before_the_body_is_read(control_plane):
    head = (
        "POST /v1/teams HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {200 * 2**20}\r\n\r\n"
    )
    status, _ = _raw_request(control_plane.url, head)  # not one byte of the body is sent
    assert status == 413
    status, _ = _raw_request(control_plane.url, head.replace("/v1/teams", "/v1/jobs"))
    assert status == 413  # a submission's limit is larger, but not 200 MB


def test_an_anonymous_chunked_post_is_cut_off_with_413(control_plane):
    head = (
        "POST /v1/teams HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    )
    piece = 64 * 1024
    chunk = f"{piece:x}\r\n".encode() + b" " * piece + b"\r\n"
    status, sent = _raw_request(control_plane.url, head, [chunk] * (200 * 2**20 // piece))
    assert status == 413
    assert sent < 20 * 2**20  # cut off near the 1 MiB limit, not after 200 MB


def test_bodies_under_their_family_limit_reach_authentication(control_plane):
    r = httpx.post(
        control_plane.url + "/v1/jobs",
        timeout=60,
        json={"spec": {}, "workdir": "A" * (2 * DEFAULT_LIMIT)},
    )
    assert r.status_code == 401  # a 2 MiB submission is within the submission limit
    r = httpx.post(
        control_plane.url + "/v1/teams",
        content=b" " * (2 * DEFAULT_LIMIT),
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 413 and json.loads(r.text)["detail"]["field"] == "(body)"

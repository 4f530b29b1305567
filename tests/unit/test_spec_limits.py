"""Bounds on user input: specs, names, working-directory archives, JSON bodies."""

from __future__ import annotations

import io
import tarfile

import pytest
from fastapi import HTTPException

from aicluster.api.limits import DEFAULT_LIMIT, SUBMIT_LIMIT, body_limit
from aicluster.api.strict_json import MAX_DEPTH, finite, loads
from aicluster.specs.errors import SpecError
from aicluster.specs.limits import MAX_MEMORY, MAX_WORKDIR_BYTES
from aicluster.specs.loader import load_spec_text, validate_spec
from aicluster.specs.names import check_name, is_name
from aicluster.specs.workdir import WorkdirInvalid, check_workdir_archive

JOB = {"kind": "job", "name": "j", "command": "true"}
SERVICE = {"kind": "service", "name": "s", "model": "m"}


def _issues(doc: dict) -> list[dict]:
    with pytest.raises(SpecError) as exc:
        validate_spec(doc)
    return exc.value.to_dict()["issues"]


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
@pytest.mark.parametrize(
    "doc,field",
    [
        ({**JOB, "resources": {"cpus": None}}, "resources.cpus"),
        ({**JOB, "max_pending_seconds": None}, "max_pending_seconds"),
        ({**SERVICE, "readiness_timeout_s": None}, "readiness_timeout_s"),
        ({**SERVICE, "autoscaling": {"upscale_delay_s": None}}, "autoscaling.upscale_delay_s"),
        ({**SERVICE, "engine_args": {"x": None}}, "engine_args.x"),
        ({**SERVICE, "routing": {"options": {"x": None}}}, "routing.options.x"),
    ],
)
def test_non_finite_numbers_are_refused_in_every_spec(doc, field, value):
    doc = _put(doc, field, value)
    assert {i["field"] for i in _issues(doc)} == {field}


def _put(doc: dict, dotted: str, value) -> dict:
    doc = {k: (dict(v) if isinstance(v, dict) else v) for k, v in doc.items()}
    *parents, last = dotted.split(".")
    node = doc
    for p in parents:
        node[p] = dict(node.get(p) or {})
        node = node[p]
    node[last] = value
    return doc


def test_yaml_infinity_names_field_and_line():
    with pytest.raises(SpecError) as exc:
        load_spec_text("kind: job\nname: a\ncommand: x\nresources:\n  cpus: .inf\n")
    assert "line 5: resources.cpus" in str(exc.value)


@pytest.mark.parametrize(
    "resources,field",
    [
        ({"memory": 1e30}, "resources.memory"),
        ({"memory": MAX_MEMORY + 1}, "resources.memory"),
        ({"memory": "2000Ti"}, "resources.memory"),
        ({"cpus": 4097}, "resources.cpus"),
        ({"gpus": 1025}, "resources.gpus"),
        ({"gpus": 2**64}, "resources.gpus"),
    ],
)
def test_resources_are_capped(resources, field):
    assert [i["field"] for i in _issues({**JOB, "resources": resources})] == [field]
    assert _issues({**SERVICE, "resources": resources})[0]["field"] == field


def test_resources_within_caps_are_accepted():
    spec = validate_spec({**JOB, "resources": {"memory": MAX_MEMORY, "cpus": 4096, "gpus": 1024}})
    assert (spec.resources.memory, spec.resources.cpus, spec.resources.gpus) == (
        MAX_MEMORY,
        4096,
        1024,
    )
    assert validate_spec({**JOB, "resources": {"memory": 1e9}}).resources.memory == 10**9


@pytest.mark.parametrize("command", ["x" * (64 * 1024 + 1), ["a"] * 5000, ["x" * 40000] * 2])
def test_command_length_is_capped(command):
    assert [i["field"] for i in _issues({**JOB, "command": command})] == ["command"]


def test_env_is_capped():
    assert _issues({**JOB, "env": {"A": "x" * (64 * 1024 + 1)}})[0]["field"] == "env"
    assert _issues({**JOB, "env": {f"V{i}": "1" for i in range(1025)}})[0]["field"] == "env"


@pytest.mark.parametrize("name", ["default", "team-a", "a", "a1", "x" * 63])
def test_valid_names(name):
    assert is_name(name) and check_name(name, "team") == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "-a",
        "a-",
        "A",
        "a_b",
        "a.b",
        "a/b",
        "../../evil\nFAKE",
        "a\x00b",
        "a\nb",
        "x" * 64,
        " a",
        "é",
        None,
        3,
    ],
)
def test_invalid_names(name):
    assert not is_name(name)
    with pytest.raises(ValueError, match="invalid pool"):
        check_name(name, "pool")


def _tar(members, level=6) -> bytes:
    bio = io.BytesIO()
    with tarfile.open(fileobj=bio, mode="w:gz", compresslevel=level) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return bio.getvalue()


def _file(name: str, data: bytes = b"") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _link(name: str, target: str, kind=tarfile.SYMTYPE) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, None


def test_a_plain_workdir_archive_is_accepted():
    check_workdir_archive(_tar([_file("train.py", b"print(1)"), _link("cur", "train.py")]))
    # the worker's "data" filter unpacks "/x" as "x", inside the working directory
    check_workdir_archive(_tar([_file("/etc/cron.d/x", b"1")]))


@pytest.mark.parametrize(
    "blob,why",
    [
        (b"just text", "not a gzip"),
        (b"\x1f\x8b\x08garbage", "not a valid"),
        (_tar([_file("../up", b"1")]), "outside"),
        (_tar([_link("l", "../../etc/passwd")]), "outside"),
        (_tar([_link("l", "/etc/passwd")]), "absolute"),
        (_tar([_link("h", "../../etc/passwd", tarfile.LNKTYPE)]), "outside"),
    ],
)
def test_bad_workdir_archives_are_refused(blob, why):
    with pytest.raises(WorkdirInvalid, match=why):
        check_workdir_archive(blob)


def test_workdir_unpacked_size_and_file_count_are_capped():
    with pytest.raises(WorkdirInvalid, match="unpacks to more than"):
        check_workdir_archive(_tar([_file(f"f{i}", b"x" * 600) for i in range(3)]), max_bytes=1000)
    with pytest.raises(WorkdirInvalid, match="more than 10 files"):
        check_workdir_archive(_tar([_file(f"f{i}") for i in range(11)]), max_files=10)
    check_workdir_archive(
        _tar([_file(f"f{i}", b"x" * 100) for i in range(10)]), max_bytes=1000, max_files=10
    )


def test_strict_json_refuses_non_finite_and_huge_numbers_naming_the_field():
    for text, field in [
        ('{"a": {"b": 1e309}}', "a.b"),
        ('{"a": [1, NaN]}', "a.1"),
        ('{"x": -Infinity}', "x"),
        ('{"n": 18446744073709551616}', "n"),
        ('{"n": ' + "9" * 5000 + "}", "n"),
    ]:
        with pytest.raises(HTTPException) as exc:
            loads(text)
        assert exc.value.status_code == 422 and exc.value.detail["field"] == field
    assert loads('{"a": [1.5, -9223372036854775808, 9223372036854775807]}') == {
        "a": [1.5, -(2**63), 2**63 - 1]
    }


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 100_000])
def test_strict_json_refuses_deep_nesting_with_400(depth):
    with pytest.raises(HTTPException) as exc:
        loads("[" * depth + "]" * depth)
    assert exc.value.status_code == 400 and "nested" in exc.value.detail["message"]
    assert loads("[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1)) is not None


def test_strict_json_refuses_non_utf8():
    with pytest.raises(HTTPException) as exc:
        loads(b'{"a": "\xff\xfe\xfa"}')
    assert exc.value.status_code == 400


def test_finite_replaces_non_finite_values():
    assert finite({"a": [1.0, float("inf")], "b": {"c": float("nan")}, "d": "x"}) == {
        "a": [1.0, None],
        "b": {"c": None},
        "d": "x",
    }


def test_body_limits_by_route_family():
    assert body_limit("POST", "/v1/teams") == DEFAULT_LIMIT
    assert body_limit("POST", "/v1/jobs") == SUBMIT_LIMIT > MAX_WORKDIR_BYTES * 4 // 3
    assert body_limit("PUT", "/v1/artifacts/uploads/u1/blobs/" + "a" * 64) is None
    assert body_limit("POST", "/v1/artifacts/uploads") > DEFAULT_LIMIT
    assert body_limit("POST", "/v1/chat/completions") > DEFAULT_LIMIT
    assert body_limit("POST", "/api/chat") == body_limit("POST", "/v1/chat/completions")
    assert body_limit("POST", "/api/generate") == body_limit("POST", "/v1/completions")
    assert body_limit("POST", "/v1/jobs/x/cancel") == DEFAULT_LIMIT

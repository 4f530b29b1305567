"""Job specs: strict validation with errors that name the field and its line."""

from __future__ import annotations

import pytest

from aicluster.specs import (
    JobSpec,
    Resources,
    SpecError,
    load_spec,
    load_spec_text,
    parse_memory,
    spec_json_schema,
)
from aicluster.specs.errors import SpecIssue

Ki, Mi, Gi = 2**10, 2**20, 2**30

FULL = """\
kind: job
name: train-llm-7b
team: nlp
workers: 4
resources:
  cpus: 8.5
  memory: 64Gi
  gpus: 2
  gpu_model: H100
command: [python, train.py, --epochs, "3"]
env:
  NCCL_DEBUG: INFO
  _PRIVATE2: "x"
working_dir: ./src
priority: 10
max_restarts: 3
max_pending_seconds: 600
"""


def issues_of(text: str) -> list[SpecIssue]:
    with pytest.raises(SpecError) as info:
        load_spec_text(text)
    assert info.value.issues, "a SpecError always carries at least one issue"
    return info.value.issues


def only_issue(text: str) -> SpecIssue:
    issues = issues_of(text)
    assert len(issues) == 1, issues
    return issues[0]


# -- good specs --------------------------------------------------------------------


def test_minimal_spec_gets_defaults():
    spec = load_spec_text("kind: job\nname: hello\ncommand: echo hi\n")
    assert isinstance(spec, JobSpec)
    assert spec.kind == "job"
    assert spec.name == "hello"
    assert spec.command == "echo hi"
    assert spec.team == "default"
    assert spec.workers == 1
    assert spec.resources == Resources(cpus=1.0, memory=0, gpus=0, gpu_model=None)
    assert spec.env == {}
    assert spec.working_dir is None
    assert spec.priority == 0
    assert spec.max_restarts == 0
    assert spec.max_pending_seconds is None


def test_full_spec_keeps_every_field():
    spec = load_spec_text(FULL)
    assert spec.name == "train-llm-7b"
    assert spec.team == "nlp"
    assert spec.workers == 4
    assert spec.resources == Resources(cpus=8.5, memory=64 * Gi, gpus=2, gpu_model="H100")
    assert spec.command == ["python", "train.py", "--epochs", "3"]
    assert spec.env == {"NCCL_DEBUG": "INFO", "_PRIVATE2": "x"}
    assert spec.working_dir == "./src"
    assert spec.priority == 10
    assert spec.max_restarts == 3
    assert spec.max_pending_seconds == 600.0


def test_full_spec_from_a_file(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(FULL, encoding="utf-8")
    assert load_spec(path) == load_spec_text(FULL)
    assert load_spec(str(path)) == load_spec_text(FULL)


def test_spec_round_trips_through_its_dump():
    spec = load_spec_text(FULL)
    assert JobSpec.model_validate(spec.model_dump()) == spec


def test_command_as_a_list():
    spec = load_spec_text("kind: job\nname: a\ncommand:\n  - python\n  - -c\n  - print(1)\n")
    assert spec.command == ["python", "-c", "print(1)"]


def test_leading_comments_and_blank_lines_are_fine():
    spec = load_spec_text("# my job\n\nkind: job\nname: a\ncommand: x\n")
    assert spec.name == "a"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("512Mi", 512 * Mi),
        ("2Gi", 2 * Gi),
        ("1G", 10**9),
        ("1.5G", 1_500_000_000),
        ("1Ki", Ki),
        ("1k", 1000),
        ("3MB", 3 * 10**6),
        ("1GiB", Gi),
        ("2gi", 2 * Gi),
        (" 4 Gi ", 4 * Gi),
        ("100", 100),
        (1048576, 1048576),
        (0, 0),
    ],
)
def test_memory_units(text, expected):
    assert parse_memory(text) == expected
    value = f"'{text}'" if isinstance(text, str) else str(text)
    spec = load_spec_text(f"kind: job\nname: a\ncommand: x\nresources:\n  memory: {value}\n")
    assert spec.resources.memory == expected


def test_memory_in_bytes_as_a_yaml_integer():
    spec = load_spec_text("kind: job\nname: a\ncommand: x\nresources:\n  memory: 2147483648\n")
    assert spec.resources.memory == 2 * Gi


@pytest.mark.parametrize(
    "bad", ["2Zi", "abc", "", "Gi", "-1Gi", "1e9", "1.2.3G", True, -1, None, [1]]
)
def test_parse_memory_rejects_garbage(bad):
    with pytest.raises(ValueError):
        parse_memory(bad)


def test_resources_built_in_code_accept_memory_sizes():
    # Resources built in code accept the same sizes as YAML.
    assert Resources(memory="2Gi").memory == 2 * Gi


# -- bad specs: field, message, line ----------------------------------------------


def test_unknown_top_level_field():
    issue = only_issue("kind: job\nname: a\ncommand: x\ngpus: 1\n")
    assert issue == SpecIssue(field="gpus", message="unknown field", line=4)


def test_unknown_field_nested_under_resources_is_reported_at_its_own_line():
    text = "kind: job\nname: a\ncommand: x\nresources:\n  gpus: 1\n  gpu: 2\n  cpus: 1\n"
    issue = only_issue(text)
    assert issue == SpecIssue(field="resources.gpu", message="unknown field", line=6)


def test_every_issue_is_reported_not_just_the_first():
    text = (
        "kind: job\nname: a\ncommand: x\nresources:\n  gpus: 1\n  colour: red\nworkers: 0\nfoo: 1\n"
    )
    issues = issues_of(text)
    assert {(i.field, i.line) for i in issues} == {
        ("resources.colour", 6),
        ("workers", 7),
        ("foo", 8),
    }
    assert {i.message for i in issues if i.field != "workers"} == {"unknown field"}


def test_wrong_type():
    issue = only_issue("kind: job\nname: a\ncommand: x\nworkers: many\n")
    assert issue.field == "workers"
    assert issue.line == 4
    assert "integer" in issue.message


def test_wrong_type_for_a_section():
    issue = only_issue("kind: job\nname: a\ncommand: x\nresources: 5\n")
    assert issue.field == "resources"
    assert issue.line == 4


def test_wrong_type_for_command_names_the_field():
    issues = issues_of("kind: job\nname: a\ncommand: {run: x}\n")
    assert {i.field for i in issues} == {"command"}
    assert {i.line for i in issues} == {3}


@pytest.mark.parametrize("workers", [0, -1, 4097])
def test_workers_out_of_range(workers):
    issue = only_issue(f"kind: job\nname: a\ncommand: x\nworkers: {workers}\n")
    assert issue.field == "workers"
    assert issue.line == 4


@pytest.mark.parametrize(
    "name", ["Bad_Name", "UPPER", "-lead", "trail-", "has space", "a" * 64, "dot.ted", "''"]
)
def test_bad_name(name):
    issue = only_issue(f"kind: job\ncommand: x\nname: {name}\n")
    assert issue.field == "name"
    assert issue.line == 3


@pytest.mark.parametrize("name", ["a", "a1", "9lives", "my-job-2", "a" * 63])
def test_good_names(name):
    assert load_spec_text(f"kind: job\ncommand: x\nname: {name}\n").name == name


def test_bad_team_name():
    issue = only_issue("kind: job\nname: a\nteam: My Team\ncommand: x\n")
    assert (issue.field, issue.line) == ("team", 3)


def test_bad_memory_string():
    issue = only_issue("kind: job\nname: a\ncommand: x\nresources:\n  cpus: 2\n  memory: 2Zi\n")
    assert issue.field == "resources.memory"
    assert issue.line == 6
    assert "invalid memory size '2Zi'" in issue.message


def test_boolean_memory_is_rejected():
    issue = only_issue("kind: job\nname: a\ncommand: x\nresources:\n  memory: true\n")
    assert (issue.field, issue.line) == ("resources.memory", 5)


def test_negative_memory_is_rejected():
    issue = only_issue("kind: job\nname: a\ncommand: x\nresources:\n  memory: -5\n")
    assert issue.field == "resources.memory"
    assert issue.message == "memory must not be negative"


def test_infinite_memory_is_a_spec_error():
    issue = only_issue("kind: job\nname: a\ncommand: x\nresources:\n  memory: .inf\n")
    assert (issue.field, issue.line) == ("resources.memory", 5)


def test_negative_resources_are_rejected():
    issues = issues_of("kind: job\nname: a\ncommand: x\nresources:\n  cpus: -1\n  gpus: -2\n")
    assert {(i.field, i.line) for i in issues} == {("resources.cpus", 5), ("resources.gpus", 6)}


def test_blank_gpu_model_is_rejected():
    issue = only_issue("kind: job\nname: a\ncommand: x\nresources:\n  gpu_model: '  '\n")
    assert issue.field == "resources.gpu_model"
    assert issue.message == "gpu_model must not be empty"
    assert issue.line == 5


@pytest.mark.parametrize("command", ["''", "'   '", "[]"])
def test_empty_command(command):
    issue = only_issue(f"kind: job\nname: a\ncommand: {command}\n")
    assert issue == SpecIssue(field="command", message="command must not be empty", line=3)


def test_missing_command():
    issue = only_issue("kind: job\nname: a\n")
    assert issue.field == "command"
    assert issue.line == 1


def test_missing_kind():
    issue = only_issue("name: a\ncommand: x\n")
    assert issue.field == "kind"
    assert issue.message.startswith("missing; expected one of: job, service")
    assert issue.line == 1


def test_unknown_kind_on_the_first_line():
    issue = only_issue("kind: workflow\nname: a\ncommand: x\n")
    assert (issue.field, issue.line) == ("kind", 1)
    assert issue.message.startswith("unknown kind; expected one of: job, service")


def test_unknown_kind_is_reported_at_the_kind_line():
    issue = only_issue("name: a\ncommand: x\nkind: workflow\n")
    assert (issue.field, issue.line) == ("kind", 3)


@pytest.mark.parametrize(
    "text, line",
    [
        ("kind: job\nname: a\n  command: x\n", 3),
        ("kind: job\nname: [a\n", 3),
        ("kind: job\nname: a\ncommand: x\n\tworkers: 1\n", 4),
        ("kind: job\nname: a\ncommand: 'x\n", 4),
    ],
)
def test_invalid_yaml_reports_its_line(text, line):
    issue = only_issue(text)
    assert issue.field == "(document)"
    assert issue.message.startswith("invalid YAML: ")
    assert issue.line == line


def test_more_than_one_document_is_invalid():
    issue = only_issue("kind: job\nname: a\ncommand: x\n---\nkind: job\n")
    assert issue.field == "(document)"
    assert issue.message.startswith("invalid YAML")


@pytest.mark.parametrize("text", ["", "# only a comment\n", "- a\n- b\n", "just text\n", "42\n"])
def test_non_mapping_document(text):
    issue = only_issue(text)
    assert issue == SpecIssue("(document)", "expected a mapping with a 'kind'", 1)


@pytest.mark.parametrize("key", ["1BAD", "HAS-DASH", "has space", "A.B", "''"])
def test_bad_env_var_name(key):
    issue = only_issue(f"kind: job\nname: a\ncommand: x\nenv:\n  OK: v\n  {key}: v\n")
    assert issue.field == "env"
    assert issue.line == 4
    assert issue.message.startswith("invalid environment variable name")


def test_numeric_env_values_become_text():
    spec = load_spec_text("kind: job\nname: a\ncommand: x\nenv:\n  A: a\n  PORT: 8080\n  R: 0.5\n")
    assert spec.env == {"A": "a", "PORT": "8080", "R": "0.5"}


def test_env_values_must_be_scalars():
    issue = only_issue("kind: job\nname: a\ncommand: x\nenv:\n  A: a\n  L: [1, 2]\n")
    assert (issue.field, issue.line) == ("env.L", 6)


def test_boolean_is_not_a_worker_count():
    issue = only_issue("kind: job\nname: a\ncommand: x\nworkers: true\n")
    assert (issue.field, issue.line) == ("workers", 4)


def test_unreadable_file_path(tmp_path):
    path = tmp_path / "missing.yaml"
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert info.value.source == str(path)
    (issue,) = info.value.issues
    assert issue.field == "(file)"
    assert issue.message.startswith("cannot read")
    assert issue.line is None


def test_a_directory_is_not_a_readable_spec(tmp_path):
    with pytest.raises(SpecError) as info:
        load_spec(tmp_path)
    assert info.value.issues[0].field == "(file)"


def test_errors_from_a_file_name_the_file_and_line(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("kind: job\nname: a\ncommand: x\nwrkers: 2\n", encoding="utf-8")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    err = info.value
    assert err.source == str(path)
    assert err.issues == [SpecIssue("wrkers", "unknown field", 4)]
    assert str(err) == f"invalid spec {path}:\n  line 4: wrkers: unknown field"
    assert err.to_dict() == {
        "source": str(path),
        "issues": [{"field": "wrkers", "line": 4, "message": "unknown field"}],
    }


def test_issue_without_line_renders_without_a_prefix():
    assert str(SpecIssue("(file)", "cannot read: x")) == "(file): cannot read: x"


@pytest.mark.parametrize(
    "text",
    [
        "kind: job\nname: 5\ncommand: x\n",
        "kind: [job]\nname: a\ncommand: x\n",
        "kind: job\nname: a\ncommand: x\n1: x\n",
        "kind: job\nname: a\ncommand: x\nenv: [a]\n",
        "kind: job\nname: a\ncommand: [x, [y]]\n",
        "kind: job\nname: a\ncommand: x\nresources: {memory: .nan}\n",
        "kind: job\nname: a\ncommand: x\nmax_pending_seconds: 0\n",
        "kind: job\nname: a\ncommand: x\npriority: 1001\n",
        "kind: job\nname: a\ncommand: x\nmax_restarts: -1\n",
        "kind: job\nname: a\ncommand: x\nkey: !!python/object:os.system {}\n",
    ],
)
def test_bad_input_raises_only_spec_error(text):
    issues_of(text)


# -- JSON schema ------------------------------------------------------------------


def test_json_schema_describes_job_and_forbids_additional_properties():
    schema = spec_json_schema()
    assert schema["discriminator"]["propertyName"] == "kind"
    assert {"job", "service"} <= set(schema["discriminator"]["mapping"])
    defs = schema["$defs"]
    job = defs["JobSpec"]
    assert job["additionalProperties"] is False
    assert defs["Resources"]["additionalProperties"] is False
    assert set(job["required"]) == {"name", "command"}
    assert job["properties"]["kind"]["const"] == "job"
    assert set(job["properties"]) == set(JobSpec.model_fields)

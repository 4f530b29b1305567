"""The operator's log (control.oplog): key=value lines, and one JSON object per line."""

from __future__ import annotations

import io
import json
import logging
import sys

import pytest

from aicluster.control.oplog import JsonFormatter, configure_logging, decision, formatter


def _record(caplog, event: str, **fields) -> logging.LogRecord:
    with caplog.at_level(logging.INFO, logger="aicluster.test"):
        decision(logging.getLogger("aicluster.test"), event, **fields)
    return caplog.records[-1]


def test_a_decision_is_one_key_value_line_with_awkward_values_quoted(caplog):
    rec = _record(
        caplog,
        "job_failed",
        job="train-1a2b3c",
        placement=["n1", "n2"],
        restarts=None,
        message='rank 0: node "x" died\nagain',
    )
    assert rec.getMessage() == (
        "job_failed job=train-1a2b3c placement=n1,n2 restarts=- "
        'message="rank 0: node \\"x\\" died\\nagain"'
    )
    assert rec.event == "job_failed" and rec.fields["placement"] == ["n1", "n2"]


def test_the_json_formatter_writes_one_object_per_line_with_the_fields(caplog):
    rec = _record(caplog, "job_admitted", job="j-1", attempt=2, placement=("n1",), msg="x")
    line = JsonFormatter().format(rec)
    assert "\n" not in line and "\x1b" not in line
    obj = json.loads(line)
    assert obj["event"] == "job_admitted" and obj["logger"] == "aicluster.test"
    assert (obj["job"], obj["attempt"], obj["placement"]) == ("j-1", 2, ["n1"])
    assert obj["level"] == "INFO" and obj["time"].endswith("Z") and obj["ts"] > 0
    assert obj["msg"].startswith("job_admitted job=j-1 attempt=2"), "a field never hides msg"


def test_the_json_formatter_keeps_a_traceback_on_its_one_line():
    try:
        raise ValueError("boom")
    except ValueError:
        rec = logging.LogRecord(
            "aicluster.x", logging.ERROR, __file__, 1, "tick %s", ("failed",), None
        )
        rec.exc_info = sys.exc_info()
    line = JsonFormatter().format(rec)
    obj = json.loads(line)
    assert "\n" not in line and obj["msg"] == "tick failed" and "ValueError: boom" in obj["exc"]
    assert "event" not in obj


def test_configure_logging_sends_every_logger_through_the_chosen_format(monkeypatch):
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    try:
        configure_logging("json")
        decision(logging.getLogger("aicluster.decisions"), "node_lost", node="n9")
        logging.getLogger("some.library").warning("plain %s", "line")
        configure_logging("text")
        decision(logging.getLogger("aicluster.decisions"), "node_lost", node="n9")
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    first, second, third = stream.getvalue().splitlines()
    assert json.loads(first)["node"] == "n9" and json.loads(second)["msg"] == "plain line"
    assert third.endswith(" INFO aicluster.decisions: node_lost node=n9")
    with pytest.raises(ValueError, match="text, json"):
        formatter("yaml")

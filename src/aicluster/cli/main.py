"""`aicluster`: the command-line entry point (typer)."""

from __future__ import annotations

import typer

from aicluster.cli import (
    artifacts_cmds,
    audit_cmds,
    budgets_cmds,
    doctor_cmds,
    gateway_cmds,
    jobs_cmds,
    limits_cmds,
    nodes_cmds,
    plan_cmds,
    platform_cmds,
    services_cmds,
    state_cmds,
    tokens_cmds,
    usage_cmds,
)

app = typer.Typer(
    name="aicluster",
    help="Run AI jobs and services on one machine or many GPU servers.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
platform_cmds.register(app)
jobs_cmds.register(app)
nodes_cmds.register(app)
artifacts_cmds.register(app)
services_cmds.register(app)
plan_cmds.register(app)
usage_cmds.register(app)
budgets_cmds.register(app)
audit_cmds.register(app)
tokens_cmds.register(app)
limits_cmds.register(app)
state_cmds.register(app)
gateway_cmds.register(app)
doctor_cmds.register(app)

if __name__ == "__main__":
    app()

"""The Python SDK for the aicluster API: used by `aicluster.cli`, by code inside jobs
(`aicluster.runtime.checkpoint`) and by users' own programs.

    from aicluster.client import Client
    from aicluster.client import artifacts

    with Client(url, token) as c:
        job = c.submit_file("job.yaml")
        artifacts.push(c, "./model", "team/char-lm", "model")

`api` holds the `Client` (jobs, nodes, events, teams, tokens, quotas, services) and
its error type; `artifacts` the artifact calls (push and pull on the direct data
path). Nothing here imports the store: the SDK never loads SQLAlchemy.
"""

from aicluster.client.api import (
    TERMINAL,
    ApiError,
    Client,
    WorkdirError,
    error_from,
    node_action,
    pack_workdir,
)

__all__ = [
    "TERMINAL",
    "ApiError",
    "Client",
    "WorkdirError",
    "error_from",
    "node_action",
    "pack_workdir",
]

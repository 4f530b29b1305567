"""The real aicluster Gateway as its own process, for the benchmarks.

Run: `.venv/bin/python bench/_gateway_main.py --port N`.

Serves `Gateway(table, authenticate).router()` under uvicorn on 127.0.0.1, as the
gateway runs when it is deployed as a separate stateless process. The benchmark pushes
the endpoint table with `POST /bench/publish` (a JSON list of services), as the service
loop pushes it in the control plane.

authenticate: a token `bench-TEAM` is a member of team TEAM; anything else is refused.
Each benchmark run uses a fresh team, so each run gets a fresh routing-policy object
(the gateway keeps one per (team, service)).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from fastapi import FastAPI

from aicluster.control.endpoints import Endpoint, EndpointTable, ServiceEndpoints
from aicluster.gateway.proxy import Gateway
from aicluster.store.identity import Principal

TOKEN_PREFIX = "bench-"


def authenticate(token: str) -> Principal | None:
    if token.startswith(TOKEN_PREFIX) and len(token) > len(TOKEN_PREFIX):
        return Principal(user="bench", team=token[len(TOKEN_PREFIX) :], role="member")
    return None


def create_app() -> FastAPI:
    table = EndpointTable()
    gateway = Gateway(table, authenticate)
    app = FastAPI(title="aicluster gateway (bench)")
    app.include_router(gateway.router())

    @app.post("/bench/publish")
    async def publish(services: list[dict]) -> dict:
        changed = table.publish(
            {
                (s["team"], s["name"]): ServiceEndpoints(
                    team=s["team"],
                    name=s["name"],
                    engine="simulated",
                    routing=s["routing"],
                    routing_options=s.get("routing_options", {}),
                    replicas=tuple(Endpoint(r["id"], r["url"]) for r in s["replicas"]),
                )
                for s in services
            }
        )
        return {"changed": changed, "version": table.version}

    @app.get("/bench/health")
    async def health() -> dict:
        return {"ok": True}

    return app


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    uvicorn.run(
        create_app(), host="127.0.0.1", port=args.port, log_level="warning", access_log=False
    )


if __name__ == "__main__":
    main()

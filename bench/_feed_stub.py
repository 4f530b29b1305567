"""A stand-in control plane for benchmarks of `aicluster gateway` processes: it serves the
feed (`GET /v1/gateway/feed`, api.gateway_feed_routes' shape) with one service over the
given engine URLs and one member token per team (`bench-TEAM`), and acknowledges reports
and usage batches (counting them). No store, no Ray: only what a gateway process reads.

Run: `.venv/bin/python bench/_feed_stub.py --port N --engine URL [--engine URL ...]`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from fastapi import FastAPI, Request

from aicluster.store.identity import digest

ADMIN_TOKEN = "bench-admin-token"


def create_app(engines: list[str], team: str, model: str, routing: str) -> FastAPI:
    services = [
        {
            "team": team,
            "name": model,
            "engine": "simulated",
            "routing": routing,
            "routing_options": {},
            "served_model": "",
            "replicas": [
                {"replica_id": f"stub-r{i}", "url": url, "secret": ""}
                for i, url in enumerate(engines)
            ],
        }
    ]
    tokens = [[digest(f"bench-{team}"), 1, "bench", team, "member", None, False, None]]
    sections = {"services": services, "tokens": tokens, "limits": []}
    hashes = {
        k: hashlib.sha256(json.dumps(v, sort_keys=True).encode()).hexdigest()[:24]
        for k, v in sections.items()
    }
    counts = {"reports": 0, "usage_batches": 0}
    app = FastAPI()

    @app.get("/v1/gateway/feed")
    async def feed(request: Request):
        known = request.query_params
        changed = {k: v for k, v in sections.items() if known.get(k) != hashes[k]}
        if not changed:  # a long poll with nothing new: answer at once, the gateway asks again
            wait = min(float(known.get("wait", 0)), 2.0)
            import asyncio

            await asyncio.sleep(wait)
        return {"hashes": hashes, "sections": changed}

    @app.post("/v1/gateway/report")
    async def report():
        counts["reports"] += 1
        return {"ok": True}

    @app.post("/v1/gateway/usage")
    async def usage():
        counts["usage_batches"] += 1
        return {"accepted": True}

    @app.get("/bench/counts")
    async def show():
        return counts

    return app


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--engine", action="append", required=True)
    ap.add_argument("--team", default="gwproc")
    ap.add_argument("--model", default="sim")
    ap.add_argument("--routing", default="least_outstanding")
    args = ap.parse_args()
    app = create_app(args.engine, args.team, args.model, args.routing)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()

"""Soak: many concurrent streams through one `aicluster gateway` process for a while, bounded.

Run:  .venv/bin/python bench/gateway_soak.py                 (1,000 streams, 60 s; ~2 min)
      .venv/bin/python bench/gateway_soak.py --streams 200 --duration 20   (quick)

Starts 2 `simulated` engines (bench/_engine_main.py; each token costs `--token-ms`), the
real gateway process (gateway.process, fed by the stand-in control plane of
bench/_feed_stub.py), then `--streams` clients in a closed loop, each sending streaming chat
completions (`--max-tokens` tokens) until `--duration` seconds have passed: first straight to
the engines (the baseline, same client), then through the gateway. Reports per path:
streams completed, streams/s, errors, time to first chunk p50/p99, the largest gap between
two chunks p99; for the gateway also its resident memory after a warm-up and at the end
(growth, goal <= 10%) and its in-flight count once the clients stopped (goal 0).
Everything talks to 127.0.0.1 only; every loop stops by itself at the deadline.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _servers as S


async def run_clients(urls, headers, streams: int, duration: float, max_tokens: int) -> dict:
    body = {
        "model": S.MODEL,
        "messages": [{"role": "user", "content": "soak " * 16}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    out = {"done": 0, "errors": 0, "ttfc": [], "gap": [], "last_error": ""}
    # One client (one connection) per stream: a single httpx pool of N connections costs
    # O(N) per request (httpcore assigns requests by scanning every connection), which
    # made the benchmark's own client the bottleneck at a few hundred streams.
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    timeout = httpx.Timeout(60.0, connect=10.0, pool=60.0)
    stop = time.perf_counter() + duration

    async def one(i: int) -> None:
        async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
            await stream_loop(client, i)

    async def stream_loop(client: httpx.AsyncClient, i: int) -> None:
        url = urls[i % len(urls)]  # each stream keeps to one replica: its connection stays
        while time.perf_counter() < stop:
            t0 = last = time.perf_counter()
            first, gap, chunks = None, 0.0, 0
            try:
                async with client.stream(
                    "POST", url + "/v1/chat/completions", json=body, headers=headers
                ) as r:
                    if r.status_code != 200:
                        raise RuntimeError(f"HTTP {r.status_code}")
                    async for _ in r.aiter_raw():
                        now = time.perf_counter()
                        first = first if first is not None else now - t0
                        gap = max(gap, now - last)
                        last, chunks = now, chunks + 1
                if not chunks:
                    raise RuntimeError("an empty stream")
                out["done"] += 1
                out["ttfc"].append(first)
                out["gap"].append(gap)
            except (httpx.HTTPError, RuntimeError) as exc:
                out["errors"] += 1
                out["last_error"] = f"{type(exc).__name__}: {exc}"

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(streams)))
    out["elapsed"] = time.perf_counter() - t0
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--token-ms", type=float, default=20.0)
    ap.add_argument("--warmup", type=float, default=15.0)
    ap.add_argument("--http", choices=("lean", "uvicorn"), default="lean", help="its HTTP server")
    args = ap.parse_args()
    cost = {
        "base_ttft_s": 0.01,
        "prefill_s_per_token": 0,
        "decode_s_per_token": args.token_ms / 1e3,
        "max_concurrency": 4096,
    }
    t_start = time.perf_counter()
    try:
        engines = S.start_engines(2, cost)
        gw, headers = S.start_gateway_processes(engines, "least_outstanding", 1, args.http)
        proc = psutil.Process(gw.popen.pid)
        direct = asyncio.run(
            run_clients([e.url for e in engines], {}, args.streams, args.duration, args.max_tokens)
        )
        asyncio.run(run_clients([gw.url], headers, args.streams, args.warmup, args.max_tokens))
        rss0 = proc.memory_info().rss
        samples: list[float] = []  # the gateway's RSS every 5 s of the routed run
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.wait(5.0):
                samples.append(proc.memory_info().rss)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        routed = asyncio.run(
            run_clients([gw.url], headers, args.streams, args.duration, args.max_tokens)
        )
        sampling.set()
        sampler.join()
        rss1 = proc.memory_info().rss
        deadline = time.monotonic() + 10
        in_flight = None
        while time.monotonic() < deadline:
            in_flight = httpx.get(gw.url + "/healthz", timeout=5).json()["in_flight"]
            if in_flight == 0:
                break
            time.sleep(0.2)
    finally:
        S.stop_all()
    print(
        f"\ngateway soak: {args.streams} concurrent streams for {args.duration:g} s, "
        f"{args.max_tokens} tokens of {args.token_ms:g} ms each, 2 simulated engines"
    )
    rows = []
    for name, r in (("direct (client round-robin)", direct), ("aicluster gateway process", routed)):
        rows.append(
            [
                name,
                str(r["done"]),
                f"{r['done'] / r['elapsed']:.1f}",
                str(r["errors"]),
                f"{S.pct(r['ttfc'], 0.5) * 1e3:.1f}",
                f"{S.pct(r['ttfc'], 0.99) * 1e3:.1f}",
                f"{S.pct(r['gap'], 0.99) * 1e3:.1f}",
            ]
        )
    print(
        S.table(
            [
                "path",
                "streams",
                "streams/s",
                "errors",
                "ttfc p50 ms",
                "ttfc p99 ms",
                "max gap p99 ms",
            ],
            rows,
        )
    )
    ratio = (routed["done"] / routed["elapsed"]) / max(1e-9, direct["done"] / direct["elapsed"])
    growth = (rss1 - rss0) / rss0
    print(f"\nstreams/s through the gateway / direct: x{ratio:.2f}")
    print(
        f"gateway RSS after warm-up {rss0 / 2**20:.1f} MiB, at the end {rss1 / 2**20:.1f} MiB: growth {growth:+.1%} (goal <= +10%)"
    )
    if len(samples) >= 4:
        half = samples[len(samples) // 2 :]
        print(
            "gateway RSS every 5 s of the run, MiB: "
            + " ".join(f"{x / 2**20:.0f}" for x in samples)
            + f"; second half {half[0] / 2**20:.1f} -> {half[-1] / 2**20:.1f} "
            f"({(half[-1] - half[0]) / half[0]:+.1%}: a leak keeps growing, a warm-up levels off)"
        )
    print(f"gateway in flight after the clients stopped: {in_flight} (goal 0)")
    if direct["errors"] or routed["errors"]:
        print(f"last errors: direct {direct['last_error']!r}; gateway {routed['last_error']!r}")
    print(f"total {time.perf_counter() - t_start:.0f}s")


if __name__ == "__main__":
    main()

"""What the gateway adds: the same client straight to a replica, through aicluster's gateway,
and through peer routers from PyPI, on the same zero-cost simulated replicas, in one run.

Run:  .venv/bin/python bench/gateway_overhead.py            (about 2-3 minutes)
      .venv/bin/python bench/gateway_overhead.py --quick    (about 40 s, most of it LiteLLM's start)
      .venv/bin/python bench/gateway_overhead.py --no-peers (aicluster only)

Starts N `simulated` engines with every time cost at 0 (bench/_engine_main.py), the real
`aicluster.gateway.proxy.Gateway` under uvicorn in its own process (bench/_gateway_main.py,
least_outstanding over the N engines), the real `aicluster gateway` process with 1 and 2
workers sharing a port (`--gateway-workers`; fed by a stand-in control plane,
bench/_feed_stub.py, so it authenticates, rate-limits, records usage and reports as
deployed), and, where they install and run here, sglang-router
and vllm-router (round_robin) and the LiteLLM proxy (pinned version, simple-shuffle) over
the same engines; see bench/_servers.py for their virtual environments. A peer that cannot
run gets a row saying why.

One httpx.AsyncClient per target sends the same non-streaming chat completion
(max_tokens 16). Two phases, each repeated for `--rounds` rounds that visit the targets in a
rotating order (direct and routed alternate, so drift on this shared machine hits all alike):
  1. unloaded: `--lat-requests` requests one at a time -> p50/p99 latency; "added" is the
     target's figure minus direct's.
  2. loaded: `--concurrency` workers in a closed loop for `--duration` seconds -> requests/s,
     p50/p99 latency; ratio is the target's requests/s over direct's.
The baseline (first row) is direct with the client itself round-robining over the same N
replicas, i.e. a router that costs nothing; "direct (1 replica)" is shown for reference.
On a 2-core machine the client, the router and the replicas share the CPUs, so requests/s
measures the CPU cost of the whole path, and a Python hop shows up in it directly.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _servers as S

ZERO_COST = {
    "base_ttft_s": 0,
    "prefill_s_per_token": 0,
    "decode_s_per_token": 0,
    "max_concurrency": 4096,
}
PROMPT = " ".join(f"word{i % 37}" for i in range(48))


@dataclass
class Target:
    name: str
    urls: list[str] = field(default_factory=list)  # the client round-robins over these
    headers: dict = field(default_factory=dict)
    why_not: str | None = None
    lat: list[float] = field(default_factory=list)  # unloaded latencies, seconds
    loaded: list[float] = field(default_factory=list)  # loaded latencies, seconds
    done: int = 0
    busy_s: float = 0.0
    errors: int = 0
    last_error: str = ""
    sent: int = 0

    @property
    def rps(self) -> float:
        return self.done / self.busy_s if self.busy_s else float("nan")


async def one(client: httpx.AsyncClient, t: Target, body: dict) -> float | None:
    url = t.urls[t.sent % len(t.urls)]
    t.sent += 1
    t0 = time.perf_counter()
    try:
        r = await client.post(url + "/v1/chat/completions", json=body, headers=t.headers)
        ok = r.status_code == 200 and r.json().get("choices")
        if not ok:
            t.last_error = f"HTTP {r.status_code}: {r.text[:120]}"
    except (httpx.HTTPError, ValueError) as exc:
        ok, t.last_error = False, f"{type(exc).__name__}: {exc}"
    if not ok:
        t.errors += 1
        return None
    return time.perf_counter() - t0


async def unloaded(client, t: Target, body: dict, n: int) -> None:
    for _ in range(n):
        dt = await one(client, t, body)
        if dt is not None:
            t.lat.append(dt)


async def loaded(client, t: Target, body: dict, concurrency: int, duration: float) -> None:
    stop = time.perf_counter() + duration
    done = 0

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < stop:
            dt = await one(client, t, body)
            if dt is not None:
                t.loaded.append(dt)
                done += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    t.busy_s += time.perf_counter() - t0
    t.done += done


async def measure(targets: list[Target], args) -> None:
    body = {"model": S.MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 16}
    live = [t for t in targets if t.why_not is None]
    limits = httpx.Limits(
        max_connections=args.concurrency, max_keepalive_connections=args.concurrency
    )
    clients = {t.name: httpx.AsyncClient(limits=limits, timeout=60.0) for t in live}
    try:
        for t in live:  # warm up connections and code paths; not counted
            await loaded(clients[t.name], t, body, args.concurrency, 0.5)
            t.loaded.clear()
            t.done, t.busy_s, t.errors = 0, 0.0, 0
        for phase in ("unloaded", "loaded"):
            for rnd in range(args.rounds):
                k = rnd % len(live)
                for t in live[k:] + live[:k]:
                    c = clients[t.name]
                    await asyncio.sleep(args.settle)  # let the previous target go idle
                    if phase == "unloaded":
                        await unloaded(c, t, body, args.lat_requests)
                    else:
                        await loaded(c, t, body, args.concurrency, args.duration)
                print(f"  {phase} round {rnd + 1}/{args.rounds} done", file=sys.stderr)
    finally:
        for c in clients.values():
            await c.aclose()


def report(targets: list[Target], args) -> None:
    base = targets[0]
    b50, b99 = S.pct(base.lat, 0.5), S.pct(base.lat, 0.99)
    rows = []
    for t in targets:
        if t.why_not is not None:
            rows.append([t.name, "-", "-", "-", "-", "-", "-", "-", "-", "-"])
            continue
        p50, p99 = S.pct(t.lat, 0.5), S.pct(t.lat, 0.99)
        rows.append(
            [
                t.name,
                f"{p50 * 1e3:.2f}",
                f"{p99 * 1e3:.2f}",
                f"{(p50 - b50) * 1e3:+.2f}",
                f"{(p99 - b99) * 1e3:+.2f}",
                f"{t.rps:.0f}",
                f"{t.rps / base.rps:.2f}",
                f"{S.pct(t.loaded, 0.5) * 1e3:.1f}",
                f"{S.pct(t.loaded, 0.99) * 1e3:.1f}",
                str(t.errors),
            ]
        )
    c = args.concurrency
    print()
    print(
        f"gateway overhead: {args.replicas} zero-cost simulated replicas, non-streaming chat "
        f"completion (max_tokens 16), {args.rounds} rounds; unloaded = {args.lat_requests} "
        f"sequential requests/round; loaded = concurrency {c} for {args.duration:.0f}s/round"
    )
    print(
        S.table(
            [
                "path",
                "p50 ms",
                "p99 ms",
                "added p50",
                "added p99",
                f"req/s @{c}",
                "x direct",
                f"p50@{c} ms",
                f"p99@{c} ms",
                "errors",
            ],
            rows,
        )
    )
    for t in targets:
        if t.why_not is not None:
            print(f"  {t.name}: not run: {t.why_not}")
        elif t.errors:
            print(f"  {t.name}: {t.errors} errors, last: {t.last_error}")
    gw = next((t for t in targets if t.name.startswith("aicluster")), None)
    if gw is not None and gw.why_not is None:
        print(f"\nratios against the aicluster gateway (req/s @{c}; added p50 latency):")
        g_added = S.pct(gw.lat, 0.5) - b50
        for t in targets[3:]:
            if t.why_not is None:
                added = S.pct(t.lat, 0.5) - b50
                print(
                    f"  {t.name}: req/s x{t.rps / gw.rps:.2f}; added p50 "
                    f"{added * 1e3:.2f} ms vs {g_added * 1e3:.2f} ms (x{added / g_added:.1f})"
                )


def start_peers(engines) -> list[Target]:
    """Start the peers side by side (their start-up overlaps; LiteLLM's takes ~20 s)."""
    specs = [
        (
            "sglang-router 0.3.2 (round_robin)",
            lambda: S.start_sglang_router(engines, "round_robin"),
        ),
        ("vllm-router 0.1.17 (round_robin)", lambda: S.start_vllm_router(engines, "round_robin")),
        (f"litellm proxy {S.LITELLM_VERSION}", lambda: S.start_litellm(engines)),
    ]
    results: dict[str, object] = {}
    threads = [
        threading.Thread(target=lambda n=n, f=f: results.__setitem__(n, f())) for n, f in specs
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    out = []
    for name, _ in specs:
        p = results[name]
        if isinstance(p, str):
            out.append(Target(name, why_not=p))
        else:
            hdr = {"authorization": f"Bearer {S.LITELLM_KEY}"} if "litellm" in name else {}
            out.append(Target(name, [p.url], hdr))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lat-requests", type=int, default=200, help="per target per round")
    ap.add_argument(
        "--duration",
        type=float,
        default=4.0,
        help="loaded seconds per target per round",
    )
    ap.add_argument("--routing", default="least_outstanding", help="the aicluster gateway's policy")
    ap.add_argument("--settle", type=float, default=0.5, help="idle seconds between targets")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument(
        "--gateway-workers",
        type=int,
        nargs="*",
        default=[1, 2],
        help="also measure `aicluster gateway --workers N` for each N (none: skip)",
    )
    ap.add_argument("--quick", action="store_true", help="1 round, 100 requests, 2 s")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.lat_requests, args.duration = 1, 100, 2.0

    t_start = time.perf_counter()
    try:
        engines = S.start_engines(args.replicas, ZERO_COST)
        gw = S.start_gateway()
        headers = S.publish(gw, "overhead", args.routing, engines, "ov")
        targets = [
            Target(
                f"direct (client round-robin, {args.replicas} replicas)", [e.url for e in engines]
            ),
            Target("direct (1 replica)", [engines[0].url]),
            Target(f"aicluster gateway ({args.routing})", [gw.url], headers),
        ]
        for n in args.gateway_workers:  # `aicluster gateway --workers N`, fed as in a cluster
            proc, proc_headers = S.start_gateway_processes(engines, args.routing, n)
            targets.append(Target(f"aicluster gateway process x{n}", [proc.url], proc_headers))
        if not args.no_peers:
            targets += start_peers(engines)
        print(
            f"servers up in {time.perf_counter() - t_start:.1f}s; measuring",
            file=sys.stderr,
        )
        asyncio.run(measure(targets, args))
        report(targets, args)
    finally:
        S.stop_all()
    print(f"\ntotal {time.perf_counter() - t_start:.0f}s")


if __name__ == "__main__":
    main()

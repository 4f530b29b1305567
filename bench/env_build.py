"""Environment builds: pip (what runtime/envs.py runs) against uv, on the same requirements,
cold (empty download cache) and warm (the cache the cold build filled), to decide which
builder a node should use.

Run:   .venv/bin/python bench/env_build.py                         (~1-3 min; needs PyPI)
       .venv/bin/python bench/env_build.py --pip numpy==2.1.3 --pip requests --rounds 2
Options: --pip REQ (repeatable; default numpy, requests, pyyaml, tqdm), --rounds N (warm
         builds per tool, default 1), --json FILE.
uv comes from PyPI into a throw-away venv of the bench's own (it is not a dependency of
the platform). Every build goes into a temp folder that is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT = ["numpy", "requests", "pyyaml", "tqdm"]


def _run(argv: list[str], env: dict | None = None) -> float:
    t = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(
            f"{' '.join(argv[:4])} ... failed:\n{proc.stdout[-800:]}{proc.stderr[-800:]}"
        )
    return time.monotonic() - t


def build_pip(dest: Path, reqs: list[str], cache: Path) -> float:
    t = _run([sys.executable, "-m", "venv", str(dest)])
    pip = [str(dest / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "--no-input"]
    return t + _run([*pip, "install", "--cache-dir", str(cache), *reqs])


def build_uv(uv: str, dest: Path, reqs: list[str], cache: Path) -> float:
    t = _run([uv, "venv", "--python", sys.executable, "--cache-dir", str(cache), str(dest)])
    py = str(dest / "bin" / "python")
    return t + _run([uv, "pip", "install", "--python", py, "--cache-dir", str(cache), *reqs])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pip", action="append", help="a requirement (repeatable)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--json")
    args = ap.parse_args()
    reqs = args.pip or DEFAULT
    tmp = Path(tempfile.mkdtemp(prefix="env-build-bench-"))
    try:
        tools = tmp / "tools"
        _run([sys.executable, "-m", "venv", str(tools)])
        _run([str(tools / "bin" / "pip"), "install", "-q", "uv"])
        uv = str(tools / "bin" / "uv")
        rows = []
        for name, build in (("pip", build_pip), ("uv", lambda d, r, c: build_uv(uv, d, r, c))):
            cache = tmp / f"cache-{name}"
            cold = build(tmp / f"{name}-cold", reqs, cache)
            warm = [build(tmp / f"{name}-warm{i}", reqs, cache) for i in range(args.rounds)]
            rows.append({"tool": name, "cold_s": round(cold, 2), "warm_s": round(min(warm), 2)})
            print(f"{name}: cold {cold:.2f} s, warm {min(warm):.2f} s", flush=True)
        pip, uvr = rows
        print(f"\nrequirements: {' '.join(reqs)}")
        print("| builder | cold (empty cache) | warm (cache filled) |")
        print("|---|---|---|")
        for r in rows:
            print(f"| {r['tool']} | {r['cold_s']} s | {r['warm_s']} s |")
        print(
            f"| uv / pip | {uvr['cold_s'] / pip['cold_s']:.2f}x | {uvr['warm_s'] / pip['warm_s']:.2f}x |"
        )
        if args.json:
            Path(args.json).write_text(json.dumps({"requirements": reqs, "rows": rows}, indent=2))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

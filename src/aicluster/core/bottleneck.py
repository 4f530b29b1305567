"""Why a gang does not fit: the resource that is really short, in words a user can act on.

Vocabulary: a *dimension* is one kind of resource a worker asks for (CPU, memory, GPU).
For the candidate nodes (schedulable, in the pool, of the asked GPU model) and for each
dimension alone, `room` counts how many workers the free capacity could hold if that
dimension were the only one. A dimension is *short* when that count is below the number
of workers. When no dimension is short alone, the capacity is there but not together
on any node (fragmentation).

Invariant: the sentence names every short dimension with the free amount that was
counted, so that "needs 1 CPU; 0.5 CPU free" is never said as "0 GPUs free".
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from aicluster.core.model import GangRequest, Res

DIMENSIONS = ("cpus", "memory", "gpus")


def room(free: Res, per_worker: Res, dim: str) -> float:
    """Workers that `free` holds in dimension `dim` alone (inf when the worker asks none)."""
    need = getattr(per_worker, dim)
    if need <= 0:
        return math.inf
    return math.floor(getattr(free, dim) / need + 1e-9)


def short_dimensions(frees: Iterable[Res], gang: GangRequest) -> dict[str, float]:
    """The dimensions that alone cannot hold the gang's workers -> their total free amount."""
    frees = list(frees)
    out = {}
    for dim in DIMENSIONS:
        if sum(room(f, gang.per_worker, dim) for f in frees) < gang.workers:
            out[dim] = sum(max(0, getattr(f, dim)) for f in frees)
    return out


def amount(dim: str, value: float) -> str:
    if dim == "cpus":
        return f"{value:g} CPU"
    if dim == "memory":
        return f"{value / 2**30:.1f} GiB"
    return f"{int(value)} GPU{'s' if int(value) != 1 else ''}"


_NAMES = {"cpus": "CPU", "memory": "memory", "gpus": "GPUs"}


def shortage(frees: Iterable[Res], gang: GangRequest, what: str) -> str:
    """`what` ("free on matching nodes", "in the largest pool") is how the amounts were counted."""
    short = short_dimensions(frees, gang)
    if not short:
        return "enough CPU, memory and GPUs in all, but not together on few enough nodes"
    parts = [f"{amount(d, v)} {what}" for d, v in short.items()]
    names = " and ".join(_NAMES[d] for d in short)
    return f"not enough {names}: " + ", ".join(parts)

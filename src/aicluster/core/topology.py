"""Topology-aware gang placement over an index of free capacity.

Vocabulary: a pool holds racks, a rack holds NVLink domains, a domain holds nodes. A
node is its own NVLink domain and its own rack unless `NodeView.nvlink_domain` or
`NodeView.rack` say otherwise. A gang never spans pools (quotas are per pool).

Preference, the same for every policy:
1. all workers or none;
2. the fewest nodes;
3. at that node count, within one NVLink domain, else within one rack, else the pool;
4. best fit: the fullest node (or group) that still holds what is left, to limit
   fragmentation; ties break by node name, so a snapshot always gives one answer.
`GangRequest.locality` caps the scope: a gang with locality "rack" waits rather than
span racks. `GangRequest.nodes` (when set) is a hard constraint: no other node is ever
considered (`allowed`), not for placement, reservations nor the reasons it waits.

Invariant: `FreeIndex.take` is only called with a placement that `place` returned on
the current free capacity, so free capacity never goes below zero; `release` gives
back exactly what a `take` (or a running workload) held.

Speed: nodes are bucketed by free GPUs, so a single-node gang is placed by looking
at the first buckets that can hold it, and a pool with too few free GPUs is refused
at once (the cycle benchmark places thousands of gangs a second on 1,000 nodes).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections import Counter
from collections.abc import Iterable

from aicluster.core.bottleneck import amount, short_dimensions, shortage
from aicluster.core.model import GangRequest, NodeView, Res, WaitKind

SCOPES = ("node", "nvlink", "rack", "pool")


def model_ok(node: NodeView, gang: GangRequest) -> bool:
    """The gang asks no GPU model, or the node's model matches (case-insensitive)."""
    return gang.gpu_model is None or (node.gpu_model or "").lower() == gang.gpu_model.lower()


def allowed(node: NodeView, gang: GangRequest) -> bool:
    """The node may take workers of the gang: its GPU model matches and, when the gang is
    pinned to nodes (`GangRequest.nodes`), it is one of them."""
    return model_ok(node, gang) and (gang.nodes is None or node.node_id in gang.nodes)


def named(node_ids) -> str:
    """ "n1, n2, n3" (sorted; the first 5 and how many more)."""
    ids = sorted(node_ids)
    more = f" and {len(ids) - 5} more" if len(ids) > 5 else ""
    return ", ".join(ids[:5]) + more


def scope_key(node: NodeView, scope: str) -> str:
    """The node's group at `scope` ("nvlink" or "rack"); a lone node is its own group."""
    value = node.nvlink_domain if scope == "nvlink" else node.rack
    return value if value is not None else "node:" + node.node_id


class _Pool:
    """Nodes of one pool, bucketed by free GPUs (each bucket sorted by node rank)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.ids: list[str] = []
        self.buckets: dict[int, list[int]] = {}
        self.free_gpus = 0
        self.capacity = Res()
        self.max_node_gpus = 0


class _FreeMap(dict):
    """node id -> free Res, computed on first use (most nodes are never looked at)."""

    def __init__(self, nodes: dict[str, NodeView], empty: bool) -> None:
        super().__init__()
        self.nodes, self.empty = nodes, empty

    def __missing__(self, node_id: str) -> Res:
        n = self.nodes[node_id]
        value = n.capacity if self.empty else n.capacity - n.allocated
        self[node_id] = value
        return value


class Layout:
    """What does not change between cycles: the schedulable nodes in name order, their
    ranks and pools. Policies keep the last one in their memo while the nodes' shape
    (everything but `allocated`) stays the same."""

    def __init__(self, nodes: Iterable[NodeView]) -> None:
        ordered = sorted((n for n in nodes if n.schedulable), key=lambda n: (n.name, n.node_id))
        self.ordered = ordered
        self.ids = [n.node_id for n in ordered]
        self.rank = {n.node_id: i for i, n in enumerate(ordered)}
        self.pools: dict[str, tuple[list[str], Res, int]] = {}
        for n in ordered:
            ids, cap, top = self.pools.get(n.pool, ([], Res(), 0))
            ids.append(n.node_id)
            self.pools[n.pool] = (ids, cap + n.capacity, max(top, n.capacity.gpus))

    @staticmethod
    def node_shape(n: NodeView) -> tuple:
        """Everything about a node but what is allocated on it."""
        return (
            n.node_id,
            n.name,
            n.capacity,
            n.pool,
            n.gpu_model,
            n.rack,
            n.nvlink_domain,
            n.schedulable,
        )

    @staticmethod
    def shape(nodes: Iterable[NodeView]) -> tuple:
        return tuple(Layout.node_shape(n) for n in nodes if n.schedulable)


class FreeIndex:
    """Free capacity of the schedulable nodes while one cycle decides (scratch, mutable)."""

    def __init__(
        self,
        nodes: Iterable[NodeView],
        empty: bool = False,
        layout: Layout | None = None,
    ) -> None:
        nodes = tuple(nodes)
        lay = layout if layout is not None else Layout(nodes)
        current = {n.node_id: n for n in nodes if n.schedulable}
        self.node = {i: current[i] for i in lay.ids}
        self.rank = lay.rank
        self.ids = lay.ids
        self.free = _FreeMap(self.node, empty)
        self.held: set[str] = set()
        self.journal: dict[str, Res] | None = None  # see `begin`
        self.version = 0  # counts changes to the free capacity (memos compare it)
        self.pools: dict[str, _Pool] = {}
        node = self.node
        for name, (ids, cap, top) in lay.pools.items():
            p = self.pools[name] = _Pool(name)
            p.ids, p.capacity, p.max_node_gpus = ids, cap, top
            for node_id in ids:
                n = node[node_id]
                g = n.capacity.gpus - (0 if empty else n.allocated.gpus)
                g = max(0, g)
                bucket = p.buckets.get(g)
                if bucket is None:
                    p.buckets[g] = [self.rank[node_id]]
                else:
                    bucket.append(self.rank[node_id])
                p.free_gpus += g

    # -- across cycles ----------------------------------------------------------

    def sync(self, nodes: tuple[NodeView, ...], previous: tuple[NodeView, ...]) -> bool:
        """Bring the index from `previous` to `nodes` (the same nodes in the same order,
        only `allocated` may differ), touching only the nodes that changed; False (and
        nothing changed) when they differ in anything else: build a new index then."""
        if nodes is previous:
            return True
        if len(nodes) != len(previous):
            return False
        changed = []
        for new, old in zip(nodes, previous):
            if new is old:
                continue
            if Layout.node_shape(new) != Layout.node_shape(old):
                return False
            if new.allocated != old.allocated:
                changed.append(new)
        for n in changed:
            if n.node_id in self.node:
                self.free[n.node_id]  # computed from the old view (if not yet) before it goes
                self.node[n.node_id] = n
                self._set(n.node_id, n.capacity - n.allocated)
            # an unschedulable node is in no pool: nothing to update
        return True

    def begin(self) -> None:
        """Start recording: every change until `rollback` is undone by it."""
        self.journal = {}

    def rollback(self) -> None:
        """Undo every `take`, `release` and `hold` since `begin`: the free capacity is
        again exactly what it was (the same Res values, the same buckets)."""
        journal, self.journal = self.journal or {}, None
        self.held.clear()
        for node_id, free in journal.items():
            self._set(node_id, free)

    # -- bookkeeping ------------------------------------------------------------

    def take(self, placement: tuple[str, ...], per_worker: Res) -> None:
        for node_id, k in Counter(placement).items():
            if node_id not in self.held:
                self._set(node_id, self.free[node_id] - per_worker.scale(k))

    def release(self, placement: tuple[str, ...], per_worker: Res) -> None:
        for node_id, k in Counter(placement).items():
            if node_id in self.node and node_id not in self.held:
                self._set(node_id, self.free[node_id] + per_worker.scale(k))

    def hold(self, node_ids: Iterable[str]) -> None:
        """Nothing else starts on these nodes this cycle (kept for a starving gang)."""
        for node_id in node_ids:
            if node_id not in self.held:
                self._set(node_id, Res())
                self.held.add(node_id)

    def soonest_nodes(self, gang: GangRequest, pool: str) -> list[str]:
        """Nodes where `gang` would fit soonest: most free GPUs first, until their
        capacity holds every worker (empty when the pool never could)."""
        p = self.pools.get(pool)
        if p is None:
            return []
        cands = [
            (-max(0, self.free[i].gpus), self.rank[i], i)
            for i in p.ids
            if i not in self.held and allowed(self.node[i], gang)
        ]
        chosen, room = [], 0
        for _, _, node_id in sorted(cands):
            k = gang.per_worker.count_in(self.node[node_id].capacity)
            if k > 0:
                chosen.append(node_id)
                room += k
                if room >= gang.workers:
                    return chosen
        return []

    def _set(self, node_id: str, free: Res) -> None:
        p = self.pools[self.node[node_id].pool]
        before = self.free[node_id]
        if self.journal is not None and node_id not in self.journal:
            self.journal[node_id] = before
        old, new = max(0, before.gpus), max(0, free.gpus)
        self.free[node_id] = free
        self.version += 1
        if old != new:
            rank = self.rank[node_id]
            bucket = p.buckets[old]
            del bucket[bisect_left(bucket, rank)]
            insort(p.buckets.setdefault(new, []), rank)
            p.free_gpus += new - old

    def pool_free_gpus(self, pool: str) -> int:
        p = self.pools.get(pool)
        return p.free_gpus if p else 0

    def slots_if_freed(self, pool: str, gpus_each: float, freed: dict[str, float]) -> float:
        """At least as many workers of `gpus_each` (> 0) GPUs as the pool's nodes could
        hold, by their GPUs alone, once `freed` (node id -> GPUs) is released: no
        placement has more (CPU, memory, models, holds and locality only take away).
        A preemptor asks it before freeing victims one by one for a gang that cannot fit."""
        p = self.pools.get(pool)
        if p is None:
            return 0
        slots = sum(((g + 1e-6) // gpus_each) * len(r) for g, r in p.buckets.items())
        for node_id, gpus in freed.items():
            node = self.node.get(node_id)
            if node is None or node.pool != pool or node_id in self.held:
                continue  # `release` gives such a node nothing
            now = max(0, self.free[node_id].gpus)
            slots += (now + gpus + 1e-6) // gpus_each - (now + 1e-6) // gpus_each
        return slots

    # -- placement --------------------------------------------------------------

    def place(
        self, gang: GangRequest, pool: str, avoid: frozenset[str] = frozenset()
    ) -> tuple[str, ...] | None:
        """Nodes for every rank of `gang` in `pool` by the preference above (never a node
        in `avoid`), or None."""
        p = self.pools.get(pool)
        if p is None or gang.workers <= 0:
            return None
        if gang.total.gpus > p.free_gpus:
            return None
        one = self._one_node(gang, p, avoid)
        if one is not None:
            return (one,) * gang.workers
        if gang.workers == 1 or gang.locality == "node":
            return None
        return self._multi_node(gang, p, avoid)

    def _one_node(self, gang: GangRequest, p: _Pool, avoid: frozenset[str]) -> str | None:
        """A preferred node (artifact locality) that holds the whole gang, else best fit:
        the node with the fewest free GPUs that holds it."""
        for node_id in gang.preferred_nodes:
            node = self.node.get(node_id)
            if (
                node is not None
                and node.pool == p.name
                and node_id not in avoid
                and node_id not in self.held
                and allowed(node, gang)
                and gang.per_worker.count_in(self.free[node_id]) >= gang.workers
            ):
                return node_id
        need = gang.per_worker.gpus * gang.workers
        for g in range(need, p.max_node_gpus + 1):
            for rank in p.buckets.get(g, ()):
                node_id = self.ids[rank]
                if node_id in avoid or not allowed(self.node[node_id], gang):
                    continue
                if gang.per_worker.count_in(self.free[node_id]) >= gang.workers:
                    return node_id
        return None

    def _rooms(
        self, gang: GangRequest, p: _Pool, avoid: frozenset[str]
    ) -> list[tuple[int, int, str]]:
        """(workers it could take, rank, node id) for every node with room, most room first."""
        rooms = []
        for g in range(max(gang.per_worker.gpus, 0), p.max_node_gpus + 1):
            for rank in p.buckets.get(g, ()):
                node_id = self.ids[rank]
                if node_id in avoid or not allowed(self.node[node_id], gang):
                    continue
                k = min(gang.per_worker.count_in(self.free[node_id]), gang.workers)
                if k > 0:
                    rooms.append((k, rank, node_id))
        rooms.sort(key=lambda r: (-r[0], r[1]))
        return rooms

    def _multi_node(self, gang: GangRequest, p: _Pool, avoid: frozenset[str]):
        rooms = self._rooms(gang, p, avoid)
        if sum(r[0] for r in rooms) < gang.workers:
            return None
        widest = SCOPES.index(gang.locality) if gang.locality in SCOPES else 3
        best: tuple | None = None
        for level, scope in ((1, "nvlink"), (2, "rack")):
            if level > widest:
                break
            found = self._best_group(rooms, gang.workers, scope, level)
            if found is not None and (best is None or found[:1] < best[:1]):
                best = found
        if widest >= 3:
            picks = _greedy(rooms, gang.workers)
            if picks is not None and (best is None or len(picks) < best[0]):
                best = (len(picks), 3, 0, "", picks)
        if best is None:
            return None
        return tuple(node_id for node_id, k in best[4] for _ in range(k))

    def _best_group(self, rooms, workers: int, scope: str, level: int):
        """Fewest nodes within one group at `scope`; then the fullest group; then by name."""
        groups: dict[str, list] = {}
        for r in rooms:
            groups.setdefault(scope_key(self.node[r[2]], scope), []).append(r)
        best = None
        for key, members in groups.items():
            if key.startswith("node:") or sum(m[0] for m in members) < workers:
                continue
            picks = _greedy(members, workers)
            if picks is None:
                continue
            spare = sum(self.free[m[2]].gpus for m in members)
            cand = (len(picks), level, spare, key, picks)
            if best is None or cand[:4] < best[:4]:
                best = cand
        return best


def _greedy(rooms: list[tuple[int, int, str]], workers: int) -> list[tuple[str, int]] | None:
    """Fewest nodes: the roomiest nodes first, then the tightest node that holds the rest.

    `rooms` is sorted by room descending, then rank. Returns (node id, workers) pairs.
    """
    neg = [-r[0] for r in rooms]
    picks: list[tuple[str, int]] = []
    left, i = workers, 0
    while left > 0 and i < len(rooms):
        k = bisect_right(neg, -left, lo=i)  # rooms[i:k] each hold all that is left
        if k > i:
            j = bisect_left(neg, neg[k - 1], lo=i)  # lowest rank among the tightest
            picks.append((rooms[j][2], left))
            return picks
        picks.append((rooms[i][2], rooms[i][0]))
        left -= rooms[i][0]
        i += 1
    return None if left > 0 else picks


def describe(gang: GangRequest) -> str:
    """ "2 x (1 CPU, 0.0 GiB, 8 GPU H100)" plus the locality when it is narrower than a pool."""
    r = gang.per_worker
    text = f"{gang.workers} x ({r.cpus:g} CPU, {r.memory / 2**30:.1f} GiB, {r.gpus} GPU"
    text += f" {gang.gpu_model})" if gang.gpu_model else ")"
    if gang.locality in ("node", "nvlink", "rack"):
        text += f" within one {_SCOPE_WORDS[gang.locality]}"
    return text


_SCOPE_WORDS = {
    "node": "node",
    "nvlink": "NVLink domain",
    "rack": "rack",
    "pool": "pool",
}


def _candidates(index: FreeIndex, gang: GangRequest, pool: str) -> list[Res]:
    """Free capacity of the pool's nodes that match the gang's GPU model."""
    p = index.pools.get(pool)
    if p is None:
        return []
    return [index.free[i] for i in p.ids if allowed(index.node[i], gang) and i not in index.held]


def why_no_room(index: FreeIndex, gang: GangRequest, pool: str) -> tuple[WaitKind, str]:
    """What a gang that `place` refused in `pool` waits for (LOCALITY when enough GPUs are
    free but spread out, else CAPACITY) and a sentence a user can act on: it names the
    resource that is short (core.bottleneck), not always the GPUs."""
    if gang.nodes is not None:
        return WaitKind.CAPACITY, (
            f"waiting for its nodes {named(gang.nodes)} in pool {pool}: needs "
            f"{describe(gang)}; {shortage(_candidates(index, gang, pool), gang, 'free on them')}"
        )
    total = gang.total.gpus
    free = index.pool_free_gpus(pool)
    if gang.locality in ("node", "nvlink", "rack") and total <= free:
        return WaitKind.LOCALITY, (
            f"needs {total} GPUs within one {_SCOPE_WORDS[gang.locality]} of pool {pool}; "
            f"{free} GPUs are free but spread out"
        )
    where = "free" if gang.gpu_model is None else f"free on {gang.gpu_model} nodes"
    return WaitKind.CAPACITY, (
        f"waiting for capacity in pool {pool}: needs {describe(gang)}; "
        f"{shortage(_candidates(index, gang, pool), gang, where)}"
    )


def never_fits_reason(empty: FreeIndex, gang: GangRequest, pools: list[str]) -> str | None:
    """None when some pool, empty, would hold the gang; else why none could, ever."""
    if any(empty.place(gang, pool) is not None for pool in pools):
        return None
    if gang.nodes is not None:
        return _pinned_never(empty, gang)
    best = None
    for pool in pools:
        caps = _candidates(empty, gang, pool)
        if caps:
            short = short_dimensions(caps, gang)
            key = (-len(short), sum(c.gpus for c in caps), pool)
            if best is None or key > best[0]:
                best = (key, short, caps)
    if best is None:
        where = f"pool {pools[0]}" if len(pools) == 1 else "any pool"
        what = f"GPU model {gang.gpu_model}" if gang.gpu_model else "room for it"
        return f"could never fit: no schedulable node in {where} has {what}"
    _, short, caps = best
    if not short:
        how = f" within one {_SCOPE_WORDS[gang.locality]}" if gang.locality != "pool" else ""
        return (
            f"could never fit: needs {describe(gang)}; no set of nodes holds one worker's CPU, "
            f"memory and GPUs together{how} ({len(caps)} matching node(s) in the largest pool)"
        )
    has = " and ".join(amount(d, v) for d, v in short.items())
    return (
        f"could never fit: needs {describe(gang)}; the largest pool has {has}"
        f" on {len(caps)} matching node(s)"
    )


def _pinned_never(empty: FreeIndex, gang: GangRequest) -> str:
    """Why a gang pinned to nodes could never fit on them (named in the sentence)."""
    missing = [i for i in gang.nodes or () if i not in empty.node]
    if len(missing) == len(gang.nodes or ()):
        return (
            f"could never fit: no schedulable node {named(missing)} (its nodes; "
            "see `aicluster nodes`)"
        )
    there = [empty.node[i] for i in gang.nodes or () if i in empty.node]
    why = f"needs {describe(gang)}; its nodes {named(gang.nodes or ())}"
    if missing:
        why += f" include no schedulable node {named(missing)}, and the others"
    pools = sorted({n.pool for n in there})
    if len(pools) > 1:
        return f"could never fit: {why} are in pools {', '.join(pools)} (a gang uses one pool)"
    wrong = [n.node_id for n in there if not model_ok(n, gang)]
    if wrong:
        return f"could never fit: {why} have no {gang.gpu_model} GPUs on {named(wrong)}"
    return f"could never fit: {why} do not hold it even when idle"

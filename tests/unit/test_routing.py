"""Routing policies (core.routing): each policy on hand-made cases, then properties."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from aicluster.core.routing import (
    POLICIES,
    PrefixIndex,
    ReplicaState,
    RouteRequest,
    block_hashes,
    make_policy,
)


def reps(*ids: str, **loads: int) -> list[ReplicaState]:
    return [ReplicaState(i, reported_load=loads.get(i, 0)) for i in ids]


def req(now: float = 0.0, prompt: str = "", user: str | None = None, **headers: str):
    return RouteRequest(now=now, prompt=prompt, user=user, headers=headers)


def policy(name: str):
    """A policy with small blocks (prefix_cache) and a fixed seed (power_of_two)."""
    extra = {"prefix_cache": {"block_size": 2}, "power_of_two": {"seed": 5}}
    return make_policy(name, **extra.get(name, {}))


def first(policy, request, replicas) -> str:
    return policy.choose_replicas(request, replicas)[0]


# -- base: eligibility, outstanding, backoff ------------------------------------------


def test_unhealthy_replicas_are_never_candidates():
    p = make_policy("least_outstanding")
    replicas = [ReplicaState("a", healthy=False), ReplicaState("b"), ReplicaState("c")]
    assert sorted(p.choose_replicas(req(), replicas)) == ["b", "c"]


def test_no_eligible_replica_gives_empty_list():
    p = make_policy()
    assert p.choose_replicas(req(), [ReplicaState("a", healthy=False)]) == []
    assert p.choose_replicas(req(), []) == []


def test_failed_replica_backs_off_doubling_then_probes_one_at_a_time():
    p = make_policy("round_robin", backoff_initial_s=1.0, backoff_max_s=3.0)
    replicas = reps("a", "b")
    p.on_result("a", ok=False, now=10.0)
    assert p.choose_replicas(req(now=10.5), replicas) == ["b"]
    assert "a" in p.choose_replicas(req(now=11.0), replicas)  # backoff over: probing
    p.on_start("a")
    assert p.choose_replicas(req(now=11.0), replicas) == ["b"]  # one probe at a time
    p.on_finish("a")
    p.on_result("a", ok=False, now=11.0)  # second failure: 2 s
    assert p.choose_replicas(req(now=12.9), replicas) == ["b"]
    assert "a" in p.choose_replicas(req(now=13.0), replicas)
    p.on_result("a", ok=False, now=13.0)  # third: 4 s capped to 3 s
    assert p.backed_off("a", 15.9) and not p.backed_off("a", 16.0)
    p.on_result("a", ok=True, now=16.0)  # success clears the record
    p.on_start("a")
    p.on_start("a")
    assert "a" in p.choose_replicas(req(now=16.0), replicas)


def test_outstanding_counts_follow_start_and_finish():
    p = make_policy()
    p.on_start("a")
    p.on_start("a")
    p.on_finish("a")
    assert p.outstanding("a") == 1
    p.on_finish("a")
    p.on_finish("a")  # an extra finish never goes negative
    assert p.outstanding("a") == 0


def test_make_policy_rejects_unknown_names_and_options():
    with pytest.raises(ValueError, match="unknown routing policy 'fastest'"):
        make_policy("fastest")
    with pytest.raises(ValidationError):
        make_policy("round_robin", virtual_nodes=3)
    with pytest.raises(ValidationError):
        make_policy("prefix_cache", block_size=0)
    assert make_policy().name == "least_outstanding"


# -- round robin, least outstanding, power of two -------------------------------------


def test_round_robin_cycles_and_lists_every_replica():
    p = make_policy("round_robin")
    orders = [p.choose_replicas(req(), reps("a", "b", "c")) for _ in range(4)]
    assert [o[0] for o in orders] == ["b", "c", "a", "b"]
    assert all(sorted(o) == ["a", "b", "c"] for o in orders)


def test_least_outstanding_prefers_least_load_from_either_source():
    p = make_policy("least_outstanding")
    for _ in range(3):
        p.on_start("a")
    p.on_start("b")
    assert p.choose_replicas(req(), reps("a", "b", "c", c=2)) == ["b", "c", "a"]


def test_least_outstanding_spreads_ties():
    p = make_policy("least_outstanding")
    firsts = Counter(first(p, req(), reps("a", "b", "c")) for _ in range(30))
    assert firsts == {"a": 10, "b": 10, "c": 10}


def test_power_of_two_puts_the_less_loaded_of_its_two_draws_first():
    p = make_policy("power_of_two", seed=7)
    for _ in range(5):
        p.on_start("a")
    for _ in range(20):
        assert first(p, req(), reps("a", "b")) == "b"
    q = make_policy("power_of_two", rng=random.Random(3))
    firsts = Counter(first(q, req(), reps("a", "b", "c", "d", a=9)) for _ in range(200))
    assert firsts["a"] == 0  # a loses every draw it takes part in
    assert set(firsts) == {"b", "c", "d"}


# -- session affinity ------------------------------------------------------------------


def test_session_affinity_keeps_a_user_on_one_replica():
    p = make_policy("session_affinity")
    replicas = reps("a", "b", "c", "d")
    chosen = {first(p, req(user="alice"), replicas) for _ in range(10)}
    assert len(chosen) == 1
    header = {first(p, req(**{"x-session-id": "alice"}), replicas) for _ in range(3)}
    assert header == chosen  # the header value is the same key as the user field


def test_session_affinity_header_name_is_an_option():
    p = make_policy("session_affinity", header="X-Conversation")
    replicas = reps("a", "b", "c", "d")
    by_key = {k: first(p, req(**{"x-conversation": k}), replicas) for k in map(str, range(40))}
    assert len(set(by_key.values())) > 1
    assert all(first(p, req(**{"x-conversation": k}), replicas) == v for k, v in by_key.items())


def test_session_affinity_without_key_goes_by_load():
    p = make_policy("session_affinity")
    assert first(p, req(), reps("a", "b", a=3)) == "b"


def test_session_affinity_moves_a_key_off_an_overloaded_replica():
    p = make_policy("session_affinity", load_eps=0.25)
    replicas = reps("a", "b", "c", "d")
    home = first(p, req(user="bob"), replicas)
    for _ in range(6):
        p.on_start(home)
    # total 6, bound ceil(1.25 * 7 / 4) = 3: home (6) is over it
    moved = p.choose_replicas(req(user="bob"), replicas)
    assert moved[0] != home and moved[-1] == home


# -- prefix cache ----------------------------------------------------------------------

SYSTEM = "You are a careful assistant. " * 20


def test_prefix_cache_follows_the_replica_that_saw_the_prefix():
    p = make_policy("prefix_cache", block_size=16)
    replicas = reps("a", "b", "c")
    r1 = req(prompt=SYSTEM + "question one")
    target = first(p, r1, replicas)
    p.on_start(target, r1)
    p.on_finish(target)
    for i in range(5):
        assert first(p, req(prompt=SYSTEM + f"another question {i}"), replicas) == target


def test_prefix_cache_without_match_goes_by_load():
    p = make_policy("prefix_cache", block_size=8)
    p.on_start("a", req(prompt="x" * 200))
    assert first(p, req(prompt="completely different text " * 5), reps("a", "b")) == "b"


def test_prefix_cache_guard_falls_back_to_least_load_when_imbalanced():
    p = make_policy(
        "prefix_cache", block_size=16, balance_abs_threshold=4, balance_rel_threshold=1.5
    )
    replicas = reps("a", "b")
    r = req(prompt=SYSTEM)
    p.on_start("a", r)
    assert first(p, r, replicas) == "a"  # a has 1, b has 0: balanced enough
    for _ in range(5):
        p.on_start("a")
    assert first(p, r, replicas) == "b"  # 6 vs 0: imbalanced


def test_prefix_cache_short_match_counts_as_none():
    p = make_policy("prefix_cache", block_size=10, min_match_ratio=0.5)
    p.on_start("a", req(prompt="common preamble text " + "A" * 100))
    p.on_start("b")
    p.on_finish("b")
    # shares 2 of 12 blocks with a: below half, so load decides (a has 1 outstanding)
    assert first(p, req(prompt="common preamble text " + "B" * 100), reps("a", "b")) == "b"


def test_forgetting_a_replica_drops_its_prefixes():
    p = make_policy("prefix_cache", block_size=16)
    p.on_start("a", req(prompt=SYSTEM))
    assert len(p.index) > 0
    p.forget("a")
    assert len(p.index) == 0 and p.outstanding("a") == 0


def test_block_hashes_name_prefixes():
    a = block_hashes(list("abcdefgh"), 4)
    b = block_hashes(list("abcdxxxx"), 4)
    c = block_hashes(list("xxxxefgh"), 4)
    assert len(a) == 2 and a[0] == b[0] and a[1] != b[1] and a[1] != c[1]
    assert block_hashes(list("abc"), 4) == []


# -- properties ------------------------------------------------------------------------

IDS = st.sampled_from(list("abcdef"))
replica_st = st.builds(ReplicaState, IDS, st.booleans(), st.integers(0, 20))
event_st = st.tuples(IDS, st.booleans(), st.floats(0, 100))


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(sorted(POLICIES)),
    replicas=st.lists(replica_st, max_size=8),
    events=st.lists(event_st, max_size=10),
    now=st.floats(0, 120),
    user=st.one_of(st.none(), st.text(max_size=5)),
)
def test_only_eligible_replicas_are_chosen_each_once(name, replicas, events, now, user):
    p = policy(name)
    for rid, ok, t in sorted(events, key=lambda e: e[2]):
        p.on_result(rid, ok, t)
    chosen = p.choose_replicas(req(now=now, prompt="a b c d e f g h", user=user), replicas)
    expected = {r.replica_id for r in replicas if r.healthy and not p.backed_off(r.replica_id, now)}
    assert sorted(chosen) == sorted(expected)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 9), seed=st.integers(0, 1000))
def test_adding_a_replica_moves_only_keys_that_go_to_it(n, seed):
    p = make_policy("session_affinity")
    before_ids = [f"r{seed}-{i}" for i in range(n)]
    new = f"r{seed}-new"
    keys = [f"user-{seed}-{k}" for k in range(300)]
    before = {k: first(p, req(user=k), reps(*before_ids)) for k in keys}
    after = {k: first(p, req(user=k), reps(*before_ids, new)) for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert all(after[k] == new for k in moved)
    assert len(moved) <= len(keys) * (2.0 / (n + 1)) + 15  # about 1/(n+1) of keys move


@settings(max_examples=40, deadline=None)
@given(
    loads=st.lists(st.integers(0, 30), min_size=1, max_size=8),
    eps=st.floats(0.05, 2.0),
    key=st.text(min_size=1, max_size=8),
)
def test_session_affinity_first_choice_is_under_the_load_bound(loads, eps, key):
    p = make_policy("session_affinity", load_eps=eps)
    replicas = [ReplicaState(f"r{i}") for i in range(len(loads))]
    for r, n in zip(replicas, loads, strict=True):
        for _ in range(n):
            p.on_start(r.replica_id)
    top = first(p, req(user=key), replicas)
    assert p.outstanding(top) < p.bound(replicas)


@settings(max_examples=40, deadline=None)
@given(
    prompts=st.lists(
        st.tuples(st.text(alphabet="ab", max_size=60), st.sampled_from(["r1", "r2", "r3"])),
        max_size=40,
    ),
    cap=st.integers(1, 30),
)
def test_prefix_index_stays_within_its_bound_and_prefix_closed(prompts, cap):
    index = PrefixIndex(cap)
    inserted = []
    for text, rid in prompts:
        hashes = block_hashes(text, 4)
        index.insert(hashes, rid)
        inserted.append((hashes, rid))
        assert len(index) <= cap
    for hashes, rid in inserted:
        held = [rid in index._holders.get(h, set()) for h in hashes]
        assert held == sorted(held, reverse=True)  # a held block's ancestors are held


@settings(max_examples=20, deadline=None)
@given(
    name=st.sampled_from(sorted(POLICIES)),
    ops=st.lists(
        st.tuples(st.sampled_from(["choose", "finish", "fail"]), st.text("abc ", max_size=40)),
        max_size=30,
    ),
)
def test_policies_are_deterministic(name, ops):
    def run() -> list[list[str]]:
        p = policy(name)
        replicas = reps("a", "b", "c", "d")
        out, t = [], 0.0
        for op, text in ops:
            t += 0.5
            r = req(now=t, prompt=text, user=text or None)
            if op == "choose":
                chosen = p.choose_replicas(r, replicas)
                out.append(chosen)
                if chosen:
                    p.on_start(chosen[0], r)
            elif op == "finish":
                for rid in "abcd":
                    p.on_finish(rid)
            else:
                p.on_result("abcd"[len(text) % 4], False, t)
        return out

    assert run() == run()


def test_load_is_own_outstanding_plus_what_others_put_on_the_replica():
    p = make_policy("least_outstanding")
    for _ in range(2):
        p.on_start("a")
    # a reported 5 when this gateway had 2 there: 3 are someone else's; b has 1 of ours.
    a = ReplicaState("a", reported_load=5, own_at_report=2)
    p.on_start("b")
    b = ReplicaState("b", reported_load=1, own_at_report=1)
    assert (p.load(a), p.load(b)) == (5, 1)
    p.on_finish("a")  # ours finish live; the others' stay as last reported
    assert p.load(a) == 4
    # A report that lags behind this gateway's own sends never counts below them.
    assert p.load(ReplicaState("a", reported_load=0, own_at_report=0)) == 1
    assert first(p, req(), [a, b]) == "b"


def test_prefix_cache_guard_is_relative_and_acts_at_small_scale():
    p = make_policy("prefix_cache", block_size=16)  # defaults: rel 1.5, abs 2
    r = req(prompt=SYSTEM)
    p.on_start("a", r)
    replicas = reps("a", "b", "c")
    p.on_start("a")
    assert first(p, r, replicas) == "a"  # 2 <= 1.5 x 0 + 2: a keeps its prefix
    p.on_start("a")
    assert first(p, r, replicas) in ("b", "c")  # 3 > 2: overloaded, the least loaded
    p.on_start("b")
    p.on_start("c")
    assert first(p, r, replicas) == "a"  # 3 <= 1.5 x 1 + 2: relative to the least load
    for _ in range(2):
        p.on_start("a")
    assert first(p, r, replicas) in ("b", "c")  # 5 > 3.5

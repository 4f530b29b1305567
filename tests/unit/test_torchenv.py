"""torchrun-compatible worker environment from a gang placement."""

from __future__ import annotations

import pytest

from aicluster.runtime.torchenv import rank_layout, worker_env


def layout_table(placement):
    return [rank_layout(placement, r) for r in range(len(placement))]


def test_two_ranks_on_each_of_two_nodes():
    assert layout_table(["a", "a", "b", "b"]) == [
        {"NODE_RANK": 0, "LOCAL_RANK": 0, "LOCAL_WORLD_SIZE": 2, "NNODES": 2},
        {"NODE_RANK": 0, "LOCAL_RANK": 1, "LOCAL_WORLD_SIZE": 2, "NNODES": 2},
        {"NODE_RANK": 1, "LOCAL_RANK": 0, "LOCAL_WORLD_SIZE": 2, "NNODES": 2},
        {"NODE_RANK": 1, "LOCAL_RANK": 1, "LOCAL_WORLD_SIZE": 2, "NNODES": 2},
    ]


def test_interleaved_placement_numbers_nodes_by_first_appearance():
    assert layout_table(["a", "b", "a"]) == [
        {"NODE_RANK": 0, "LOCAL_RANK": 0, "LOCAL_WORLD_SIZE": 2, "NNODES": 2},
        {"NODE_RANK": 1, "LOCAL_RANK": 0, "LOCAL_WORLD_SIZE": 1, "NNODES": 2},
        {"NODE_RANK": 0, "LOCAL_RANK": 1, "LOCAL_WORLD_SIZE": 2, "NNODES": 2},
    ]


def test_node_rank_follows_first_appearance_not_name_order():
    table = layout_table(["zeta", "alpha", "zeta", "mid"])
    assert [row["NODE_RANK"] for row in table] == [0, 1, 0, 2]
    assert [row["LOCAL_RANK"] for row in table] == [0, 0, 1, 0]
    assert [row["LOCAL_WORLD_SIZE"] for row in table] == [2, 1, 2, 1]
    assert {row["NNODES"] for row in table} == {3}


def test_single_worker():
    assert rank_layout(["only"], 0) == {
        "NODE_RANK": 0,
        "LOCAL_RANK": 0,
        "LOCAL_WORLD_SIZE": 1,
        "NNODES": 1,
    }


def test_tuple_placement_gives_the_same_layout():
    placement = ["a", "b", "a", "c", "b"]
    assert layout_table(tuple(placement)) == layout_table(placement)


@pytest.mark.parametrize(
    "placement", [["a", "a", "b", "b"], ["a", "b", "a"], ["x"] * 8, ["n1", "n2", "n3", "n2", "n1"]]
)
def test_local_ranks_on_each_node_are_0_to_local_world_size(placement):
    table = layout_table(placement)
    for node in set(placement):
        rows = [row for p, row in zip(placement, table) if p == node]
        assert sorted(row["LOCAL_RANK"] for row in rows) == list(range(len(rows)))
        assert {row["LOCAL_WORLD_SIZE"] for row in rows} == {len(rows)}
        assert len({row["NODE_RANK"] for row in rows}) == 1
    assert sorted({row["NODE_RANK"] for row in table}) == list(range(len(set(placement))))


def test_worker_env_for_a_gpu_worker():
    env = worker_env(
        placement=["a", "b", "a"], rank=2, master_addr="10.0.0.1", master_port=29500, gpu_ids=[3, 5]
    )
    assert env == {
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "WORLD_SIZE": "3",
        "RANK": "2",
        "GROUP_RANK": "0",
        "ROLE_RANK": "2",
        "ROLE_WORLD_SIZE": "3",
        "CUDA_VISIBLE_DEVICES": "3,5",
        "NODE_RANK": "0",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "NNODES": "2",
    }


def test_worker_env_values_are_all_strings():
    env = worker_env(placement=("a", "a"), rank=1, master_addr="h", master_port=1, gpu_ids=[0])
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())


def test_cpu_worker_gets_empty_cuda_visible_devices():
    env = worker_env(placement=["a"], rank=0, master_addr="h", master_port=1, gpu_ids=[])
    assert env["CUDA_VISIBLE_DEVICES"] == ""


@pytest.mark.parametrize(
    "gpu_ids, expected", [([0], "0"), ([0, 1, 2, 3], "0,1,2,3"), (["7", "2"], "7,2")]
)
def test_cuda_visible_devices_joined_with_commas(gpu_ids, expected):
    env = worker_env(placement=["a"], rank=0, master_addr="h", master_port=1, gpu_ids=gpu_ids)
    assert env["CUDA_VISIBLE_DEVICES"] == expected


def test_every_rank_of_a_gang_agrees_on_world_and_master():
    placement = ["a", "a", "b", "b"]
    envs = [
        worker_env(placement=placement, rank=r, master_addr="m", master_port=9, gpu_ids=[r % 2])
        for r in range(4)
    ]
    assert [e["RANK"] for e in envs] == ["0", "1", "2", "3"]
    assert [e["NODE_RANK"] for e in envs] == ["0", "0", "1", "1"]
    assert [e["GROUP_RANK"] for e in envs] == ["0", "0", "1", "1"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "0", "1"]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0", "1", "0", "1"]
    for e in envs:
        assert (e["WORLD_SIZE"], e["NNODES"], e["LOCAL_WORLD_SIZE"]) == ("4", "2", "2")
        assert (e["MASTER_ADDR"], e["MASTER_PORT"]) == ("m", "9")

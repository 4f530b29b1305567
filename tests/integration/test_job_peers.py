"""A job whose gang spans two nodes shares its input between them (runtime.peers): the
storage is read once for the whole gang, and every rank says where its bytes came from."""

from __future__ import annotations

import os
import re

from aicluster.client import artifacts as arts

from harness import TERMINAL

COUNTS = re.compile(
    r"aicluster inputs: ready model: .*; ([\d.]+) MiB from peers, ([\d.]+) MiB from storage, "
    r"(\d+) fallbacks"
)


def test_a_two_node_gang_reads_its_input_from_storage_once(admin, gpu_nodes, tmp_path):
    src = tmp_path / "model"
    src.mkdir()
    (src / "weights.bin").write_bytes(os.urandom(40 << 20))  # stored as 3 chunks
    for i in range(6):
        (src / f"part{i}.bin").write_bytes(os.urandom(64 << 10))
    arts.push(admin, src, "default/peer-model", "model")
    total_mib = (40 * 1024 + 6 * 64) / 1024
    spec = {
        "kind": "job",
        "name": "peer-input",
        "workers": 2,
        "resources": {"cpus": 1, "gpus": 2},  # a node's 2 GPUs each: one rank per node
        "command": "cmp model/weights.bin model/weights.bin && echo input-ok",
        "inputs": [{"artifact": "default/peer-model:1", "path": "model"}],
    }
    job = admin.submit(spec, None)
    done = admin.wait(job["id"], TERMINAL, timeout=120)
    assert done["status"] == "SUCCEEDED", done
    assert len(set(done["placement"])) == 2
    storage = 0.0
    for rank in range(2):
        log = admin.logs(job["id"], rank=rank)[0].decode()
        assert "input-ok" in log
        found = COUNTS.search(log)
        if found is None:  # the other node had brought it all into a cache they share
            assert "aicluster inputs: ready model: in this node's cache" in log, log
            continue
        assert found.group(3) == "0", log
        storage += float(found.group(2))
    # the two nodes of this test share one machine (and so one cache folder): each read
    # only its stripe from storage, the rest came from the other's peer server or the cache
    assert abs(storage - total_mib) <= 0.2, (storage, total_mib)

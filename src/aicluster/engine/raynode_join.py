"""Join a worker node to a head that listens on loopback only.

`ray start --address` rewrites a loopback head address to the machine's network
address (and refuses to run when told not to), so a loopback-only cluster of
several nodes on one machine cannot be joined through it. This starts the node
the way `ray start` does, with the address taken literally. Run as
`python -m aicluster.engine.raynode_join JSON`; the node's processes outlive it.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str] | None = None) -> None:
    args = json.loads((argv or sys.argv[1:])[0])
    import ray._private.node
    from ray._private.parameter import RayParams

    params = RayParams(
        gcs_address=args["gcs_address"],
        node_ip_address=args["node_ip"],
        num_cpus=args.get("num_cpus"),
        num_gpus=args.get("num_gpus"),
        labels=args.get("labels") or {},
        temp_dir=args["temp_dir"],
        dashboard_agent_listen_port=args["dashboard_agent_listen_port"],
        runtime_env_agent_port=args["runtime_env_agent_port"],
        metrics_export_port=args["metrics_export_port"],
    )
    ray._private.node.Node(params, head=False, shutdown_at_exit=False, spawn_reaper=False)
    print(f"joined {args['gcs_address']} from {args['node_ip']}")


if __name__ == "__main__":
    main()

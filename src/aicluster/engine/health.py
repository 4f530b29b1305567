"""Health agents: one detached Ray actor per node that measures it on request.

Named `aic-health-<node id>` and pinned to its node (hard node affinity, no CPU
held). A control plane that restarts finds them by name; an agent on a dead node
simply stops answering, which the node loop reads as "no report".
"""

from __future__ import annotations

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from aicluster.core.health import HealthReport, Thresholds, evaluate
from aicluster.engine.protocol import NodeInfo
from aicluster.runtime.health_agent import run_commands, sample_gpus, sample_host


class _Agent:
    def report(self, declared_gpus: int, commands: dict[str, str]) -> HealthReport:
        return evaluate(
            sample_host(), sample_gpus(), declared_gpus, run_commands(commands), Thresholds()
        )


_RemoteAgent = ray.remote(num_cpus=0, max_restarts=0)(_Agent)


def agent_name(node_id: str) -> str:
    return f"aic-health-{node_id}"


class HealthAgents:
    def __init__(self, namespace: str, timeout: float = 30.0):
        self.namespace, self.timeout = namespace, timeout

    def _get(self, node_id: str):
        try:
            return ray.get_actor(agent_name(node_id), namespace=self.namespace)
        except ValueError:
            return None

    def ensure(self, nodes: list[NodeInfo]) -> None:
        for n in nodes:
            if n.alive and self._get(n.node_id) is None:
                try:
                    _RemoteAgent.options(
                        name=agent_name(n.node_id),
                        namespace=self.namespace,
                        lifetime="detached",
                        scheduling_strategy=NodeAffinitySchedulingStrategy(n.node_id, soft=False),
                    ).remote()
                except ValueError:
                    pass  # created meanwhile by another pass

    def reports(
        self, nodes: list[NodeInfo], commands: dict[str, str]
    ) -> dict[str, HealthReport | None]:
        refs = {}
        for n in nodes:
            agent = self._get(n.node_id) if n.alive else None
            if agent is not None:
                refs[n.node_id] = agent.report.remote(n.gpus, commands)
        out: dict[str, HealthReport | None] = {n.node_id: None for n in nodes}
        for node_id, ref in refs.items():
            try:
                out[node_id] = ray.get(ref, timeout=self.timeout)
            except Exception:  # noqa: BLE001 - an agent that cannot answer gives no report
                out[node_id] = None
        return out

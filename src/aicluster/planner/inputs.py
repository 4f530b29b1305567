"""Resolve a `kind: plan` spec against the catalog into the planner's requests.

Invariant: `resolve` either returns complete, typed inputs or raises PlanInputError
listing every problem with the spec field it comes from (`serve.0.model`,
`hardware.node`, `models.my-model.layers`); it does no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from aicluster.planner.assumptions import Assumptions
from aicluster.planner.hardware import (
    Catalog,
    CatalogError,
    Gpu,
    Interconnect,
    ModelShape,
    NodeShape,
    Storage,
)
from aicluster.planner.inference import ServeRequest
from aicluster.planner.spec import PlanSpec, ServeWorkload, TrainWorkload
from aicluster.planner.training import TrainRequest

DEFAULT_BATCH_TOKENS = {"full": 4 * 2**20, "lora": 2**18, "qlora": 2**18}
NETWORK_KINDS = ("ethernet", "infiniband")


class PlanInputError(ValueError):
    def __init__(self, issues: list[tuple[str, str]]):
        super().__init__("; ".join(f"{f}: {m}" for f, m in issues))
        self.issues = issues


@dataclass(frozen=True)
class PlanInputs:
    name: str
    description: str | None
    assumptions: Assumptions
    budget_usd: float | None
    network: Interconnect
    nics_per_node: int | None
    storage: Storage
    serve: tuple[ServeRequest, ...]
    train: tuple[TrainRequest, ...]
    node_of: dict[str, NodeShape] = field(default_factory=dict)  # workload name -> node shape
    catalog: Catalog | None = None

    def node_network_gb_s(self, node: NodeShape) -> float:
        """All compute NICs of one node together, per direction, GB/s."""
        return (self.nics_per_node or node.nics) * self.network.gb_s


def _overrides(spec: PlanSpec) -> dict[str, dict[str, dict]]:
    hw = spec.hardware
    dump = lambda d: {k: v.model_dump(exclude_none=True) for k, v in d.items()}
    return {
        "gpus": dump(hw.gpus),
        "nodes": dump(hw.nodes),
        "interconnects": dump(hw.interconnects),
        "storage": dump(hw.storage),
        "models": dump(spec.models),
    }


def _spec_field(err: CatalogError, section_paths: dict[str, str]) -> str:
    """Map a catalog field (`gpus.x.memory_gib`) to where the spec sets it."""
    section, _, rest = err.field.partition(".")
    prefix = section_paths.get(section, section)
    return f"{prefix}.{rest}" if rest else prefix


_SECTION_PATHS = {
    "gpus": "hardware.gpus",
    "nodes": "hardware.nodes",
    "interconnects": "hardware.interconnects",
    "storage": "hardware.storage",
    "models": "models",
}


def _assumptions(spec: PlanSpec) -> Assumptions:
    given = spec.constraints.model_dump(exclude_none=True)
    known = {f.name for f in fields(Assumptions)}
    return Assumptions(**{k: v for k, v in given.items() if k in known})


class _Resolver:
    def __init__(self, spec: PlanSpec, catalog: Catalog):
        self.spec = spec
        self.catalog = catalog.with_overrides(_overrides(spec))
        self.issues: list[tuple[str, str]] = []

    def get(self, section: str, key: str, where: str):
        try:
            return self.catalog.get(section, key)
        except CatalogError as err:
            if err.field == f"{section}.{key}":
                self.issues.append(
                    (
                        where,
                        f"unknown {section[:-1] if section != 'storage' else 'storage'} {key!r}; known: {', '.join(self.catalog.names(section))}",
                    )
                )
            else:
                self.issues.append((_spec_field(err, _SECTION_PATHS), err.message))
            return None

    def model(self, w: ServeWorkload | TrainWorkload, where: str) -> ModelShape | None:
        if w.architecture is not None:
            data = w.architecture.model_dump(exclude_none=True)
            return ModelShape(key=w.name, name=f"{w.name} (architecture)", **data)
        return self.get("models", w.model or "", f"{where}.model")

    def node(self, w: ServeWorkload | TrainWorkload, where: str) -> tuple[NodeShape, Gpu] | None:
        key = w.node or self.spec.hardware.node
        node = self.get("nodes", key, f"{where}.node" if w.node else "hardware.node")
        if node is None:
            return None
        gpu = self.get("gpus", node.gpu, f"hardware.nodes.{key}.gpu")
        return (node, gpu) if gpu else None


def resolve(spec: PlanSpec, catalog: Catalog) -> PlanInputs:
    r = _Resolver(spec, catalog)
    hw = spec.hardware
    network = r.get("interconnects", hw.network, "hardware.network")
    if network is not None and network.kind not in NETWORK_KINDS:
        r.issues.append(
            (
                "hardware.network",
                f"{hw.network!r} is {network.kind}, not a network between nodes (ethernet or infiniband)",
            )
        )
    storage = r.get("storage", hw.shared_storage, "hardware.shared_storage")
    a = _assumptions(spec)
    node_of: dict[str, NodeShape] = {}
    serve, train = [], []
    for i, w in enumerate(spec.serve):
        where = f"serve.{i}"
        model, placed = r.model(w, where), r.node(w, where)
        if model is None or placed is None:
            continue
        node, gpu = placed
        node_of[w.name] = node
        serve.append(_serve_request(w, model, gpu, node))
    for i, w in enumerate(spec.train):
        where = f"train.{i}"
        model, placed = r.model(w, where), r.node(w, where)
        if model is None or placed is None or network is None:
            continue
        node, gpu = placed
        node_of[w.name] = node
        nic_gb_s = (hw.nics_per_node or node.nics) * network.gb_s
        train.append(_train_request(w, model, gpu, node, nic_gb_s))
    if r.issues:
        raise PlanInputError(r.issues)
    assert network is not None and storage is not None
    return PlanInputs(
        name=spec.name,
        description=spec.description,
        assumptions=a,
        budget_usd=spec.constraints.budget_usd,
        network=network,
        nics_per_node=hw.nics_per_node,
        storage=storage,
        serve=tuple(serve),
        train=tuple(train),
        node_of=node_of,
        catalog=r.catalog,
    )


def _serve_request(w: ServeWorkload, model: ModelShape, gpu: Gpu, node: NodeShape) -> ServeRequest:
    kv = w.kv_precision or ("fp8" if w.precision == "fp8" else "bf16")
    return ServeRequest(
        name=w.name,
        model=model,
        gpu=gpu,
        gpus_per_node=node.gpus,
        precision=w.precision,
        kv_precision=kv,
        context_length=w.context_length or (w.prompt_tokens + w.output_tokens),
        prompt_tokens=w.prompt_tokens,
        output_tokens=w.output_tokens,
        requests_per_second=w.requests_per_second,
        concurrent_users=w.concurrent_users,
        ttft_s=w.ttft_ms / 1000 if w.ttft_ms else None,
        tpot_s=w.tpot_ms / 1000 if w.tpot_ms else None,
        tensor_parallel=w.tensor_parallel,
        pipeline_parallel=w.pipeline_parallel,
        min_replicas=w.min_replicas,
    )


def _train_request(
    w: TrainWorkload, model: ModelShape, gpu: Gpu, node: NodeShape, nic_gb_s: float
) -> TrainRequest:
    target = None
    if w.target_hours:
        target = w.target_hours * 3600
    elif w.target_days:
        target = w.target_days * 86400
    return TrainRequest(
        name=w.name,
        model=model,
        gpu=gpu,
        gpus_per_node=node.gpus,
        node_network_gb_s=nic_gb_s,
        tokens=w.tokens * w.epochs,
        method=w.method,
        sequence_length=w.sequence_length,
        global_batch_tokens=int(w.global_batch_tokens or DEFAULT_BATCH_TOKENS[w.method]),
        micro_batch=w.micro_batch,
        lora_rank=w.lora_rank,
        lora_targets=w.lora_targets,
        strategy="zero3" if w.strategy == "fsdp" else w.strategy,
        tensor_parallel=w.tensor_parallel,
        pipeline_parallel=w.pipeline_parallel,
        checkpointing=w.activation_checkpointing,
        gpus=w.gpus,
        target_seconds=target,
        precision=w.precision,
    )

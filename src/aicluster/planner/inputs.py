"""Resolve a `kind: plan` spec against the catalog into the planner's requests.

Invariant: `resolve` either returns complete, typed inputs or raises PlanInputError
listing every problem with the spec field it comes from (`serve.0.model`,
`hardware.node`, `models.my-model`); it does no I/O. Inline nodes and GPUs (a mapping
where a name is accepted) join the catalog under keys of their own (`custom`,
`custom-<workload>`, `<node>-gpu`) and their errors name the inline field. The checks that
need the catalog (`checks`) run here; their warnings travel in `PlanInputs.warnings`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from aicluster.planner.assumptions import Assumptions
from aicluster.planner.checks import (
    constraint_findings,
    model_findings,
    serve_findings,
    train_findings,
)
from aicluster.planner.hardware import (
    Catalog,
    CatalogError,
    Gpu,
    Interconnect,
    ModelShape,
    NodeShape,
    Storage,
    required_fields,
)
from aicluster.planner.inference import ServeRequest
from aicluster.planner.spec import (
    GpuOverride,
    NodeOverride,
    PlanSpec,
    ServeWorkload,
    TrainWorkload,
)
from aicluster.planner.training import TrainRequest

DEFAULT_BATCH_TOKENS = {"full": 4 * 2**20, "lora": 2**18, "qlora": 2**18}
NETWORK_KINDS = ("ethernet", "infiniband")


class PlanInputError(ValueError):
    def __init__(self, issues: list[tuple[str, str]]):
        issues = list(dict.fromkeys(issues))  # one workload's problem may be found twice
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
    warnings: tuple[tuple[str, str], ...] = ()  # (spec field, message): implausible inputs

    def node_network_gb_s(self, node: NodeShape) -> float:
        """All compute NICs of one node together, per direction, GB/s."""
        return (self.nics_per_node or node.nics) * self.network.gb_s


_SECTION_PATHS = {
    "gpus": "hardware.gpus",
    "nodes": "hardware.nodes",
    "interconnects": "hardware.interconnects",
    "storage": "hardware.storage",
    "models": "models",
}
_KIND = {
    "gpus": "GPU",
    "nodes": "node",
    "interconnects": "interconnect",
    "storage": "storage",
    "models": "model",
}
# How to declare what the catalog lacks, per section.
_DECLARE = {
    "gpus": "declare it inline (gpu: {{memory_gib: 80, memory_bandwidth_gb_s: 2039, "
    "bf16_tflops: 312, tdp_w: 300}}) or under hardware.gpus.{key} with memory_gib, "
    "memory_bandwidth_gb_s, bf16_tflops and tdp_w",
    "nodes": "declare it inline (node: {{gpu: <a GPU>, gpus: 8, power_w: 6000}}) or under "
    "hardware.nodes.{key} with gpu, gpus and power_w",
    "interconnects": "declare it under hardware.interconnects.{key} with kind and gbit_s",
    "storage": "declare it under hardware.storage.{key} with read_gb_s and write_gb_s",
    "models": "give its shape under models.{key} (layers, hidden_size, attention_heads, "
    "vocab_size) or use architecture instead of model",
}


def _assumptions(spec: PlanSpec) -> Assumptions:
    given = spec.constraints.model_dump(exclude_none=True)
    known = {f.name for f in fields(Assumptions)}
    return Assumptions(**{k: v for k, v in given.items() if k in known})


class _Resolver:
    """The catalog with the spec's entries merged in (inline nodes and GPUs get keys of
    their own), and every problem found, each with the spec field it comes from."""

    def __init__(self, spec: PlanSpec, catalog: Catalog):
        self.spec = spec
        self.base = catalog
        self.issues: list[tuple[str, str]] = []
        self.warnings: list[tuple[str, str]] = []
        self.paths: dict[tuple[str, str], str] = {}  # (section, key) -> where the spec gives it
        self.overrides: dict[str, dict[str, dict]] = {s: {} for s in _SECTION_PATHS}
        hw = spec.hardware
        for section, entries in (
            ("gpus", hw.gpus),
            ("interconnects", hw.interconnects),
            ("storage", hw.storage),
            ("models", spec.models),
        ):
            for key, entry in entries.items():
                self.overrides[section][key] = entry.model_dump(exclude_none=True)
                self.paths[(section, key)] = f"{_SECTION_PATHS[section]}.{key}"
        for key, node in hw.nodes.items():
            self._add_node(key, node, f"hardware.nodes.{key}")
        self.default_node = self._node_key(hw.node, "hardware.node", "custom")
        self.node_keys: dict[str, str] = {}
        for group, workloads in (("serve", spec.serve), ("train", spec.train)):
            for i, w in enumerate(workloads):
                self.node_keys[w.name] = (
                    self._node_key(w.node, f"{group}.{i}.node", f"custom-{w.name}")
                    if w.node is not None
                    else self.default_node
                )
        self.catalog = catalog.with_overrides(self.overrides)

    def _fresh(self, section: str, key: str) -> str:
        """A key for an inline entry that no catalog or spec entry uses."""
        taken = lambda k: self.base.has(section, k) or k in self.overrides[section]
        out, n = key, 2
        while taken(out):
            out, n = f"{key}-{n}", n + 1
        return out

    def _add_node(self, key: str, node: NodeOverride, path: str) -> None:
        data = node.model_dump(exclude_none=True, exclude={"gpu"})
        if isinstance(node.gpu, GpuOverride):
            gkey = self._fresh("gpus", f"{key}-gpu")
            self.overrides["gpus"][gkey] = node.gpu.model_dump(exclude_none=True)
            self.paths[("gpus", gkey)] = f"{path}.gpu"
            data["gpu"] = gkey
        elif node.gpu is not None:
            data["gpu"] = node.gpu
        self.overrides["nodes"][key] = data
        self.paths[("nodes", key)] = path

    def _node_key(self, ref: str | NodeOverride, path: str, key: str) -> str:
        """The catalog key of a node reference; an inline node is added under a new key."""
        if isinstance(ref, str):
            return ref
        key = self._fresh("nodes", key)
        if ref.name is None and ref.gpus and ref.gpu is not None:
            gpu = ref.gpu if isinstance(ref.gpu, str) else (ref.gpu.name or "custom GPU")
            ref = ref.model_copy(update={"name": f"custom node ({ref.gpus} x {gpu})"})
        self._add_node(key, ref, path)
        return key

    def _where(self, section: str, key: str) -> str:
        return self.paths.get((section, key), f"{_SECTION_PATHS[section]}.{key}")

    def get(self, section: str, key: str, where: str):
        try:
            return self.catalog.get(section, key)
        except CatalogError as err:
            kind = _KIND[section]
            if not self.catalog.has(section, key):
                known = ", ".join(self.catalog.names(section))
                hint = _DECLARE[section].format(key=key)
                if section == "nodes" and self.catalog.has("gpus", key):
                    hint = (
                        f"{key!r} is a GPU: give a node with it inline (node: {{gpu: {key}, "
                        f"gpus: 8, power_w: 6000}}) or under hardware.nodes.<name> with gpu, "
                        "gpus and power_w"
                    )
                self.issues.append((where, f"unknown {kind} {key!r}; {hint}; known: {known}"))
                return None
            entry = self._where(section, key)
            field = entry + err.field[len(f"{section}.{key}") :]
            if err.missing:
                paths = ", ".join(f"{entry}.{m}" for m in err.missing)
                need = ", ".join(required_fields(section))
                message = f"incomplete {kind}: missing {paths} (a new {kind} needs {need})"
            else:
                message = err.message
            self.issues.append((field, message))
            return None

    def model(self, w: ServeWorkload | TrainWorkload, where: str) -> tuple[ModelShape, str] | None:
        """The model and the spec path of its shape (for messages about its fields)."""
        if w.architecture is not None:
            data = w.architecture.model_dump(exclude_none=True)
            m = ModelShape(key=w.name, name=f"{w.name} (architecture)", **data)
            return m, f"{where}.architecture"
        key = w.model or ""
        m = self.get("models", key, f"{where}.model")
        return (m, self._where("models", key)) if m is not None else None

    def node(self, w: ServeWorkload | TrainWorkload, where: str) -> tuple[NodeShape, Gpu] | None:
        key = self.node_keys[w.name]
        ref = f"{where}.node" if w.node is not None else "hardware.node"
        node = self.get("nodes", key, ref)
        gkey = node.gpu if node else self.catalog.entries.get("nodes", {}).get(key, {}).get("gpu")
        if not isinstance(gkey, str):
            return None
        # the GPU is checked even when its node is incomplete: every problem in one run
        gpu = self.get("gpus", gkey, f"{self._where('nodes', key)}.gpu")
        return (node, gpu) if node and gpu else None

    def check(self, found: tuple[list, list]) -> bool:
        """Record errors and warnings; True when there were no errors."""
        errors, warnings = found
        self.issues.extend(errors)
        self.warnings.extend(warnings)
        return not errors


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
    r.warnings.extend(constraint_findings(spec))
    node_of: dict[str, NodeShape] = {}
    serve, train = [], []
    for i, w in enumerate(spec.serve):
        where = f"serve.{i}"
        found, placed = r.model(w, where), r.node(w, where)
        if found is None or placed is None:
            continue
        (model, model_where), (node, gpu) = found, placed
        ok = r.check(model_findings(model, model_where))
        if not r.check(serve_findings(w, where, model, node, model_where)) or not ok:
            continue
        node_of[w.name] = node
        serve.append(_serve_request(w, model, gpu, node))
    for i, w in enumerate(spec.train):
        where = f"train.{i}"
        found, placed = r.model(w, where), r.node(w, where)
        if found is None or placed is None or network is None:
            continue
        (model, model_where), (node, gpu) = found, placed
        ok = r.check(model_findings(model, model_where))
        if not r.check(train_findings(w, where, model, node, model_where)) or not ok:
            continue
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
        warnings=tuple(dict.fromkeys(r.warnings)),
    )


def _serve_request(w: ServeWorkload, model: ModelShape, gpu: Gpu, node: NodeShape) -> ServeRequest:
    kv = w.kv_dtype
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
        expert_parallel=w.expert_parallel or 1,
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
        lora_targets=w.lora_targets
        if isinstance(w.lora_targets, str)
        else tuple(dict.fromkeys(w.lora_targets)),
        optimizer=w.optimizer,
        master_weights=w.master_weights,
        offload_optimizer=w.offload_optimizer,
        strategy="zero3" if w.strategy == "fsdp" else w.strategy,
        tensor_parallel=w.tensor_parallel,
        pipeline_parallel=w.pipeline_parallel,
        context_parallel=w.context_parallel,
        expert_parallel=w.expert_parallel,
        checkpointing=w.activation_checkpointing,
        gpus=w.gpus,
        target_seconds=target,
        precision=w.precision,
    )

"""The cluster planner: size a cluster before it is bought. Independent of scheduling.

- `spec`: the `kind: plan` spec (pydantic, strict) and its loader, built on the `spec`
  layer's `SpecLoader`.
- `catalog/`: the shipped GPUs, node shapes, interconnects, storage and models (YAML
  package data, every figure with its source) and `load_catalog()`.
- The arithmetic, pure and deterministic (no I/O): `inputs.resolve(spec, catalog)` turns
  a plan spec and catalog data into requests, after the `checks` that need the catalog
  (errors and warnings naming their fields); `plan.make_plan` sizes every workload
  (`memory`, `inference`, `training`, `network`, `storage`), builds the cluster
  (`cluster`, `power_cost`) and names the pitfalls (`pitfalls`); `inventory` answers the
  same questions against a live cluster's node list (plain dicts). Each formula is
  documented next to its code with its source; the figures come from the catalog.
- `report`: Markdown and HTML reports of `plan.plan_to_dict` output (pure formatting).
- `calibrate`: `aicluster doctor`'s measured figures in place of assumed efficiencies.

Imports only `spec` helpers from the rest of aicluster, and `core.doctor`'s pure judgement
(for `calibrate`): no scheduling (the rest of `core`), store, engine, control or API.
`aicluster plan` (`cli/plan_cmds.py`) is the command on top.
"""

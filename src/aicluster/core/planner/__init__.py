"""Planner arithmetic: size a cluster before it is bought.

Pure and deterministic (no I/O): `inputs.resolve(spec, catalog)` turns a `kind: plan` spec
and catalog data into requests; `plan.make_plan` sizes every workload (`memory`,
`inference`, `training`, `network`, `storage`), builds the cluster (`cluster`,
`power_cost`) and names the pitfalls (`pitfalls`); `inventory` answers the same questions
against a live cluster's node list. Each formula is documented next to its code with its
source; the figures it uses come from the catalog, which cites its own.
"""

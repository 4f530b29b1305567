"""Pure, deterministic decisions: the cluster model, job lifecycle, admission.

Invariant: nothing in `core` does I/O, reads a clock or holds mutable globals.
Inputs are immutable snapshots; outputs are decisions as data.
"""

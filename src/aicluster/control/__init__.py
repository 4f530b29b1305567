"""Reconcile loops and the service functions the API calls.

Invariant: level-triggered and idempotent. Each tick reads desired state from the
store and actual state from the engine and closes the gap; a control plane killed
at any moment and started again loses no job and starts none twice.
"""

"""What runs on worker nodes: the worker and its sandbox, engine adapters and the replica
process, the node blob cache, the health agent, the simulated and built-in engines."""

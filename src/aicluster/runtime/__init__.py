"""What runs on worker nodes: the worker launcher and, later, engine adapters."""

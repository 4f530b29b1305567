"""The only layer that calls Ray: inventory, launching gangs, status, logs, stopping.

`control` talks to an `Engine` (see protocol.py); RayEngine is the real one.
"""

"""The `aicluster` command and the Python SDK it uses."""

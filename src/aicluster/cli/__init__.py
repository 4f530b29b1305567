"""The `aicluster` command (typer + rich), on top of the SDK in `aicluster.client`."""

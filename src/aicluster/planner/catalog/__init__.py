"""The shipped hardware and model catalog (YAML package data) and its loader.

Invariant: the catalog is data; every figure in it carries a source (a vendor
datasheet, a model config, a paper, or the word "assumption"). This module only
reads the files; the records and arithmetic over them live in the rest of
`aicluster.planner` (`hardware.Catalog`).
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import yaml

from aicluster.planner.hardware import SECTIONS, Catalog

FILES = ("gpus.yaml", "nodes.yaml", "interconnects.yaml", "storage.yaml", "models.yaml")


def load_catalog_data() -> dict[str, dict[str, dict[str, Any]]]:
    """Every section of the shipped catalog as plain dicts."""
    data: dict[str, dict[str, dict[str, Any]]] = {s: {} for s in SECTIONS}
    root = resources.files(__name__)
    for name in FILES:
        doc = yaml.safe_load(root.joinpath(name).read_text(encoding="utf-8")) or {}
        for section, entries in doc.items():
            data.setdefault(section, {}).update(entries or {})
    return data


def load_catalog() -> Catalog:
    return Catalog(load_catalog_data())

"""Marks every multi-process test ``distributed`` (pyproject.toml's marker), so ``pytest -m "not
distributed"`` runs the single-process tests alone: what `make test`'s legs on the oldest and newest
torch run (scripts/torch_leg.sh). Tests of the 4-rank harness are marked here by their class; files
that launch ranks themselves (torchrun, multiprocessing) carry ``pytestmark`` of their own."""

from __future__ import annotations

import pytest

from torch_shard.testing import MultiProcessTestCase


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        cls = getattr(item, "cls", None)
        if cls is not None and issubclass(cls, MultiProcessTestCase):
            item.add_marker(pytest.mark.distributed)

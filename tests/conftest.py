"""Marks every multi-process test ``distributed`` (pyproject.toml's marker), so ``pytest -m "not
distributed"`` runs the single-process tests alone: what `make test`'s legs on the oldest and newest
torch run (scripts/torch_leg.sh). Tests of the 4-rank harness are marked here by their class; files
that launch ranks themselves (torchrun, multiprocessing) carry ``pytestmark`` of their own.

Tests of the test-only ops skip where the test library is not installed (``requires_testing_library``),
which only a wheel's install lacks; a torch_shard imported from a source checkout must have it, so
there they always run."""

from __future__ import annotations

import os

import pytest

import torch_shard
from torch_shard.testing import HAS_TESTING_LIBRARY, MultiProcessTestCase


def pytest_configure(config) -> None:
    package = os.path.dirname(os.path.abspath(torch_shard.__file__))
    checkout = os.path.isfile(os.path.join(os.path.dirname(package), "setup.py"))
    if checkout and not HAS_TESTING_LIBRARY:
        raise pytest.UsageError(
            f"torch_shard from the source checkout {os.path.dirname(package)} has no test library "
            "(torch_shard._testing_C): rebuild it with `pip install --no-build-isolation -e .` (make build), "
            "which builds it unless TORCH_SHARD_TESTING_LIBRARY=0"
        )


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        cls = getattr(item, "cls", None)
        if cls is not None and issubclass(cls, MultiProcessTestCase):
            item.add_marker(pytest.mark.distributed)

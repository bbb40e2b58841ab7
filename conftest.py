"""The fast tier: ``python -m pytest -m "not jax"`` runs the pure-Python tests (the cost model,
the search planners and the import graph) in under a minute; every other test is marked ``jax``
here, since it traces, compiles or runs the reference JAX programs or the CLI that plans with them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parent
# costmodel/ and search/ import no JAX (tests/test_import_graph.py checks the import order).
_PURE = ("tests/costmodel", "tests/search", "tests/test_import_graph.py", "tests/test_workload_dispatch.py", "costmodel", "search")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        where = Path(str(item.path)).resolve().relative_to(_ROOT).as_posix()
        if not any(where == pure or where.startswith(f"{pure}/") for pure in _PURE):
            item.add_marker(pytest.mark.jax)

"""What every benchmark does at the end: a table on the terminal and the same rows as CSV."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write ``rows`` (dicts with the same keys) to ``path``, creating its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def print_table(title: str, rows: list[dict[str, Any]], *, console: Console | None = None) -> None:
    """Print ``rows`` as a rich table, floats with 3 decimals."""
    table = Table(title=title)
    for column in rows[0]:
        table.add_column(column)
    for row in rows:
        table.add_row(*(f"{v:.3f}" if isinstance(v, float) else str(v) for v in row.values()))
    (console or Console(width=200)).print(table)

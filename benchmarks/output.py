"""What every benchmark does at the end: a table on the terminal and the same rows as CSV."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from planner.cli.csv_out import write_csv

__all__ = ["print_table", "write_csv"]


def print_table(title: str, rows: list[dict[str, Any]], *, console: Console | None = None) -> None:
    """Print ``rows`` as a rich table, floats with 3 decimals."""
    table = Table(title=title)
    for column in rows[0]:
        table.add_column(column)
    for row in rows:
        table.add_row(*(f"{v:.3f}" if isinstance(v, float) else str(v) for v in row.values()))
    (console or Console(width=200)).print(table)

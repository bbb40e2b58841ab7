"""Every plan README.md and docs/ show fits its part's usable memory less the runtime reserve.

The summaries print "memory per device X GiB of Y GiB usable (Z GiB reserved)"; tests/test_readme.py
checks that README's lines are what the commands print, and this that each is within Y − Z.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MEMORY_ROW = re.compile(r"memory per device\s*│\s*([\d.]+) GiB(?: of ([\d.]+) GiB(?: usable)?(?: \(([\d.]+) GiB reserved\))?)?")


def shown_memory_rows() -> list[tuple[str, float, float | None, float]]:
    rows = []
    for page in PAGES:
        for match in MEMORY_ROW.finditer(page.read_text()):
            total, usable, reserved = match.groups()
            rows.append((page.name, float(total), float(usable) if usable else None, float(reserved or 0)))
    return rows


def test_the_readme_shows_plans_with_their_memory():
    assert sum(name == "README.md" for name, *_ in shown_memory_rows()) >= 2


def test_every_shown_plan_fits_usable_memory_less_the_reserve():
    for name, total, usable, reserved in shown_memory_rows():
        assert usable is not None and reserved > 0, f"{name}: a memory row without its usable memory and reserve"
        assert total <= usable - reserved + 0.05, f"{name}: {total} GiB shown as fitting in {usable} GiB less {reserved} reserved"

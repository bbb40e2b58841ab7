"""A progress display on stderr for planner phases that take longer than a second.

It is shown only where a person watches: the human summary on an interactive terminal.
Machine-readable output (``--json``, ``--format json``, a pipe, a file) gets nothing extra,
and a run that ends within ``delay_s`` prints nothing either: the display starts late and
is erased when it stops.

>>> import io
>>> wanted("json", stdout=io.StringIO(), stderr=io.StringIO())
False
>>> with progress_display(enabled=False) as report:
...     report("layout search", 1, 10)
"""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

if TYPE_CHECKING:  # the CLI imports this module before (and without) the planner itself
    from planner.api import Report


def wanted(fmt: str, *, stdout: IO[str] | None = None, stderr: IO[str] | None = None) -> bool:
    """Whether to show progress: the human summary, with both streams (default: the process's
    streams at call time, which a test may have replaced) on a terminal."""
    return fmt == "summary" and (stdout or sys.stdout).isatty() and (stderr or sys.stderr).isatty()


@contextmanager
def progress_display(*, enabled: bool, delay_s: float = 1.0, console: Console | None = None) -> Iterator[Report]:
    """Yield a ``report(phase, done, total)`` function that drives a transient rich display.

    The display starts ``delay_s`` after entry (from a timer thread, so a phase that reports
    nothing, like a solver call, still shows its spinner and elapsed time).
    """
    if not enabled:
        yield _ignore
        return
    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=console or Console(stderr=True), transient=True)
    tasks: dict[str, TaskID] = {}

    def report(phase: str, done: int, total: int | None) -> None:
        if phase not in tasks:
            tasks[phase] = progress.add_task(phase, total=total)
        progress.update(tasks[phase], completed=done, total=total)

    timer = threading.Timer(delay_s, progress.start)
    timer.daemon = True
    timer.start()
    try:
        yield report
    finally:
        timer.cancel()
        timer.join()  # a start already under way finishes before the stop
        progress.stop()


def _ignore(phase: str, done: int, total: int | None) -> None:
    """The report function when no display is shown."""

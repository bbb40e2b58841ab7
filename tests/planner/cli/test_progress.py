"""Tests `planner/cli/progress.py`: shown only for the summary on a terminal, erased, silent when fast."""

import io
import time

from rich.console import Console

from planner.cli.progress import progress_display, wanted


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_wanted_only_for_the_summary_on_a_terminal():
    assert wanted("summary", stdout=_Tty(), stderr=_Tty())
    assert not wanted("json", stdout=_Tty(), stderr=_Tty())
    assert not wanted("summary", stdout=io.StringIO(), stderr=_Tty())  # piped output
    assert not wanted("summary", stdout=_Tty(), stderr=io.StringIO())


def _console():
    return Console(file=_Tty(), force_terminal=True, width=100)


def test_display_shows_a_slow_phase():
    console = _console()
    with progress_display(enabled=True, delay_s=0.0, console=console) as report:
        report("layout search", 3, 10)
        time.sleep(0.3)
    assert "layout search" in console.file.getvalue()


def test_display_prints_nothing_for_a_fast_run_or_when_off():
    for enabled in (True, False):
        console = _console()
        with progress_display(enabled=enabled, delay_s=60.0, console=console) as report:
            report("layout search", 3, 10)
        assert console.file.getvalue() == ""

"""Tests `planner/cli/time_limit.py`: the wall-clock limit every command runs under."""

import signal
import threading
import time

import pytest

from costmodel.errors import InvalidConfigError, TimeLimitError
from planner.cli.time_limit import time_limit, wall_limit_s


def test_a_block_past_its_limit_raises_time_limit_error_and_the_handler_is_restored():
    before = signal.getsignal(signal.SIGALRM)
    start = time.perf_counter()
    expected = r"^plan simulate ran past its time limit of 0.05 s with no answer; fix: raise --time-limit-s$"
    with pytest.raises(TimeLimitError, match=expected) as err:
        with time_limit("simulate", 0.05):
            time.sleep(5)
    assert time.perf_counter() - start < 1 and err.value.exit_code == 6
    assert signal.getsignal(signal.SIGALRM) is before and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_block_within_its_limit_is_untouched():
    with time_limit("layout", 5.0):
        value = sum(range(1000))
    assert value == 499500 and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_off_the_main_thread_there_is_no_alarm():
    seen = []
    thread = threading.Thread(target=lambda: seen.append(_sleep_under_limit()))
    thread.start()
    thread.join()
    assert seen == ["done"]


def _sleep_under_limit():
    with time_limit("simulate", 0.01):
        time.sleep(0.05)
    return "done"


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_limits_that_are_not_positive_finite_seconds_are_refused(bad):
    with pytest.raises(InvalidConfigError, match="is not a positive number of seconds"):
        wall_limit_s("inspect", bad)

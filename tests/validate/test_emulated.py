"""Tests `validate/emulated.py`: a child sees the emulated devices; its failure is one typed line."""

import pytest

from costmodel.errors import InvalidPlanError
from validate.emulated import run_emulated


def test_the_child_sees_its_devices_and_returns_its_last_line():
    assert run_emulated("import jax; print('noise'); print(jax.device_count())", 3, failure="x", fix="y") == "3"


def test_a_failing_child_raises_its_last_stderr_line():
    with pytest.raises(InvalidPlanError, match=r"^checking failed: ValueError: bad; fix: look$"):
        run_emulated("raise ValueError('bad')", 1, failure="checking failed", fix="look", error=InvalidPlanError)

"""Tests `validate/multihost.py`: two JAX processes on loopback form one mesh; failures and hangs leave nothing behind."""

import time
from pathlib import Path

import pytest

from costmodel.errors import InvalidPlanError, PlannerError
from costmodel.layout import Layout
from costmodel.model_config import ModelConfig
from planner.api import layout_plan
from validate.compile_check import CompileReport, compile_in_subprocess
from validate.multihost import run_processes, validate_processes

TINY = ModelConfig(name="tiny", hidden_size=128, num_layers=4, num_heads=8, num_kv_heads=4, ffn_size=256, vocab_size=512)


def _running(fragment: str) -> list[str]:
    """Command lines of live processes containing ``fragment`` (read from /proc: no psutil here)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if fragment in text:
            found.append(text)
    return found


def test_two_processes_compile_the_plan_as_one_process_does():
    plan = layout_plan(TINY, Layout(dp=2, tp=4, micro_batch=2, zero_stage=1), mesh="data=2,tensor=4", hardware="a100-80gb",
                       seq_len=64, global_batch=16)
    two = CompileReport.model_validate_json(run_processes("validate.multihost:compile_plan_json", plan.model_dump_json(),
                                                          n_processes=2, devices_per_process=4, timeout_s=240))
    one = compile_in_subprocess(plan)
    assert two.n_processes == 2 and two.n_devices == 8 and one.n_processes == 1
    assert two.argument_bytes == one.argument_bytes and two.matmul_flops == one.matmul_flops
    totals = [sorted((c.kind, c.axes, c.total_bytes) for c in r.collectives) for r in (one, two)]
    assert totals[0] == totals[1]


def test_a_failing_process_is_reported_and_nothing_survives():
    start = time.monotonic()
    with pytest.raises(PlannerError, match="process [01] of 2 failed: .*no_such_target"):
        run_processes("validate.multihost:no_such_target", "", n_processes=2, devices_per_process=1, timeout_s=120)
    assert time.monotonic() - start < 120 and not _running("validate.multihost:no_such_target")


def test_a_hanging_run_is_stopped_at_its_time_limit():
    start = time.monotonic()
    with pytest.raises(PlannerError, match="took over 8 s and was stopped"):
        run_processes("os:system", "sleep 617", n_processes=2, devices_per_process=1, timeout_s=8)
    assert time.monotonic() - start < 60
    assert not _running("sleep 617") and not _running("--target os:system")


def test_devices_must_split_evenly_over_processes():
    assert validate_processes(2, 8) == 4
    with pytest.raises(InvalidPlanError, match="8 devices cannot be split over 3 processes"):
        validate_processes(3, 8)

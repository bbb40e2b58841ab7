"""Tests `validate/multihost.py`: two JAX processes on loopback form one mesh; failures and hangs leave nothing behind."""

import os
import time
from pathlib import Path

import pytest

from costmodel.errors import PlannerError
from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from planner.api import layout_plan
from validate.compile_check import CompileReport, compile_in_subprocess
from validate.multihost import DistributedRunError, run_processes, step_in_processes
from validate.timed import cpu_plan

TINY = ModelConfig(name="tiny", hidden_size=64, num_layers=2, num_heads=4, ffn_size=128, vocab_size=128)

TARGETS = '''
import jax
from jax.experimental import multihost_utils

def fail_in_process_1(payload):
    if jax.process_index() == 1:
        raise ValueError(payload)
    multihost_utils.sync_global_devices("waits for process 1 forever")
'''


def _alive(fragment: str) -> list[str]:
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


@pytest.fixture(scope="module")
def plan():
    return cpu_plan(layout_plan(TINY, Layout(dp=2, tp=4, micro_batch=2, zero_stage=1), mesh="data=2,tensor=4", hardware="a100-80gb",
                                seq_len=16, global_batch=8))


def test_two_processes_train_as_one_process_does(plan):
    two = step_in_processes(plan, n_processes=2, steps=2, seed=3, timeout_s=240)
    one = step_in_processes(plan, n_processes=1, steps=2, seed=3, timeout_s=240)
    assert (two.n_processes, two.n_devices, one.n_processes, one.n_devices) == (2, 8, 1, 8)
    assert two.losses == pytest.approx(one.losses, rel=1e-5)
    assert two.losses[1] < two.losses[0] and len(two.step_wall_s) == 2


def test_two_processes_compile_the_plan_as_one_process_does(plan):
    two = CompileReport.model_validate_json(run_processes("validate.multihost:compile_plan_json", plan.model_dump_json(),
                                                          n_processes=2, devices_per_process=4, timeout_s=240))
    one = compile_in_subprocess(plan)
    assert two.n_processes == 2 and two.n_devices == 8 and one.n_processes == 1
    assert two.argument_bytes == one.argument_bytes and two.matmul_flops == one.matmul_flops
    totals = [sorted((c.kind, c.axes, c.total_bytes) for c in r.collectives) for r in (one, two)]
    assert totals[0] == totals[1]


def test_a_failing_process_is_named_at_once_and_nothing_survives(tmp_path, monkeypatch):
    module = f"multihost_targets_{os.getpid()}"  # unique, so a concurrent test run's processes are not counted
    (tmp_path / f"{module}.py").write_text(TARGETS)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path), prepend=os.pathsep)  # the processes import the target from there
    start = time.monotonic()
    with pytest.raises(DistributedRunError, match="process 1 of 2 failed: ValueError: refused by process 1; fix: "):
        run_processes(f"{module}:fail_in_process_1", "refused by process 1", devices_per_process=1, timeout_s=120)
    assert time.monotonic() - start < 25  # process 0 would wait 30 s in its collective
    assert not _alive(module)


def test_a_hanging_run_is_stopped_at_its_time_limit():
    command = f"sleep {10_000 + os.getpid()}"  # unique, as above
    start = time.monotonic()
    with pytest.raises(PlannerError, match="took over 5 s and was stopped"):
        run_processes("os:system", command, devices_per_process=1, timeout_s=5)
    assert time.monotonic() - start < 30
    assert not _alive(command)

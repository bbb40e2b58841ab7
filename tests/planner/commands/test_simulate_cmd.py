"""Tests `planner/commands/simulate_cmd.py`: the software-stack flags reach the simulated layout and move its step time."""

import json

import pytest

from planner.cli import main

# Llama-3-8B on two H100 nodes: tp4 with sequence parallelism, FSDP, full recompute, micro-batch 2.
BASE = ("simulate", "--model", "llama3-8b", "--hardware", "h100-sxm", "--devices", "16", "--tp", "4", "--global-batch", "16",
        "--micro-batch", "2", "--seq-len", "4096", "--sequence-parallel", "--zero", "3", "--recompute", "full", "--json")


def _simulate(capsys, *flags):
    code = main([*BASE, *flags])
    out, _ = capsys.readouterr()
    assert code == 0
    return json.loads(out)


def test_stack_flags_default_to_off(capsys):
    layout = _simulate(capsys)["layout"]
    assert not any(layout[k] for k in ("tp_overlap", "batch_major", "reentrant_recompute", "fsdp_copy_out", "fused_grad_accumulation"))


@pytest.mark.parametrize(("flag", "field", "slower"), [
    ("--tp-overlap", "tp_overlap", False),
    ("--batch-major", "batch_major", True),
    ("--reentrant-recompute", "reentrant_recompute", True),
    ("--fsdp-copy-out", "fsdp_copy_out", True),
    ("--fused-grad-accumulation", "fused_grad_accumulation", False),
])
def test_each_stack_flag_sets_its_layout_field_and_moves_step_time(capsys, flag, field, slower):
    base_s = _simulate(capsys)["step_time_s"]
    flagged = _simulate(capsys, flag)
    assert flagged["layout"][field] is True
    assert (flagged["step_time_s"] > base_s) if slower else (flagged["step_time_s"] < base_s)

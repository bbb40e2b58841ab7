"""Tests `benchmarks/ablation.py`: each mechanism switched off changes what it should, scored leaving a source out."""

import csv

import pytest

from benchmarks.ablation import MECHANISMS, ablate, per_source, summary
from benchmarks.simulator_accuracy import DEFAULT_DATA, layout_from_row, machine_from_row, model_from_row, train_from_row
from costmodel.step.simulator import simulate

ROWS = list(csv.DictReader(DEFAULT_DATA.open()))
BY_NAME = {m.name: m for m in MECHANISMS}


def _step_s(row, mechanism=None):
    machine = machine_from_row(row)
    layout = layout_from_row(row, machine)
    if mechanism:
        layout, machine = BY_NAME[mechanism].variant(layout, machine)
    return simulate(model_from_row(row), train_from_row(row), layout, machine).step_time_s


def test_each_mechanism_off_only_removes_time_it_adds():
    row = next(r for r in ROWS if r["hardware"] == "h100-sxm" and int(r["tp"]) > 1)
    on = _step_s(row)
    for name in ("collective latency", "kernel floor", "overlap slowdown", "tensor-parallel overlap"):
        off = _step_s(row, name)
        assert (off > on) if name == "tensor-parallel overlap" else (off <= on), name  # overlap hides time; the rest add it


def test_the_ablation_scores_every_source_for_all_on_and_each_mechanism():
    rows = [r for r in ROWS if r["hardware"] == "a100-80gb"][:4]
    mechanisms = (BY_NAME["kernel floor"],)
    results = ablate(rows, mechanisms)
    sources = {r["source"] for r in results}
    assert {r["mechanism"] for r in results} == {"all on", "kernel floor"} and len(results) == 2 * len(sources)
    table = summary(results, rows)
    assert table[0]["mechanism"] == "all on" and table[0]["change_pct_points"] == 0
    assert table[1]["loso_mean_abs_err_pct"] == pytest.approx(table[0]["loso_mean_abs_err_pct"] + table[1]["change_pct_points"],
                                                              abs=0.02)
    assert all("kernel floor" in r for r in per_source(results))

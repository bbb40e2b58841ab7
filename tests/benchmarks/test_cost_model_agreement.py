"""Tests `benchmarks/cost_model_agreement.py`: the op-level model and the simulator on the same layouts."""

import csv

from benchmarks.cost_model_agreement import CASES, main


def test_one_case_runs_agrees_and_is_written(tmp_path, capsys):
    assert main(["--only", "llama3-8b-tp4", "--out-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "1/1 layouts agree within 10 %"
    (row,) = csv.DictReader((tmp_path / "cost_model_agreement.csv").open())
    assert row["agree"] == "yes" and float(row["op_ilp_s"]) <= float(row["op_rule_based_s"]) * 1.001
    parts = sum(float(row[k]) for k in ("op_matmul_s", "op_memory_s", "op_comm_s"))
    assert abs(parts - float(row["op_rule_based_s"])) < 1e-6


def test_the_cases_cover_the_families_and_knobs_the_issue_names():
    models = {c.model for c in CASES}
    assert len(CASES) >= 8 and {"gpt2", "llama2-7b", "llama3-8b", "mixtral-8x7b"} <= models
    layouts = [c.layout for c in CASES]
    assert {lay.recompute.value for lay in layouts} >= {"none", "selective", "full"}
    assert {lay.zero_stage for lay in layouts} >= {0, 1, 3} and any(lay.pp > 1 for lay in layouts)
    assert len({lay.micro_batch for lay in layouts}) > 2 and any(lay.tp > 1 for lay in layouts)

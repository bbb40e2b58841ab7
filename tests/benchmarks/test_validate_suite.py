"""Tests `benchmarks/validate_suite.py`: a reduced suite, plans the planner chooses, each compiled and every check predicted."""

import pytest

from benchmarks.validate_suite import CASES, Case, run_case

REDUCED = (
    Case(name="gpt2-1dev", model="gpt2", mesh="1", hardware="a100-80gb", global_batch=16, seq_len=512),
    Case(name="llama-8dev", model="llama2-7b", mesh="2x4", hardware="a100-80gb", global_batch=16, seq_len=512),
    Case(name="gpt2-ilp-8dev", model="gpt2", mesh="data=2,tensor=4", hardware="a100-40gb", global_batch=16, seq_len=512,
         planner="ilp"),
)


@pytest.mark.parametrize("case", REDUCED, ids=lambda c: c.name)
def test_planner_chosen_plan_is_predicted_and_compiles(case):
    row = run_case(case)
    assert "not predicted" not in (row["memory"], row["arguments"], row["flops"], row["collectives"]), row
    assert row["arguments"].endswith("!") is False and row["flops"].endswith("!") is False, row
    assert row["collectives"] == "-" or not row["collectives"].endswith("!"), row
    if case.planner == "ilp":  # lowered as the program the ILP chose, every collective predicted from its choice
        assert not row["collectives"].endswith("!") and not row["permutes"].endswith("!"), row


def test_the_suite_covers_the_families_the_issue_names():
    models = {c.model for c in CASES}
    assert len(CASES) >= 12
    assert {"gpt2", "llama3-8b", "mixtral-8x7b"} <= models
    assert any(c.planner == "ilp" for c in CASES) and any((c.seq_len or 0) >= 8192 for c in CASES)
    assert any(c.hardware.startswith("tpu") for c in CASES)

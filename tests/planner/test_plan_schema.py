"""Tests `planner/plan_schema.py`: plan files written by earlier versions still load."""

import json

from planner.api import plan
from planner.plan_schema import Plan


def test_plans_written_with_wall_times_still_load():
    current = plan("gpt2", mesh="2x4", hardware="a100-80gb", global_batch=64, planner="ilp")
    old = json.loads(current.model_dump_json())
    old["plan_time_s"] = 1.25
    old["solver"]["intra_op"]["solve_time_s"] = 0.5
    loaded = Plan.model_validate_json(json.dumps(old))
    assert loaded == current
    assert "plan_time_s" not in loaded.model_dump_json()

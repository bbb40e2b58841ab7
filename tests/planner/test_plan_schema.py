"""Tests `planner/plan_schema.py`: plan files written by earlier versions still load; pins are recorded."""

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


def test_pins_are_recorded_and_plans_written_before_pins_still_load():
    pinned = plan("gpt2", mesh="2x4", hardware="a100-80gb", global_batch=64, pins={"zero_stage": 1, "micro_batch": 2})
    assert pinned.solver.pins.given == {"micro_batch": 2, "zero_stage": 1}
    assert Plan.model_validate_json(pinned.model_dump_json()) == pinned
    free = plan("gpt2", mesh="2x4", hardware="a100-80gb", global_batch=64)
    old = json.loads(free.model_dump_json())
    assert old["solver"].pop("pins") is None
    assert Plan.model_validate_json(json.dumps(old)) == free

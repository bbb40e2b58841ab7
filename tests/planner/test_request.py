"""Tests `planner/request.py`: the one typed request `plan` answers."""

import pytest
from pydantic import ValidationError

from costmodel.errors import InvalidConfigError, UnsupportedError
from costmodel.inputs.layout import Offload
from costmodel.inputs.stack import stack_with
from costmodel.inputs.train_config import Precision
from planner.request import PlannerName, PlanRequest, plan_request


def test_planner_names_are_the_clis_and_only_grid_keeps_the_rule_based_shardings():
    assert [p.value for p in PlannerName] == ["grid", "ilp", "anneal", "beam", "random"]
    assert [p for p in PlannerName if not p.shards_intra_op] == [PlannerName.GRID]


def test_names_become_typed_values():
    request = PlanRequest(model="gpt2", mesh="8", planner="beam", precision="fp16", offload="none")
    assert request.planner is PlannerName.BEAM and request.precision is Precision.FP16 and request.offload is Offload.NONE


@pytest.mark.parametrize("fields, error, match", [
    ({"planner": "greedy"}, InvalidConfigError, r"unknown planner 'greedy'; fix: use one of grid, ilp, anneal, beam, random"),
    ({"mesh": None, "devices": 0}, InvalidConfigError, "--devices=0 is not a positive device count"),
    ({"time_limit_s": float("nan")}, InvalidConfigError, "--time-limit-s=nan is not a positive number of seconds"),
    ({"offload": "disk"}, InvalidConfigError, "unknown offload 'disk'; fix: use one of: none, optimizer"),
    ({"offload": "optimizer", "planner": "ilp"}, UnsupportedError, "--planner ilp does not plan offloaded layouts"),
    ({"pins": {"zero_stage": 3}, "planner": "ilp"}, UnsupportedError,
     r"^--planner ilp cannot honour --zero 3: .* \(it honours --micro-batch and --recompute\); "
     r"fix: use --planner grid, which honours --zero 3, or drop --zero 3$"),
    ({"pins": {"tp": 2, "pp": 2, "micro_batch": 2}, "planner": "beam"}, UnsupportedError,
     r"^--planner beam cannot honour --tp 2 --pp 2: "),
])
def test_a_bad_setting_gets_the_error_catalogs_line(fields, error, match):
    with pytest.raises(error, match=match):
        PlanRequest(**{"model": "gpt2", "mesh": "8"} | fields)


def test_a_malformed_value_is_named_by_its_flag():
    with pytest.raises(InvalidConfigError, match=r"^--global-batch='many': .*; fix: give a valid --global-batch$"):
        plan_request(model="gpt2", mesh="8", global_batch="many")


def test_a_request_is_frozen_and_round_trips_through_json():
    request = PlanRequest(model="gpt2", mesh="2x4", seq_len=1024, planner="ilp", inference=None)
    with pytest.raises(ValidationError):
        request.mesh = "8"  # type: ignore[misc]
    assert PlanRequest.model_validate_json(request.model_dump_json()) == request


def test_pins_an_intra_op_planner_honours_pass_and_a_request_with_pins_round_trips():
    request = PlanRequest(model="gpt2", mesh="8", planner="ilp", pins={"micro_batch": 2, "recompute": "full", "pp": 1})
    assert request.pins.flags == "--pp 1 --micro-batch 2 --recompute full"
    assert PlanRequest.model_validate_json(request.model_dump_json()) == request
    assert PlanRequest(model="gpt2", mesh="8").pins.given == {}


def test_the_optimizer_options_are_typed_and_round_trip():
    from costmodel.inputs.train_config import OptimizerState
    request = plan_request(model="llama3-8b", devices=1, workload="finetune-full", optimizer_state="8bit", optimizer_in_backward=True)
    assert request.optimizer_state is OptimizerState.INT8 and request.optimizer_in_backward
    assert PlanRequest.model_validate_json(request.model_dump_json()) == request
    with pytest.raises(InvalidConfigError, match="--optimizer-state"):
        plan_request(model="gpt2", mesh="8", optimizer_state="4bit")
    with pytest.raises(UnsupportedError, match="not --optimizer-state bf16; fix: use --planner grid"):
        PlanRequest(model="gpt2", mesh="8", planner="ilp", optimizer_state="bf16")


def test_an_intra_op_planner_refuses_the_loss_in_pieces_in_one_line():
    with pytest.raises(UnsupportedError, match="whose loss runs whole, not in 4 pieces"):
        PlanRequest(model="gpt2", devices=2, planner="ilp", stack=stack_with("jax", cross_entropy_chunks=4))
    assert PlanRequest(model="gpt2", devices=2, stack=stack_with("jax", cross_entropy_chunks=4)).planner == PlannerName.GRID

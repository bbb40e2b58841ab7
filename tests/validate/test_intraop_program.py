"""Tests `validate/intraop_program.py`: an intra-op plan lowers as the program it chose, every equation pinned."""

import pytest

from costmodel.inputs.model_config import ModelConfig
from planner.api import plan
from validate.compile_check import compile_in_subprocess
from validate.intraop_program import intra_op_program

TINY = ModelConfig(name="tiny", hidden_size=128, num_layers=2, num_heads=4, ffn_size=512, vocab_size=512)


@pytest.fixture(scope="module")
def ilp_plan():
    return plan(TINY, mesh="data=2,tensor=4", hardware="a100-80gb", seq_len=64, global_batch=16, planner="ilp")


def test_the_plan_names_a_strategy_for_every_free_node(ilp_plan):
    program = intra_op_program(ilp_plan)
    assert program is not None and len(ilp_plan.solver.intra_op.choice) == len(program.space.strategies)
    assert program.micro_batches == ilp_plan.layout.micro_batches(ilp_plan.train)
    # Every leaf equation of the traced step has the node the choice is keyed on.
    assert set(program.graph.graph["eqn_nodes"].values()) <= set(program.graph.nodes)


def test_edited_parameter_specs_fall_back_to_the_layout_s_program(ilp_plan):
    specs = dict(ilp_plan.param_specs)
    other = (None, "tensor", None)
    specs["layers/mlp/w_in"] = other if tuple(specs["layers/mlp/w_in"]) != other else (None, None, "tensor")
    assert intra_op_program(ilp_plan.model_copy(update={"param_specs": specs})) is None


def test_grid_plans_have_no_intra_op_program():
    p = plan(TINY, mesh="data=2,tensor=4", hardware="a100-80gb", seq_len=64, global_batch=16)
    assert intra_op_program(p) is None


def test_the_pinned_program_compiles_with_the_chosen_input_shardings(ilp_plan):
    report = compile_in_subprocess(ilp_plan)
    assert report.n_devices == 8 and report.argument_bytes > 0

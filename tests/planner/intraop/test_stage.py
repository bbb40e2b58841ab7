"""The ILP inside a plan: each stage's training step sharded on the non-pipeline axes."""

import json

import pytest

from costmodel.errors import InvalidConfigError
from costmodel.hardware.machine import load_machine
from costmodel.inputs.layout import Layout, Recompute
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import TrainConfig
from planner.api import plan
from planner.cli.main import main
from planner.intraop.stage import intra_op_specs
from planner.programs.params import abstract_params

TINY = ModelConfig(name="tiny", hidden_size=256, num_layers=4, num_heads=8, ffn_size=1024, vocab_size=1024)
TRAIN = TrainConfig(seq_len=256, global_batch=32)


def test_specs_cover_every_parameter_with_its_rank():
    layout = Layout(dp=2, tp=2, pp=2, micro_batch=2, recompute=Recompute.FULL)
    specs, info = intra_op_specs(TINY, TRAIN, layout, [("data", 2), ("tensor", 2)], load_machine("a100-80gb"))
    stage_params = abstract_params(TINY.model_copy(update={"num_layers": 2}))
    assert len(specs["layers/attn/wq"]) == len(stage_params["layers"]["attn"]["wq"].shape)
    assert info.status == "OPTIMAL" and info.axes == ("data", "tensor")
    assert all(axis in (None, "data", "tensor") or isinstance(axis, tuple) for spec in specs.values() for axis in spec)


def test_plan_with_the_ilp_reports_the_solver_and_its_shardings():
    p = plan(TINY, mesh="data=2,tensor=4", hardware="a100-80gb", seq_len=256, global_batch=32, planner="ilp")
    assert p.solver.planner == "ilp"
    assert p.solver.intra_op is not None and p.solver.status == p.solver.intra_op.status == "OPTIMAL"
    assert set(p.solver.intra_op.axes) <= {"data", "tensor"}
    grid = plan(TINY, mesh="data=2,tensor=4", hardware="a100-80gb", seq_len=256, global_batch=32)
    assert grid.solver.intra_op is None and set(grid.param_specs) == set(p.param_specs)


def test_unknown_planner_is_a_clear_error():
    with pytest.raises(InvalidConfigError, match="unknown planner"):
        plan(TINY, mesh="2x4", planner="magic")


def test_cli_planner_ilp_json(capsys):
    code = main(["--model", "gpt2", "--mesh", "2x2", "--hardware", "a100-80gb", "--global-batch", "16", "--seq-len", "256",
                 "--planner", "ilp", "--time-limit-s", "30", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["solver"]["planner"] == "ilp" and out["solver"]["intra_op"]["status"] in ("OPTIMAL", "FEASIBLE")
    assert out["solver"]["intra_op"]["variables"] > 0


def test_a_search_planner_can_take_the_ilps_place():
    p = plan(TINY, mesh="data=2,tensor=4", hardware="a100-80gb", seq_len=256, global_batch=32, planner="beam", seed=1)
    info = p.solver.intra_op
    assert info.planner == "beam" and info.status == "FEASIBLE" and info.gap is None and info.evaluations > 0

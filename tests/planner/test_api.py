"""Tests `planner/api.py` (with `planner/request.py`), `planner/shardings.py`, `planner/mesh_assign.py`: plans and their shardings."""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
from jax.sharding import PartitionSpec

from costmodel.errors import InfeasibleError, InvalidConfigError, UnsupportedError
from costmodel.hardware.mesh import parse_mesh
from planner.api import layout_plan, plan
from planner.config import from_hf_config
from planner.mesh_assign import assignments, degrees
from planner.plan_schema import Plan
from planner.request import PlanRequest
from planner.shardings import partition_spec_tree


def test_plan_round_trips_and_is_deterministic():
    a = plan("gpt2", mesh="2x4", hardware="a100-80gb", global_batch=64)
    b = plan("gpt2", mesh="2x4", hardware="a100-80gb", global_batch=64)
    assert Plan.model_validate_json(a.model_dump_json()) == a
    assert a.model_dump_json() == b.model_dump_json()
    assert a.solver.status == "OPTIMAL" and a.solver.evaluated > 0


def test_mesh_axes_carry_parallelism_in_device_order():
    assert ("dp", "tp") in assignments(parse_mesh("8x4"))
    assert ("tp", "dp") not in assignments(parse_mesh("8x4"))  # tensor must be the inner axis
    assert assignments(parse_mesh("data=8,tensor=4")) == [("dp", "tp")]
    assert degrees(parse_mesh("8x4"), ("pp", "tp")) == (1, 4, 8, 1)
    with pytest.raises(InvalidConfigError, match="device order"):
        assignments(parse_mesh("tensor=4,data=8"))


def test_tensor_parallel_plan_shards_heads_and_mlp_megatron_style():
    p = plan("llama3-70b", mesh="data=4,tensor=8", hardware="h100-sxm", seq_len=8192, global_batch=64)
    assert p.layout.tp == 8 and p.axes_of("tp") == ("tensor",)
    specs = p.param_specs
    assert specs["layers/attn/wq"][2] == "tensor" and specs["layers/attn/wo"][1] == "tensor"
    assert specs["layers/mlp/w_in"][2] == "tensor" and specs["layers/mlp/w_out"][1] == "tensor"  # column, then row parallel
    assert specs["embed/tokens"][0] == "tensor"  # vocabulary-parallel embedding


def test_a_2d_decode_plan_splits_the_model_dimension_over_an_embed_axis_of_the_mesh_it_derives():
    p = plan("llama3-405b", devices=32, hardware="tpu-v5p", workload="decode", global_batch=64, seq_len=2048)
    assert p.layout.tp_embed == 4 and [(a.name, a.size, a.parallelism) for a in p.mesh] == [("embed", 4, "tpe"), ("tensor", 8, "tp")]
    specs = p.param_specs
    assert specs["layers/attn/wq"][1:3] == ("embed", "tensor") and specs["layers/mlp/w_out"][1:] == ("tensor", "embed")
    assert specs["embed/tokens"][0] == ("tensor", "embed") and p.activation_specs["residual_BxSxD"][2] == ("embed",)
    with pytest.raises(InvalidConfigError, match="2D weight-stationary"):
        layout_plan("llama3-405b", p.layout, mesh="4x8", hardware="tpu-v5p", workload="decode", global_batch=64, seq_len=2048)


def test_partition_specs_form_the_parameter_pytree():
    p = plan("gpt2", mesh="2x4", hardware="a100-80gb", global_batch=64)
    tree = partition_spec_tree(p.model, p.param_specs)
    assert isinstance(tree["layers"]["attn"]["wq"], PartitionSpec)
    assert len(tree["layers"]["attn"]["wq"]) == 4


def test_choosing_the_mesh_from_a_device_count():
    p = plan("llama3-8b", devices=16, hardware="h100-sxm", seq_len=4096, global_batch=64)
    assert p.layout.n_devices == 16 and sum(1 for a in p.mesh) >= 1
    assert {a.name for a in p.mesh} <= {"data", "tensor", "pipeline", "context"}


def test_nothing_fits_says_what_was_needed():
    with pytest.raises(InfeasibleError, match=r"needs more than the 76.0 GiB \(80.0 usable − 4.0 reserved\) per device; "
                                                r"closest: dp\d+ .* needs [\d.]+ GiB"):
        plan("llama3-405b", mesh="2x4", hardware="a100-80gb")


def test_exported_shardings_compile_and_run_a_step_on_8_emulated_devices():
    script = textwrap.dedent("""
        import os
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
        import jax, jax.numpy as jnp
        from jax.sharding import NamedSharding, PartitionSpec as P
        from costmodel.inputs.model_config import ModelConfig
        from costmodel.inputs.train_config import TrainConfig
        from planner.api import plan
        from planner.shardings import partition_spec_tree
        from planner.programs.params import init_params
        from planner.programs.train_step import init_opt_state, make_train_step
        cfg = ModelConfig(name="tiny", hidden_size=64, num_layers=2, num_heads=8, num_kv_heads=4, ffn_size=128, vocab_size=256)
        p = plan(cfg, mesh="data=2,tensor=4", hardware="a100-80gb", seq_len=32, global_batch=8)
        mesh = jax.make_mesh((2, 4), ("data", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
        specs = jax.tree.map(lambda s: NamedSharding(mesh, s), partition_spec_tree(cfg, p.param_specs))
        params = jax.device_put(init_params(cfg, jax.random.key(0)), specs)
        opt = init_opt_state(params)
        batch_sharding = NamedSharding(mesh, P("data", None))
        tokens = jax.device_put(jnp.zeros((8, 32), jnp.int32), batch_sharding)
        step = jax.jit(make_train_step(cfg, TrainConfig(seq_len=32, global_batch=8)))
        params, opt, metrics = step(params, opt, {"tokens": tokens, "targets": tokens})
        print(float(metrics["loss"]), params["layers"]["attn"]["wq"].sharding.spec)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    loss, spec = proc.stdout.split(" ", 1)
    assert float(loss) > 0 and "tensor" in spec


def test_cli_refuses_to_overwrite_and_writes_atomically(tmp_path, capsys):
    from planner.cli.main import main

    out = tmp_path / "plan.json"
    out.write_text("mine")
    assert main(["--model", "gpt2", "--mesh", "2x4", "--hardware", "a100-80gb", "--global-batch", "64", "--out", str(out)]) == 2
    assert out.read_text() == "mine"
    assert main(["--model", "gpt2", "--mesh", "2x4", "--hardware", "a100-80gb", "--global-batch", "64", "--out", str(out), "--force",
                 "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert json.loads(out.read_text())["layout"] == printed["layout"]
    assert {"predicted", "mesh", "param_specs", "solver"} <= set(printed)
    assert printed["predicted"]["memory"]["per_device_bytes"] > 0 and printed["solver"]["status"] == "OPTIMAL"
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def test_public_api_is_importable_from_the_package():
    import planner

    assert planner.plan is plan and planner.load_model("gpt2").total_params == 124475904  # padded to 50304 rows
    assert planner.PlanRequest is PlanRequest and planner.layout_plan is layout_plan
    with pytest.raises(AttributeError):
        planner.no_such_name  # noqa: B018


TINY_JSON = '{"name": "tiny", "num_layers": 2, "hidden_size": 64, "num_heads": 4, "ffn_size": 128, "vocab_size": 256}'


@pytest.mark.parametrize("argv", [
    ["--model", "llama3-8b", "--mesh", "8x4"],
    ["--model", "{tmp}/tiny.json", "--mesh", "2x4", "--global-batch", "8", "--seq-len", "64", "--planner", "ilp"],  # fixed solver seed
], ids=["grid", "ilp"])
def test_two_processes_write_the_same_plan_bytes(tmp_path, argv):
    (tmp_path / "tiny.json").write_text(TINY_JSON)
    runs = []
    for seed in ("1", "2"):  # different hash seeds: set and dict iteration orders differ between the processes
        out = tmp_path / f"plan{seed}.json"
        proc = subprocess.run([sys.executable, "-m", "planner.cli", *[a.replace("{tmp}", str(tmp_path)) for a in argv],
                               "--out", str(out), "--json"],
                              capture_output=True, timeout=300, env=os.environ | {"PYTHONHASHSEED": seed})
        assert proc.returncode == 0, proc.stderr
        runs.append((out.read_bytes(), proc.stdout))
    assert runs[0] == runs[1]
    assert json.loads(runs[0][0]) == json.loads(runs[0][1])  # the file and the printed plan are the same plan


LLAMA3_8B_HF = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256}


@pytest.mark.parametrize("layers, answer", [(100_000, "does not fit on 32"), (1_000_000_000, "cannot fit on any cluster")])
def test_absurd_depth_is_answered_in_well_under_two_seconds(layers, answer):
    start = time.perf_counter()
    with pytest.raises(InfeasibleError, match=answer):
        # A given batch: the rule's for a 2.6 T-parameter model is 368 K sequences, whose micro-batches
        # the offloaded layouts' estimate (costmodel.step.offload) walks one by one.
        plan(from_hf_config(LLAMA3_8B_HF | {"num_hidden_layers": layers}), mesh="8x4", global_batch=256)
    assert time.perf_counter() - start < 2.0


def test_planning_time_does_not_grow_with_depth():
    def plan_s(layers):
        start = time.perf_counter()
        p = plan(from_hf_config({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": layers,
                                 "num_attention_heads": 4, "vocab_size": 1000}), mesh="8x4", seq_len=128, global_batch=64)
        assert p.layout.n_devices == 32 and p.solver.status == "OPTIMAL"
        return time.perf_counter() - start

    shallow_s, deep_s = plan_s(32), plan_s(100_000)
    assert deep_s < 2.0 and deep_s < 3 * shallow_s + 0.2, (shallow_s, deep_s)


def test_plan_is_chosen_for_the_named_stack_and_precision():
    args = dict(mesh="2x4", hardware="a100-80gb", global_batch=64, seq_len=1024)
    default, core = plan("gpt2", **args), plan("gpt2", stack="megatron-core", **args)
    assert default.layout.stack.name == "jax" and core.layout.stack.name == "megatron-core"
    fp16 = plan("gpt2", precision="fp16", **args)
    assert fp16.train.compute_dtype.value == "float16" and fp16.train.grad_dtype.value == "float16"
    with pytest.raises(InvalidConfigError, match="unknown software stack"):
        plan("gpt2", stack="megatron", **args)


def test_lora_plan_carries_its_workload_and_needs_no_more_zero_than_pretraining():
    lora = plan("llama3-8b", mesh="8x4", workload="finetune-lora")
    pretrain = plan("llama3-8b", mesh="8x4")
    data = json.loads(lora.model_dump_json())
    assert data["workload"] == "finetune-lora" and data["train"]["workload"]["lora"]["rank"] == 16
    assert data["predicted"]["memory"]["per_device_bytes"] > data["predicted"]["memory"]["frozen_params_bytes"] > 0
    # 15 GiB of frozen weights fit unsharded: no parameter gathers.
    assert lora.layout.pp == 1 and lora.layout.zero_stage <= min(1, pretrain.layout.zero_stage)
    assert Plan.model_validate_json(lora.model_dump_json()) == lora


def test_lora_with_an_intra_op_planner_is_refused():
    with pytest.raises(UnsupportedError, match="finetune-lora plans use the grid planner"):
        plan("gpt2", mesh="2", workload="finetune-lora", planner="ilp")


def test_a_request_and_the_keyword_form_give_the_same_plan():
    request = PlanRequest(model="gpt2", mesh="2x4", hardware="a100-80gb", global_batch=64)
    assert plan(request) == plan("gpt2", mesh="2x4", hardware="a100-80gb", global_batch=64)
    with pytest.raises(TypeError, match="give global_batch in the PlanRequest"):
        plan(request, global_batch=32)


@pytest.mark.parametrize("fields", [{}, {"workload": "decode", "global_batch": 8, "seq_len": 4096}], ids=["train", "decode"])
def test_a_chosen_layout_given_by_hand_gets_the_same_mesh_shardings_and_prediction(fields):
    request = PlanRequest(model="llama3-8b", mesh="2x4", **fields)
    chosen = plan(request)
    given = layout_plan(request, chosen.layout)
    assert (given.mesh, given.layout, given.param_specs, given.activation_specs) == (
        chosen.mesh, chosen.layout, chosen.param_specs, chosen.activation_specs)
    assert given.predicted.step_time_s == pytest.approx(chosen.predicted.step_time_s, rel=1e-12)
    assert (given.solver.planner, chosen.solver.planner) == ("fixed", "grid")


def test_a_mesh_that_cannot_carry_the_given_layout_is_refused():
    from costmodel.inputs.layout import Layout

    with pytest.raises(InvalidConfigError, match=r"mesh 4x2 cannot carry dp=2, tp=4, pp=1, cp=1"):
        layout_plan("gpt2", Layout(dp=2, tp=4, micro_batch=8), mesh="4x2", hardware="a100-80gb", global_batch=64)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_pinned_zero_and_micro_batch_are_kept_and_the_rest_chosen(zero):
    p = plan("llama3-8b", mesh="data=8", global_batch=64, pins={"zero_stage": zero, "micro_batch": 2})
    assert (p.layout.dp, p.layout.zero_stage, p.layout.micro_batch) == (8, zero, 2)
    assert p.solver.pins.flags == f"--micro-batch 2 --zero {zero}"
    # ZeRO 0 holds the whole fp32 weights and gradient beside activations: it fits only with the optimizer state on the host
    # (the planner's offload). ZeRO 1-2 hold a bf16 copy, the master split over data (`keeps_compute_copy`): ZeRO 1's whole
    # fp32 gradient waits for the loop's end, but beside one layer's gradient at a time (`accumulates_layer_by_layer`).
    offloaded = {0: ("optimizer", False), 1: ("none", False), 2: ("none", False), 3: ("none", False)}[zero]
    assert (p.layout.offload.value, p.layout.offload_activations) == offloaded
    assert (p.solver.offload_reason is not None) == (zero == 0)
    assert all(a.layout.zero_stage == zero and a.layout.micro_batch == 2 for a in p.alternatives if a.why.endswith("slower"))


def test_degree_pins_on_an_unnamed_mesh_choose_its_axes_roles_and_serve():
    p = plan("llama3-8b", mesh="2x4", global_batch=64, pins={"tp": 4, "sequence_parallel": False})
    assert [(a.size, a.parallelism) for a in p.mesh] == [(2, "dp"), (4, "tp")] and not p.layout.sequence_parallel
    cp = plan("llama3-8b", mesh="4x2", global_batch=64, pins={"cp": 2})
    assert cp.layout.cp == 2 and [a.parallelism for a in cp.mesh] == ["dp", "cp"]
    served = plan("llama3-8b", mesh="2x4", workload="decode", global_batch=8, seq_len=1024, pins={"tp": 4})
    assert (served.layout.tp, served.layout.dp, served.solver.pins.given) == (4, 2, {"tp": 4})


def test_pins_nothing_fits_under_name_the_pin_to_drop():
    with pytest.raises(InfeasibleError, match=r"^llama3-8b under --micro-batch 2 --zero 0 does not fit on 8× h100-sxm: .*; "
                                                r"fix: drop --zero 0 \(dp8 tp1 pp1 mb2 .* fits\); without pins the best layout is "
                                                r"dp8 tp1 pp1 mb\d .*, or let the optimizer state go to the host \(--offload optimizer\)$"):
        plan("llama3-8b", mesh="data=8", global_batch=64, offload="none", pins={"zero_stage": 0, "micro_batch": 2})


def test_the_intra_op_planners_refuse_a_zero_pin_naming_the_grid_planner():
    with pytest.raises(UnsupportedError, match=r"--planner ilp cannot honour --zero 3: .*; fix: use --planner grid, which honours"):
        plan("gpt2", mesh="8", planner="ilp", pins={"zero_stage": 3})


def test_a_request_with_the_optimizer_options_plans_one_micro_batch_per_step_with_their_memory():
    result = plan(PlanRequest(model="llama3-8b", devices=1, hardware="h100-sxm", workload="finetune-full", global_batch=2,
                              seq_len=4096, optimizer_state="8bit", optimizer_in_backward=True))
    n, mem = result.model.total_params, result.predicted.memory
    assert result.train.optimizer_state == "8bit" and result.train.optimizer_in_backward
    assert result.layout.micro_batches(result.train) == 1  # the step in backward accumulates nothing
    assert mem.params_bytes == 2 * n and mem.optimizer_bytes / n == 2 * (1 + 4 / 2048) and mem.grads_bytes < 0.2 * n


def test_the_planner_cuts_the_loss_into_pieces_when_nothing_fits_whole_and_says_why():
    p = plan("llama3-8b", devices=1, hardware="h100-sxm", workload="finetune-full", global_batch=4, seq_len=4096,
             optimizer_state="bf16")
    assert p.layout.stack.cross_entropy_chunks == 8 and p.predicted.fits and p.layout.offload.value == "none"
    assert p.solver.loss_pieces_reason.startswith("nothing fits in 75.7 GiB per device")
    assert plan("llama3-8b", devices=8, hardware="h100-sxm", global_batch=16, seq_len=2048).solver.loss_pieces_reason is None


def test_a_mesh_with_an_expert_axis_splits_experts_there_and_the_batch_over_it_too():
    from planner.shardings import zero_sharded_specs

    p = plan("mixtral-8x7b", mesh="data=2,expert=4", global_batch=16, seq_len=512, pins={"zero_stage": 1})
    assert p.layout.ep == 4 and p.layout.dp == 8
    assert p.axes_of("dp") == ("expert", "data") and p.axes_of("ep") == ("expert",)
    assert p.param_specs["layers/moe/w_in"] == (None, "expert", None, None)
    assert p.param_specs["layers/moe/router"] == (None, None, None)  # every token scores every expert
    moments = zero_sharded_specs(p.model, p.param_specs, p.axes_of("dp"), {"data": 2, "expert": 4})
    assert moments["layers/moe/w_in"][1] == "expert" and "data" in moments["layers/moe/w_in"]  # the data axes the expert axis leaves
    assert moments["layers/attn/wq"][0] == ("expert", "data")  # all the data axes, the batch's order


def test_without_a_mesh_the_planner_places_expert_axes_inside_a_node():
    p = plan("mixtral-8x7b", devices=16, global_batch=64, seq_len=1024)
    assert p.layout.ep > 1
    axes = {a.parallelism: a for a in p.mesh}
    assert axes["ep"].nodes_spanned == 1 and axes["ep"].name == "expert"


def test_packed_documents_reach_the_plan_and_shorten_the_step():
    whole = plan("llama3-8b", mesh="8", hardware="h100-sxm", global_batch=8, seq_len=8192)
    packed = plan("llama3-8b", mesh="8", hardware="h100-sxm", global_batch=8, seq_len=8192, document_len=1024)
    assert packed.train.document_len == 1024
    assert packed.predicted.step_time_s < whole.predicted.step_time_s


def test_with_nothing_fitting_the_planner_offloads_the_activations_and_says_why():
    from costmodel.inputs.train_config import OptimizerState
    from search.pins import LayoutPins

    chosen = plan("llama3-8b", mesh="1", hardware="h100-sxm", workload="finetune-full", global_batch=16, seq_len=4096,
                  optimizer_state=OptimizerState.BF16, optimizer_in_backward=True, pins=LayoutPins(recompute="full"))
    assert chosen.layout.offload_activations and chosen.layout.micro_batch == 16  # the step in backward: one micro-batch
    assert chosen.solver.offload_reason.startswith("nothing fits in")
    assert chosen.predicted.memory.host.activations_bytes > 0

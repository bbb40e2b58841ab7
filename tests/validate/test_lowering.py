"""Tests `validate/lowering.py`: the sharded program computes what the single-device reference does."""

import json

import pytest

from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import Dtype
from planner.api import layout_plan
from planner.presets import PRESETS
from validate.emulated import run_emulated

LLAMA = ModelConfig(name="tiny-llama", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, ffn_size=128, vocab_size=256)
DEEP = ModelConfig(**{**LLAMA.model_dump(), "name": "tiny-llama-4", "num_layers": 4})
GPT = ModelConfig(**{**PRESETS["gpt2"], "name": "tiny-gpt", "hidden_size": 64, "num_layers": 2, "num_heads": 4, "ffn_size": 256,
                     "vocab_size": 250, "max_position_embeddings": 64, "qkv_bias": False})  # bk's gradient is 0: no relative error
MOE = ModelConfig(**{**DEEP.model_dump(), "name": "tiny-moe", "num_experts": 4, "experts_per_token": 2, "moe_ffn_size": 64})

_RUN = """
import json, sys
import jax, jax.numpy as jnp
from planner.plan_schema import Plan
from planner.programs.params import init_params
from planner.programs.train_step import init_opt_state, make_loss_and_grads
from validate.lowering import input_specs, jitted_step, loss_and_grads
from validate.mesh_hooks import device_mesh, embedding_lookup

plan = Plan.model_validate_json(sys.stdin.read())
params = init_params(plan.model, jax.random.key(0))
tokens = jax.random.randint(jax.random.key(1), (plan.train.global_batch, plan.train.seq_len), 0, plan.model.vocab_size)
batch = {"tokens": tokens, "targets": jnp.roll(tokens, -1, axis=1)}
# The reference accumulates the plan's micro-batches too: a MoE balancing loss is not linear in the batch.
micro_batches = plan.layout.micro_batches(plan.train)
reference_loss, reference_grads = make_loss_and_grads(plan.model, plan.train, micro_batches=micro_batches)(params, batch)
mesh = device_mesh(plan)
_, grads = jax.jit(loss_and_grads(plan, mesh))(params, batch)
grad_error = max(float(jnp.abs(g - r).max() / (jnp.abs(r).max() + 1e-12))
                 for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(reference_grads)))
rows = jax.jit(embedding_lookup(plan, mesh))(params["embed"]["tokens"], tokens)
lookup_error = float(jnp.abs(rows - jnp.take(params["embed"]["tokens"], tokens, axis=0)).max())
sharded = jax.device_put((params, init_opt_state(params), batch), jax.tree.map(lambda s: jax.NamedSharding(mesh, s), input_specs(plan)))
_, _, metrics = jitted_step(plan, mesh)(*sharded)
print(json.dumps({"loss": float(metrics["loss"]), "reference": float(reference_loss), "lookup_error": lookup_error,
                  "grad_error": grad_error}))
"""


@pytest.mark.parametrize("layout", [
    Layout(dp=2, tp=4, micro_batch=2, zero_stage=1, recompute="full"),
    Layout(dp=2, tp=4, micro_batch=2, zero_stage=2, sequence_parallel=True),
    Layout(dp=8, micro_batch=1, recompute="selective"),
], ids=["dp2-tp4-zero1-accumulate", "dp2-tp4-zero2-sp", "dp8"])
def test_sharded_step_matches_the_single_device_loss(layout, model=LLAMA):
    plan = layout_plan(model, layout, hardware="a100-80gb", seq_len=16, global_batch=16)
    plan = plan.model_copy(update={"train": plan.train.model_copy(update={"compute_dtype": Dtype("float32")})})
    out = json.loads(run_emulated(_RUN, 8, stdin=plan.model_dump_json(), timeout_s=300, failure="the step failed", fix="-"))
    assert out["loss"] == pytest.approx(out["reference"], rel=1e-5)
    assert out["lookup_error"] == 0.0
    assert out["grad_error"] < 1e-4  # relative to each gradient's largest entry


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_data_parallel_region_matches_the_single_device_loss_and_gradients(zero):
    # `validate.data_parallel_region`: each ZeRO stage's own reductions, over two micro-batches.
    test_sharded_step_matches_the_single_device_loss(Layout(dp=8, micro_batch=1, zero_stage=zero), LLAMA)


def test_data_parallel_region_with_tied_embeddings_and_zero_3():
    test_sharded_step_matches_the_single_device_loss(Layout(dp=8, micro_batch=1, zero_stage=3, recompute="full"), GPT)


@pytest.mark.parametrize("layout, model", [
    (Layout(pp=2, dp=2, tp=2, micro_batch=2), LLAMA),
    (Layout(pp=2, dp=4, micro_batch=1, recompute="full"), LLAMA),
    (Layout(pp=2, dp=4, micro_batch=2, stage_layers=(1, 3)), DEEP),
    (Layout(pp=2, dp=4, micro_batch=1), MOE),
], ids=["pp2-dp2-tp2", "pp2-dp4-full", "pp2-uneven-1-3", "pp2-moe"])
def test_pipelined_step_matches_the_single_device_loss_and_gradients(layout, model):
    test_sharded_step_matches_the_single_device_loss(layout, model)


def test_initial_inputs_carry_the_plan_shardings_and_dtypes():
    import jax

    from validate.lowering import initial_inputs, input_specs
    from validate.mesh_hooks import device_mesh

    plan = layout_plan(LLAMA, Layout(micro_batch=2), hardware="a100-80gb", seq_len=16, global_batch=4)
    mesh = device_mesh(plan, devices=jax.devices()[:1])
    params, opt_state, batch = initial_inputs(plan, mesh, seed=3)
    specs = jax.tree.leaves(input_specs(plan), is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec))
    assert [x.sharding.spec for x in jax.tree.leaves((params, opt_state, batch))] == specs
    assert {x.dtype.name for x in jax.tree.leaves(params)} == {plan.train.param_dtype.value}
    assert batch["tokens"].shape == (4, 16) and (batch["tokens"][:, 1:] == batch["targets"][:, :-1]).all()
    again = initial_inputs(plan, mesh, seed=3)[2]["tokens"]
    assert (again == batch["tokens"]).all()


_RUN_COPY = """
import json, sys
import jax, jax.numpy as jnp
from planner.plan_schema import Plan
from planner.programs.train_step import adamw_update, make_loss_and_grads
from validate.lowering import initial_inputs, jitted_step, loss_and_grads
from validate.mesh_hooks import device_mesh

plan = Plan.model_validate_json(sys.stdin.read())
mesh = device_mesh(plan)
params, opt_state, batch = initial_inputs(plan, mesh, seed=0)
master, state = jax.device_get(opt_state["master"]), jax.device_get(opt_state)
reference_loss, reference_grads = make_loss_and_grads(plan.model, plan.train, micro_batches=plan.layout.micro_batches(plan.train))(
    master, jax.device_get(batch))
loss, grads = jax.jit(loss_and_grads(plan, mesh))(params, batch)
grads = jax.device_get(grads)
grad_error = max(float(jnp.abs(g - r).max() / (jnp.abs(r).max() + 1e-12))
                 for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(reference_grads)))
_, want_state = adamw_update(jax.device_get(params), grads, state, plan.train.optimizer)
new_params, new_state, _ = jitted_step(plan, mesh)(params, opt_state, batch)
master_error = max(float(jnp.abs(g - w).max() / (jnp.abs(w).max() + 1e-12))
                   for g, w in zip(jax.tree.leaves(jax.device_get(new_state["master"])), jax.tree.leaves(want_state["master"])))
copy_exact = all(bool((p == w.astype(p.dtype)).all()) for p, w in zip(jax.tree.leaves(new_params), jax.tree.leaves(new_state["master"])))
print(json.dumps({"loss": float(loss), "reference": float(reference_loss), "grad_error": grad_error, "master_error": master_error,
                  "copy_exact": copy_exact, "param_dtypes": sorted({x.dtype.name for x in jax.tree.leaves(new_params)}),
                  "master_dtypes": sorted({x.dtype.name for x in jax.tree.leaves(new_state["master"])}),
                  "master_split_as_moments": [x.sharding.spec for x in jax.tree.leaves(new_state["master"])]
                  == [x.sharding.spec for x in jax.tree.leaves(new_state["m"])]}))
"""


@pytest.mark.parametrize("layout", [
    Layout(dp=2, tp=4, micro_batch=2, zero_stage=1),
    Layout(dp=2, tp=4, micro_batch=2, zero_stage=2, sequence_parallel=True),
], ids=["dp2-tp4-zero1", "dp2-tp4-zero2-sp"])
def test_zero_1_2_step_a_compute_copy_beside_the_fp32_master(layout):
    # `costmodel.step.kernels.keeps_compute_copy`: bf16 weights in, the fp32 master split as the moments in the optimizer state.
    plan = layout_plan(LLAMA, layout, hardware="a100-80gb", seq_len=16, global_batch=16)
    out = json.loads(run_emulated(_RUN_COPY, 8, stdin=plan.model_dump_json(), timeout_s=300, failure="the step failed", fix="-"))
    assert out["loss"] == pytest.approx(out["reference"], rel=1e-4)
    # bf16 products summed in another order than on one device: the fp32-master program reads the same 0.008.
    assert out["grad_error"] < 0.02
    assert out["master_error"] < 1e-6  # the master stepped by AdamW on the program's own gradients
    assert out["copy_exact"] and out["param_dtypes"] == ["bfloat16"] and out["master_dtypes"] == ["float32"]
    assert out["master_split_as_moments"]


_RUN_FUSED = """
import json, sys
import jax, jax.numpy as jnp
from planner.plan_schema import Plan
from planner.programs.params import init_params
from planner.programs.train_step import init_opt_state, make_train_step
from validate.lowering import input_specs, jitted_step
from validate.mesh_hooks import device_mesh

plan = Plan.model_validate_json(sys.stdin.read())
params = init_params(plan.model, jax.random.key(0))
tokens = jax.random.randint(jax.random.key(1), (plan.train.global_batch, plan.train.seq_len), 0, plan.model.vocab_size)
batch = {"tokens": tokens, "targets": jnp.roll(tokens, -1, axis=1)}
want = make_train_step(plan.model, plan.train, remat="full")(params, init_opt_state(params), batch)
mesh = device_mesh(plan)
sharded = jax.device_put((params, init_opt_state(params), batch), jax.tree.map(lambda s: jax.NamedSharding(mesh, s), input_specs(plan)))
got = jitted_step(plan, mesh)(*sharded)
error = max(float(jnp.abs(g - w).max() / (jnp.abs(w).max() + 1e-12)) for g, w in zip(jax.tree.leaves(got[:2]), jax.tree.leaves(want[:2])))
print(json.dumps({"loss": float(got[2]["loss"]), "reference": float(want[2]["loss"]), "error": error}))
"""


@pytest.mark.parametrize("layout", [
    Layout(dp=2, tp=4, micro_batch=4, zero_stage=1, recompute="full"),
    Layout(dp=8, micro_batch=1, zero_stage=3, recompute="full"),
], ids=["dp2-tp4-zero1", "dp8-zero3"])
def test_the_step_in_backward_sharded_updates_what_the_plain_step_does(layout):
    # `validate.lowering.fused_train_step`: each layer stepped in the backward loop, its state split as the plan says.
    plan = layout_plan(LLAMA, layout, hardware="a100-80gb", seq_len=16, global_batch=8, workload="finetune-full",
                       optimizer_in_backward=True)
    plan = plan.model_copy(update={"train": plan.train.model_copy(update={"compute_dtype": Dtype("float32")})})
    out = json.loads(run_emulated(_RUN_FUSED, 8, stdin=plan.model_dump_json(), timeout_s=300, failure="the step failed", fix="-"))
    assert out["loss"] == pytest.approx(out["reference"], rel=1e-5)
    assert out["error"] < 1e-4  # relative to each array's largest entry


def test_the_step_in_backward_is_refused_in_one_line_where_it_is_not_lowered():
    import jax

    from costmodel.errors import UnsupportedError
    from validate.lowering import train_step
    from validate.mesh_hooks import device_mesh

    plan = layout_plan(LLAMA, Layout(micro_batch=2, recompute="selective"), hardware="a100-80gb", seq_len=16, global_batch=2,
                       workload="finetune-full", optimizer_in_backward=True)
    with pytest.raises(UnsupportedError, match="with full recompute"):
        train_step(plan, device_mesh(plan, devices=jax.devices()[:1]))

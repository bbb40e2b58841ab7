"""Tests `validate/serving.py`: the sharded (and pipelined) serving step computes what the single-device reference does."""

import json

import pytest

from costmodel.errors import UnsupportedError
from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import Dtype
from planner.api import layout_plan
from validate.emulated import run_emulated

LLAMA = ModelConfig(name="tiny-llama", hidden_size=64, num_layers=4, num_heads=4, num_kv_heads=2, ffn_size=128, vocab_size=256)

_RUN = """
import json, sys
import jax, jax.numpy as jnp
from planner.plan_schema import Plan
from planner.programs.decode import decode_step, per_layer, served_dtype_of
from planner.programs.params import init_params
from planner.programs.prefill import prefill_step
from validate.lowering import abstract_inputs, input_specs, jitted_step
from validate.mesh_hooks import device_mesh
from validate.serving import serves_stacked

plan = Plan.model_validate_json(sys.stdin.read())
model, train = plan.model, plan.train
params = jax.tree_util.tree_map_with_path(
    lambda path, x: x.astype(served_dtype_of("/".join(str(k.key) for k in path), train)), init_params(model, jax.random.key(0)))
params = params if serves_stacked(plan) else per_layer(params)
_, cache, batch = abstract_inputs(plan, device_mesh(plan))
leaves, tree = jax.tree.flatten(cache)
cache = jax.tree.unflatten(tree, [jax.random.normal(jax.random.key(i + 1), c.shape, c.dtype) for i, c in enumerate(leaves)])
tokens = jax.random.randint(jax.random.key(3), batch["tokens"].shape, 0, model.vocab_size)
batch = {"tokens": tokens, "position": jnp.int32(train.seq_len - 3)} if "position" in batch else {"tokens": tokens}
reference = decode_step if "position" in batch else prefill_step
want_logits, want_cache = jax.jit(lambda p, c, b: reference(p, c, b, model, compute_dtype=jnp.float32))(params, cache, batch)
mesh = device_mesh(plan)
sharded = jax.device_put((params, cache, batch), jax.tree.map(lambda s: jax.NamedSharding(mesh, s), input_specs(plan)))
logits, got_cache = jitted_step(plan, mesh)(*sharded)
scale = float(jnp.abs(want_logits).max())


def most_apart(a, b):
    return max(float(jnp.abs(x - y).max()) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


print(json.dumps({"logits_error": float(jnp.abs(logits - want_logits).max()) / scale, "cache_error": most_apart(got_cache, want_cache),
                  "cache_written": most_apart(want_cache, cache)}))
"""


@pytest.mark.parametrize("workload, layout", [
    ("prefill", Layout(dp=2, tp=4)),
    ("prefill", Layout(pp=2, dp=2, tp=2)),
    ("decode", Layout(dp=2, tp=4)),  # served one array a layer
    ("decode", Layout(pp=2, dp=2, tp=2)),  # two micro-batches of two sequences
    ("decode", Layout(pp=4, tp=2)),  # four micro-batches of one: bubble ticks on both sides
], ids=["prefill-dp2-tp4", "prefill-pp2-dp2-tp2", "decode-dp2-tp4", "decode-pp2-dp2-tp2", "decode-pp4-tp2"])
def test_sharded_serving_step_matches_the_single_device_step(workload, layout):
    """fp32 compute over bf16 weights; the cache starts random, so a slot written on a bubble tick would show."""
    plan = layout_plan(LLAMA, layout, seq_len=24, global_batch=4, workload=workload,
                       inference={"prompt_len": 12, "kv_block_size": 8} if workload == "prefill" else None)
    plan = plan.model_copy(update={"train": plan.train.model_copy(update={"compute_dtype": Dtype("float32")})})
    out = json.loads(run_emulated(_RUN, 8, stdin=plan.model_dump_json(), timeout_s=300, failure="the step failed", fix="-"))
    assert out["cache_written"] > 0.1  # the step changed the cache, so its comparison means something
    assert out["logits_error"] < 1e-4 and out["cache_error"] < 1e-4, out


def test_uneven_pipelined_serving_is_refused_in_one_line():
    from validate.serving import serving_program

    plan = layout_plan(LLAMA, Layout(pp=2, stage_layers=(1, 3)), seq_len=24, global_batch=2, workload="decode")
    with pytest.raises(UnsupportedError, match="uneven pipeline stages"):
        serving_program(plan, mesh=None)  # refused before any mesh is needed

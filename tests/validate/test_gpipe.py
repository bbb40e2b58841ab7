"""Tests `validate/gpipe.py`: GPipe, plain and interleaved, computes the single-device loss and gradients."""

import json

import numpy as np
import pytest

from costmodel.errors import UnsupportedError
from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import Dtype
from planner.api import layout_plan
from validate.emulated import run_emulated
from validate.gpipe import check_pipeline, interleaved_layer_order

LLAMA = ModelConfig(name="tiny-llama-8", hidden_size=64, num_layers=8, num_heads=4, num_kv_heads=2, ffn_size=128, vocab_size=256)

_RUN = """
import json, sys
import jax, jax.numpy as jnp, numpy as np
from planner.plan_schema import Plan
from planner.programs.params import init_params
from planner.programs.train_step import make_loss_and_grads
from validate.lowering import loss_and_grads
from validate.mesh_hooks import device_mesh
from validate.gpipe import interleaved_layer_order

plan = Plan.model_validate_json(sys.stdin.read())
params = init_params(plan.model, jax.random.key(0))
tokens = jax.random.randint(jax.random.key(1), (plan.train.global_batch, plan.train.seq_len), 0, plan.model.vocab_size)
batch = {"tokens": tokens, "targets": jnp.roll(tokens, -1, axis=1)}
reference_loss, reference_grads = make_loss_and_grads(plan.model, plan.train)(params, batch)
order = interleaved_layer_order(plan.model.num_layers, plan.layout)
stored = {**params, "layers": jax.tree.map(lambda w: w[order], params["layers"])}
loss, grads = jax.jit(loss_and_grads(plan, device_mesh(plan)))(stored, batch)
grads = {**grads, "layers": jax.tree.map(lambda g: g[np.argsort(order)], grads["layers"])}
grad_error = max(float(jnp.abs(g - r).max() / (jnp.abs(r).max() + 1e-12))
                 for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(reference_grads)))
print(json.dumps({"loss": float(loss), "reference": float(reference_loss), "grad_error": grad_error}))
"""


@pytest.mark.parametrize("layout", [
    pytest.param(Layout(pp=4, micro_batch=2, schedule="gpipe"), marks=pytest.mark.slow),
    pytest.param(Layout(pp=2, dp=2, micro_batch=1, interleave=2, schedule="gpipe"), marks=pytest.mark.slow),
    Layout(pp=4, micro_batch=2, interleave=2, schedule="gpipe", recompute="full"),
], ids=["pp4", "pp2-dp2-v2", "pp4-v2-full"])
def test_gpipe_steps_match_the_single_device_loss_and_gradients(layout):
    plan = layout_plan(LLAMA, layout, hardware="a100-80gb", seq_len=16, global_batch=8)
    plan = plan.model_copy(update={"train": plan.train.model_copy(update={"compute_dtype": Dtype("float32")})})
    out = json.loads(run_emulated(_RUN, 4, stdin=plan.model_dump_json(), timeout_s=300, failure="the step failed", fix="-"))
    assert out["loss"] == pytest.approx(out["reference"], rel=1e-5)
    assert out["grad_error"] < 1e-4  # relative to each gradient's largest entry


def test_interleaved_order_gives_each_device_its_virtual_stages():
    lay = Layout(pp=4, interleave=3)
    order_DxVxC = interleaved_layer_order(24, lay).reshape(4, 3, 2)  # device, chunk, layer in chunk
    for d in range(4):
        for c in range(3):
            assert list(order_DxVxC[d, c]) == [2 * (c * 4 + d), 2 * (c * 4 + d) + 1]
    assert sorted(interleaved_layer_order(24, lay)) == list(range(24))
    assert (interleaved_layer_order(8, Layout(pp=4)) == np.arange(8)).all()


@pytest.mark.parametrize("layout, global_batch, message", [
    (Layout(pp=2, dp=2, interleave=3, schedule="interleaved"), 8, "8 layers do not cut into pp·interleave = 6 equal chunks"),
    (Layout(pp=4, interleave=2, schedule="interleaved"), 6, "6 micro-batches are not a multiple of pp=4"),
])
def test_interleaving_that_does_not_divide_is_refused_with_its_cause(layout, global_batch, message):
    plan = layout_plan(LLAMA, layout, hardware="a100-80gb", seq_len=16, global_batch=global_batch)
    with pytest.raises(UnsupportedError, match=message):
        check_pipeline(plan)

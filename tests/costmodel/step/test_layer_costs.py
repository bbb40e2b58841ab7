"""Tests `costmodel/step/layer_costs.py`: one layer's kernel and collective seconds."""

import pytest

from costmodel.hardware.machine import Machine
from costmodel.inputs.layout import Layout, Recompute
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.stack import Attention, stack_with
from costmodel.inputs.train_config import TrainConfig
from costmodel.step.collectives import Tier
from costmodel.step.kernels import layer_forward_kernels
from costmodel.step.layer_costs import layer_costs, phase_time
from costmodel.step.roofline import Efficiency

MODEL = ModelConfig(name="m", hidden_size=2048, num_layers=8, num_heads=16, num_kv_heads=4, ffn_size=5632,
                    vocab_size=32000, num_experts=8, experts_per_token=2)
DENSE = MODEL.model_copy(update={"num_experts": 0, "experts_per_token": 0})
TRAIN = TrainConfig(seq_len=2048, global_batch=64)
HW = Machine(name="test", peak_flops_per_s=1e15, hbm_bytes_per_s=3e12, hbm_bytes=8e10, devices_per_node=8,
             efficiency=Efficiency(kernel_floor_s=0.0),
             intra=Tier(bytes_per_s=3e11, latency_s=1e-6), inter=Tier(bytes_per_s=5e10, latency_s=5e-6))


def test_recompute_policies_order_their_cost():
    megatron = stack_with("megatron-core")
    costs = {r: layer_costs(DENSE, TRAIN, Layout(recompute=r, stack=megatron), HW).recompute.total_s for r in Recompute}
    assert costs[Recompute.NONE] == 0
    assert costs[Recompute.SELECTIVE] < costs[Recompute.SELECTIVE_OP] < costs[Recompute.FULL]
    assert costs[Recompute.SELECTIVE_LAYER] == pytest.approx(costs[Recompute.FULL] / 2)
    # The jax program's fp32 weights are cast again in every backward, recompute or not.
    cast = next(k for k in layer_forward_kernels(DENSE, TRAIN, Layout()) if k.name == "weight_cast")
    assert layer_costs(DENSE, TRAIN, Layout(), HW).recompute.total_s == pytest.approx(phase_time([cast], HW).total_s)


def test_full_recompute_reruns_the_whole_forward_only_when_reentrant():
    whole = layer_costs(DENSE, TRAIN, Layout(recompute=Recompute.FULL, stack=stack_with("jax", reentrant_recompute=True)), HW)
    assert whole.recompute.total_s == pytest.approx(whole.forward.total_s)
    # Otherwise it stops at the down projection's input: the down projection and residual are not re-run.
    kernels = {k.name: k for k in layer_forward_kernels(DENSE, TRAIN, Layout())}
    tail_s = phase_time([kernels["mlp_out"], kernels["mlp_residual"]], HW).total_s
    early = layer_costs(DENSE, TRAIN, Layout(recompute=Recompute.FULL), HW)
    assert early.recompute.total_s == pytest.approx(early.forward.total_s - tail_s)


def test_tensor_parallel_adds_collectives_and_full_recompute_repeats_them():
    fused = stack_with("jax", fused_projections=True)
    none = layer_costs(DENSE, TRAIN, Layout(tp=4, stack=fused), HW)
    full = layer_costs(DENSE, TRAIN, Layout(tp=4, recompute=Recompute.FULL, stack=fused), HW)
    reentrant = layer_costs(DENSE, TRAIN, Layout(tp=4, recompute=Recompute.FULL, stack=stack_with(fused, reentrant_recompute=True)), HW)
    assert none.tp_forward_s > 0 and none.tp_backward_s == pytest.approx(none.tp_forward_s)
    # Megatron: 2 all-reduces forward, 2 backward, 2 again in the recompute; stopping early skips the layer's last.
    assert reentrant.tp_backward_s == pytest.approx(2 * reentrant.tp_forward_s)
    assert full.tp_backward_s == pytest.approx(1.5 * full.tp_forward_s)
    # The JAX program: 5 backward all-reduces (wq, wk, wv, w_in, w_gate) and the attention block's again.
    jax_full = layer_costs(DENSE, TRAIN, Layout(tp=4, recompute=Recompute.FULL), HW)
    assert jax_full.tp_backward_s == pytest.approx(3 * jax_full.tp_forward_s)
    assert layer_costs(DENSE, TRAIN, Layout(), HW).tp_forward_s == 0


def test_backward_doubles_gemms_and_costs_elementwise_kernels_by_their_passes():
    c = layer_costs(DENSE, TRAIN, Layout(stack=stack_with("jax", attention=Attention.MATERIALIZED, fp32_weights=False)), HW)
    assert c.backward.compute_s == pytest.approx(2 * c.forward.compute_s)
    # Norms and activations read x and dy and write dx: 1.5 to 1.7 times forward's traffic; RoPE 1.
    assert c.forward.memory_s < c.backward.memory_s < 1.7 * c.forward.memory_s


def test_context_parallel_ring_hides_behind_attention_when_fast():
    c = layer_costs(DENSE, TrainConfig(seq_len=32768, global_batch=64), Layout(cp=4), HW)
    assert c.cp_total_s > 0 and c.cp_exposed_s == 0


def test_expert_parallel_all_to_alls_only_for_moe():
    assert layer_costs(MODEL, TRAIN, Layout(dp=4, ep=4), HW).ep_forward_s > 0
    assert layer_costs(MODEL, TRAIN, Layout(dp=4), HW).ep_forward_s == 0

"""Tests `costmodel/step/recompute.py`: what each recompute policy re-runs."""

import pytest

from costmodel.inputs.layout import Layout, Recompute
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.stack import Attention, stack_with
from costmodel.inputs.train_config import TrainConfig
from costmodel.step.kernels import KernelKind, layer_forward_kernels
from costmodel.step.recompute import LAYER_TAIL, every_second_matmul_share, recomputed_forward_comm_fraction, recomputed_kernels

LLAMA3_8B = ModelConfig(name="llama3-8b", hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8, ffn_size=14336,
                        vocab_size=128256)
GPT = ModelConfig(name="gpt", hidden_size=1024, num_layers=4, num_heads=16, ffn_size=4096, vocab_size=5000,
                  norm="layernorm", mlp="gelu", positions="learned")
TRAIN = TrainConfig(seq_len=1024, global_batch=8)


def _names(model, layout):
    return [k.name for k in recomputed_kernels(layer_forward_kernels(model, TRAIN, layout), model, layout)]


def _projection_flops(kernels):
    return sum(k.total_flops for k in kernels if k.kind is KernelKind.MATMUL and not k.in_attention_core)


def test_every_second_mm_share_by_hand():
    h, kv, f = 4096, 1024, 14336  # Llama-3-8B: k, o and w3 of q, k, v, o, w1, w3, w2
    assert every_second_matmul_share(LLAMA3_8B) == pytest.approx((kv + h + f) / (2 * h + 2 * kv + 3 * f), rel=1e-12)
    assert every_second_matmul_share(GPT) == pytest.approx(0.5)  # k, o, down of q, k, v, o, up, down: 6h of 12h
    assert every_second_matmul_share(LLAMA3_8B.model_copy(update={"num_experts": 8, "experts_per_token": 2})) == 0.5


def test_full_recompute_stops_before_the_layer_tail_unless_reentrant():
    whole = _names(GPT, Layout(recompute=Recompute.FULL, stack=stack_with("jax", reentrant_recompute=True)))
    assert whole == [k.name for k in layer_forward_kernels(GPT, TRAIN, Layout())]
    assert _names(GPT, Layout(recompute=Recompute.FULL)) == [n for n in whole if n not in LAYER_TAIL]


def test_selective_recomputes_the_attention_core_only():
    materialized = stack_with("megatron-core", attention=Attention.MATERIALIZED)
    assert _names(GPT, Layout(recompute=Recompute.SELECTIVE, stack=materialized)) == ["scores", "softmax_dropout", "attn_v"]
    assert _names(GPT, Layout(recompute=Recompute.NONE, stack=materialized)) == []


@pytest.mark.parametrize("recompute", list(Recompute))
def test_jax_remat_casts_the_fp32_weights_again_whatever_the_policy(recompute):
    # No checkpoint policy names the bf16 copies, so every backward re-casts each weight once.
    lay = Layout(recompute=recompute)
    assert lay.stack.fp32_weights
    assert _names(GPT, lay).count("weight_cast") == 1
    assert "weight_cast" not in _names(GPT, Layout(recompute=recompute, stack=stack_with("megatron-core")))


def test_per_op_checkpointing_keeps_attention_and_every_other_mm():
    lay = Layout(recompute=Recompute.SELECTIVE_OP)
    kernels = layer_forward_kernels(LLAMA3_8B, TRAIN, lay)
    redone = recomputed_kernels(kernels, LLAMA3_8B, lay)
    assert "flash_attention" not in {k.name for k in redone} and "mlp_residual" not in {k.name for k in redone}
    assert "attn_norm" in {k.name for k in redone}  # elementwise kernels are re-run
    assert _projection_flops(redone) == pytest.approx(every_second_matmul_share(LLAMA3_8B) * _projection_flops(kernels))


@pytest.mark.parametrize(("recompute", "sp", "reentrant", "fraction"), [
    (Recompute.NONE, False, False, 0.0), (Recompute.SELECTIVE, True, False, 0.0),
    (Recompute.FULL, False, True, 1.0), (Recompute.FULL, False, False, 0.5), (Recompute.FULL, True, False, 0.75),
    (Recompute.SELECTIVE_LAYER, True, False, 0.375),
    (Recompute.SELECTIVE_OP, True, False, 0.5), (Recompute.SELECTIVE_OP, False, False, 0.0),
])
def test_recompute_reissues_a_share_of_the_forward_collectives(recompute, sp, reentrant, fraction):
    lay = Layout(tp=4, recompute=recompute, sequence_parallel=sp, stack=stack_with("jax", reentrant_recompute=reentrant))
    assert recomputed_forward_comm_fraction(lay) == fraction

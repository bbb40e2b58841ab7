"""Tests `costmodel/step/tensor_parallel.py`: a layer's tensor-parallel collectives, copies and overlap."""

import pytest

from costmodel.hardware.machine import Machine
from costmodel.hardware.profile import DeviceKind
from costmodel.inputs.layout import Layout, Recompute
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.stack import SoftwareStack, TpOverlap, stack_with
from costmodel.inputs.train_config import TrainConfig
from costmodel.step.collectives import Tier, all_gather_s, all_reduce_s
from costmodel.step.kernels import layer_forward_kernels
from costmodel.step.roofline import Efficiency
from costmodel.step.tensor_parallel import column_parallel_reductions, tensor_parallel_costs

MODEL = ModelConfig(name="m", hidden_size=4096, num_layers=4, num_heads=32, num_kv_heads=8, ffn_size=14336, vocab_size=32000)
TRAIN = TrainConfig(seq_len=4096, global_batch=16)
HW = Machine(name="test", peak_flops_per_s=1e14, hbm_bytes_per_s=2e12, hbm_bytes=8e10, devices_per_node=8,
             efficiency=Efficiency(kernel_floor_s=0.0, hbm=1.0),
             intra=Tier(bytes_per_s=2e11, latency_s=0.0), inter=Tier(bytes_per_s=2e10, latency_s=0.0))
ACT_BYTES = 2 * TRAIN.seq_len * MODEL.hidden_size * 2  # micro-batch 2, bf16


def _costs(hw=HW, **layout):
    facts = {k: layout.pop(k) for k in list(layout) if k in SoftwareStack.model_fields}
    lay = Layout(tp=8, micro_batch=2, stack=stack_with("jax", **facts), **layout)
    return tensor_parallel_costs(MODEL, TRAIN, lay, hw, layer_forward_kernels(MODEL, TRAIN, lay))


def test_no_tensor_parallelism_no_collectives():
    lay = Layout(micro_batch=2)
    assert tensor_parallel_costs(MODEL, TRAIN, lay, HW, layer_forward_kernels(MODEL, TRAIN, lay)).forward_s == 0


def test_two_all_reduces_per_pass_or_the_same_bytes_gathered_and_scattered():
    group = HW.groups(Layout(tp=8))["tp"]
    plain, sp = _costs(), _costs(sequence_parallel=True)
    assert plain.forward_s == pytest.approx(2 * all_reduce_s(ACT_BYTES, group))
    assert sp.forward_s == pytest.approx(4 * all_gather_s(ACT_BYTES, group)) == pytest.approx(plain.forward_s)
    fused = _costs(fused_projections=True)
    assert fused.backward_s == fused.backward_exposed_s == pytest.approx(plain.forward_s)


def test_unfused_projections_reduce_each_input_gradient_on_its_own():
    # Llama: wq, wk, wv (tp 8 divides the 8 KV heads), w_in and w_gate: five all-reduces, the
    # count the op-level model finds in the traced program (tests/planner/test_rule_based.py).
    one_s = all_reduce_s(ACT_BYTES, HW.groups(Layout(tp=8))["tp"])
    assert column_parallel_reductions(MODEL, Layout(tp=8)) == {"qkv": 3, "mlp_in": 2}
    assert _costs().backward_s == _costs().backward_exposed_s == pytest.approx(5 * one_s)
    assert column_parallel_reductions(MODEL, Layout(tp=16)) == {"qkv": 1, "mlp_in": 2}  # K and V stay whole
    moe = MODEL.model_copy(update={"num_experts": 8, "experts_per_token": 2})
    assert column_parallel_reductions(moe, Layout(tp=8)) == {"qkv": 3, "expert_in": 1}
    # Full recompute re-runs the attention block's all-reduce (the MLP's output only feeds the layer's).
    assert _costs(recompute=Recompute.FULL).backward_s == pytest.approx(6 * one_s)


def test_batch_major_sequence_parallel_copies_every_buffer():
    copy_s = 2 * ACT_BYTES / HW.hbm_bytes_per_s  # read and write the full buffer
    sp = _costs(sequence_parallel=True).forward_s
    assert _costs(sequence_parallel=True, batch_major=True).forward_s == pytest.approx(sp + 4 * copy_s)
    assert _costs(batch_major=True).forward_s == _costs().forward_s  # all-reduces need no reorder
    one = Layout(tp=8, micro_batch=1, sequence_parallel=True)
    kernels = layer_forward_kernels(MODEL, TRAIN, one)
    batch_major = one.model_copy(update={"stack": stack_with("jax", batch_major=True)})
    assert (tensor_parallel_costs(MODEL, TRAIN, batch_major, HW, kernels).forward_s
            == tensor_parallel_costs(MODEL, TRAIN, one, HW, kernels).forward_s)


def test_overlap_hides_backward_collectives_behind_long_gradient_gemms():
    plain = _costs(tp_overlap=TpOverlap.BACKWARD, fused_projections=True)
    assert plain.backward_s == pytest.approx(plain.forward_s) and plain.backward_exposed_s == 0
    unfused = _costs(tp_overlap=TpOverlap.BACKWARD)
    # Five reductions behind two gradient GEMMs: three behind the QKV one no longer fit.
    assert unfused.backward_s == pytest.approx(2.5 * plain.forward_s) and 0 < unfused.backward_exposed_s < unfused.backward_s / 2
    # Megatron's sequence parallelism re-gathers its input in backward: 1.5× the forward bytes,
    # of which the row-parallel output-gradient gathers stay exposed.
    sp = _costs(tp_overlap=TpOverlap.BACKWARD, sequence_parallel=True)
    assert sp.backward_s == pytest.approx(1.5 * sp.forward_s) and sp.backward_exposed_s == pytest.approx(sp.forward_s / 2)


def test_overlap_leaves_what_the_gemms_cannot_cover():
    slow_link = HW.model_copy(update={"intra": Tier(bytes_per_s=2e9, latency_s=0.0)})
    exposed = _costs(slow_link, tp_overlap=TpOverlap.BACKWARD)
    assert 0 < exposed.backward_exposed_s < exposed.backward_s


def test_recompute_collectives_are_never_hidden():
    full = _costs(tp_overlap=TpOverlap.BACKWARD, recompute=Recompute.FULL, reentrant_recompute=True, fused_projections=True)
    assert full.backward_exposed_s == pytest.approx(full.forward_s)


def test_gemm_overlap_hides_forward_collectives_too():
    for sp in (False, True):
        backward_only, gemm = (_costs(tp_overlap=o, sequence_parallel=sp) for o in (TpOverlap.BACKWARD, TpOverlap.GEMM))
        assert backward_only.forward_exposed_s == backward_only.forward_s > 0
        assert gemm.forward_s == backward_only.forward_s and gemm.forward_exposed_s < backward_only.forward_exposed_s / 2
        assert gemm.backward_exposed_s <= backward_only.backward_exposed_s
    slow_link = HW.model_copy(update={"intra": Tier(bytes_per_s=2e9, latency_s=0.0)})
    exposed = _costs(slow_link, tp_overlap=TpOverlap.GEMM, sequence_parallel=True)
    assert 0 < exposed.forward_exposed_s < exposed.forward_s


def test_xla_collective_matmul_overlaps_only_sequence_parallel_gathers_and_scatters():
    for sp, like in ((True, TpOverlap.GEMM), (False, TpOverlap.NONE)):
        assert _costs(tp_overlap=TpOverlap.COLLECTIVE_MATMUL, sequence_parallel=sp) == _costs(tp_overlap=like, sequence_parallel=sp)
    assert stack_with("jax").tp_overlap is TpOverlap.COLLECTIVE_MATMUL
    # The program turns XLA's windowed einsum on for GPUs only (planner/programs/xla_options.py).
    tpu = HW.model_copy(update={"device_kind": DeviceKind.TPU})
    assert _costs(tpu, tp_overlap=TpOverlap.COLLECTIVE_MATMUL, sequence_parallel=True) == _costs(tpu, tp_overlap=TpOverlap.NONE,
                                                                                                 sequence_parallel=True)

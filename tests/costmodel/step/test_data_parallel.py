"""Tests `costmodel/step/data_parallel.py`: gradient reduction, ZeRO and FSDP traffic."""

import pytest

from costmodel.hardware.machine import Machine
from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.stack import stack_with
from costmodel.inputs.train_config import TrainConfig
from costmodel.step.collectives import Group, Tier, all_gather_s, all_reduce_s, reduce_scatter_s
from costmodel.step.data_parallel import data_parallel_costs, layer_params_per_device, stage_params_per_device
from costmodel.step.layer_costs import layer_costs

MODEL = ModelConfig(name="m", hidden_size=2048, num_layers=8, num_heads=16, ffn_size=5632, vocab_size=32000)
TRAIN = TrainConfig(seq_len=2048, global_batch=64)
NV, IB = Tier(bytes_per_s=3e11, latency_s=1e-6), Tier(bytes_per_s=2.5e10, latency_s=5e-6)
HW = Machine(name="t", peak_flops_per_s=1e15, hbm_bytes_per_s=3e12, hbm_bytes=8e10, devices_per_node=8, intra=NV, inter=IB)


def _costs(layout):
    return data_parallel_costs(MODEL, TRAIN, layout, HW, layer_costs(MODEL, TRAIN, layout, HW))


def test_plain_data_parallel_all_reduces_fp32_gradients_once():
    lay = Layout(dp=32, stack=stack_with("megatron-core", dp_overlap=False))
    expected = all_reduce_s(stage_params_per_device(MODEL, lay) * 4, Group(n=32, n_nodes=4, intra=NV, inter=IB))
    c = _costs(lay)
    assert c.total_s == pytest.approx(expected) and c.exposed_s == c.total_s


def test_fp32_weights_reduced_by_xla_every_micro_batch_in_bf16_then_fp32_parameters_gathered():
    group = Group(n=32, n_nodes=4, intra=NV, inter=IB)
    layers = MODEL.num_layers * layer_params_per_device(MODEL, Layout())
    other = stage_params_per_device(MODEL, Layout()) - layers
    reduce_s = all_reduce_s(layers * 2 + other * 4, group)
    # Into ZeRO's split accumulator XLA's GPU compiler reduce-scatters instead.
    scatter_s = reduce_scatter_s(layers * 2 + other * 4, group)
    in_loop = stack_with("jax", dp_overlap=False, manual_data_parallel=False)
    one_micro_batch = Layout(dp=32, micro_batch=2, stack=in_loop)
    assert _costs(one_micro_batch).total_s == pytest.approx(reduce_s)
    assert _costs(one_micro_batch.model_copy(update={"micro_batch": 1})).total_s == pytest.approx(2 * reduce_s)  # inside the loop
    zero1 = _costs(Layout(dp=32, micro_batch=2, zero_stage=1, stack=stack_with(in_loop, dp_overlap=True)))
    gather_s = all_gather_s((layers + other) * 4, group)
    assert zero1.total_s == pytest.approx(scatter_s + gather_s)
    # The gather ends the step: nothing hides it, unlike Megatron's --overlap-param-gather.
    assert zero1.exposed_s >= gather_s
    overlapped = _costs(Layout(dp=32, micro_batch=2, zero_stage=1, stack=stack_with(in_loop, dp_overlap=True, overlap_param_gather=True)))
    assert overlapped.exposed_s < zero1.exposed_s


@pytest.mark.parametrize("zero, reductions", [(0, 1), (1, 1), (2, 2)])
def test_the_jax_program_reduces_its_local_fp32_sums_as_zero_needs(zero, reductions):
    group = Group(n=32, n_nodes=4, intra=NV, inter=IB)
    params = stage_params_per_device(MODEL, Layout())
    cost = _costs(Layout(dp=32, micro_batch=1, zero_stage=zero))  # two micro-batches
    if zero == 0:
        expected = all_reduce_s(params * 4, group)
    else:
        # The updated weights gathered as their bf16 compute copy (`keeps_compute_copy`).
        expected = reductions * reduce_scatter_s(params * 4, group) + all_gather_s(params * 2, group)
    assert cost.total_s == pytest.approx(expected)
    assert cost.exposed_s == cost.total_s  # after the loop, or after a whole backward: nothing left to hide behind


@pytest.mark.parametrize("zero", [0, 1])
def test_a_lockstep_pipeline_all_reduces_its_local_sums_once_whatever_the_micro_batches(zero):
    group = Group(n=32, n_nodes=4, intra=NV, inter=IB)
    costs = [_costs(Layout(dp=32, pp=2, micro_batch=mb, zero_stage=zero)) for mb in (1, 2)]  # 2 and 1 micro-batches
    params = stage_params_per_device(MODEL, Layout(pp=2))
    expected = reduce_scatter_s(params * 4, group) + all_gather_s(params * 4, group) if zero else all_reduce_s(params * 4, group)
    assert [c.total_s for c in costs] == pytest.approx([expected, expected]) and costs[0].exposed_s == costs[0].total_s
    # ZeRO 2 keeps XLA's reduction of each layer's gradient as the backward forms it: once a micro-batch.
    zero2 = [_costs(Layout(dp=32, pp=2, micro_batch=mb, zero_stage=2)).total_s for mb in (1, 2)]
    assert zero2[0] > zero2[1]


def test_overlap_hides_part_of_the_reduction():
    in_loop = stack_with("jax", manual_data_parallel=False)
    overlapped = _costs(Layout(dp=32, stack=stack_with(in_loop, dp_overlap=True)))
    assert overlapped.exposed_s < _costs(Layout(dp=32, stack=stack_with(in_loop, dp_overlap=False))).exposed_s


def test_fsdp_moves_more_bytes_than_plain_data_parallel():
    no_overlap = stack_with("jax", dp_overlap=False)
    assert _costs(Layout(dp=32, zero_stage=3, stack=no_overlap)).total_s > _costs(Layout(dp=32, stack=no_overlap)).total_s


def test_no_data_parallelism_costs_nothing():
    c = _costs(Layout(tp=8))
    assert c.total_s == c.exposed_s == 0


def test_pipeline_and_tensor_parallel_shrink_the_stage():
    assert stage_params_per_device(MODEL, Layout(pp=2, tp=2)) < stage_params_per_device(MODEL, Layout()) / 3


@pytest.mark.parametrize("overlap", [True, False])
def test_fsdp2_copies_out_each_gathered_byte_once_overlapped_or_not(overlap):
    lay = Layout(dp=32, zero_stage=3, micro_batch=2, stack=stack_with("jax", dp_overlap=overlap))
    copied = _costs(lay.model_copy(update={"stack": stack_with(lay.stack, fsdp_copy_out=True)}))
    # Forward and backward gather the stage for each micro-batch; a copy reads and writes every bf16 byte.
    gathered_bytes = lay.micro_batches(TRAIN) * 2 * stage_params_per_device(MODEL, lay) * 2
    assert copied.copy_s == pytest.approx(2 * gathered_bytes / (HW.hbm_bytes_per_s * HW.efficiency.hbm))
    assert _costs(lay).copy_s == 0 and copied.exposed_s == _costs(lay).exposed_s


def test_copy_out_needs_gathers():
    assert _costs(Layout(dp=32, stack=stack_with("jax", fsdp_copy_out=True))).copy_s == 0  # ZeRO 0: nothing gathered


def _quiet_and_slowed(layout, slowdown=0.2):
    layer = layer_costs(MODEL, TRAIN, layout, HW)
    slowed_hw = HW.model_copy(update={"efficiency": HW.efficiency.model_copy(update={"overlap_slowdown": slowdown})})
    return data_parallel_costs(MODEL, TRAIN, layout, HW, layer), data_parallel_costs(MODEL, TRAIN, layout, slowed_hw, layer)


def test_hidden_reduction_slows_the_backward_it_overlaps():
    quiet, slowed = _quiet_and_slowed(Layout(dp=32, micro_batch=2, stack=stack_with("jax", manual_data_parallel=False)))
    hidden_s = quiet.total_s - quiet.exposed_s
    assert hidden_s > 0 and slowed.exposed_s == pytest.approx(quiet.exposed_s + 0.2 * hidden_s)


def test_hidden_fsdp_traffic_slows_the_layers_it_overlaps():
    quiet, slowed = _quiet_and_slowed(Layout(dp=32, zero_stage=3, micro_batch=2))
    # Every layer's gathers and scatter overlap its neighbour; only the first gather and the ends wait alone.
    assert quiet.exposed_s < slowed.exposed_s <= quiet.exposed_s + 0.2 * quiet.total_s


def test_lora_reduces_only_adapter_gradients():
    from costmodel.inputs.workload import adapter_params_per_layer

    lora = TrainConfig(seq_len=2048, global_batch=64, workload="finetune-lora")
    lay = Layout(dp=32, stack=stack_with("jax", dp_overlap=False))
    c = data_parallel_costs(MODEL, lora, lay, HW, layer_costs(MODEL, lora, lay, HW))
    adapters = MODEL.num_layers * adapter_params_per_layer(MODEL, lora.workload.lora)
    assert c.total_s == pytest.approx(all_reduce_s(adapters * 4, Group(n=32, n_nodes=4, intra=NV, inter=IB)))
    assert c.total_s < _costs(lay).total_s / 50


def test_lora_fsdp_gathers_the_frozen_weights_as_stored():
    int4 = TrainConfig(seq_len=2048, global_batch=64, workload="finetune-lora", lora={"frozen_dtype": "int4"})
    bf16 = TrainConfig(seq_len=2048, global_batch=64, workload="finetune-lora")
    lay = Layout(dp=8, zero_stage=3, stack=stack_with("jax", dp_overlap=False))
    small, big = (data_parallel_costs(MODEL, t, lay, HW, layer_costs(MODEL, t, lay, HW)).total_s for t in (int4, bf16))
    assert small < big < _costs(lay).total_s


def test_per_chunk_reduction_hides_behind_the_other_chunks_backward():
    # dp4 over slow links, pp2 with 4 chunks: the stage's reduction outlasts one micro-batch's backward.
    slow = HW.model_copy(update={"inter": Tier(bytes_per_s=1e9, latency_s=5e-6), "devices_per_node": 1})
    stage = Layout(dp=4, pp=2, interleave=4, schedule="interleaved", zero_stage=1)

    def exposed(per_chunk: bool) -> tuple[float, float]:
        lay = stage.model_copy(update={"stack": stack_with("megatron-core", per_chunk_grad_reduce=per_chunk)})
        c = data_parallel_costs(MODEL, TRAIN, lay, slow, layer_costs(MODEL, TRAIN, lay, slow))
        return c.exposed_s, c.total_s

    (late, total), (per_chunk, same_total) = exposed(False), exposed(True)
    assert same_total == total and per_chunk < late
    # The last chunk's share still waits for the schedule's end.
    assert per_chunk > 0

"""Tests `costmodel/step/simulator.py`: consistency, physics properties, bad layouts."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.errors import InvalidConfigError, InvalidPlanError, UnsupportedError
from costmodel.hardware.machine import Machine, load_machine
from costmodel.inputs.layout import Layout, Recompute
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.stack import STACKS, Attention, SoftwareStack, TpOverlap, stack_with
from costmodel.inputs.train_config import Dtype, Precision, TrainConfig
from costmodel.step.collectives import Tier, all_gather_s, p2p_s
from costmodel.step.data_parallel import stage_params_per_device
from costmodel.step.simulator import LOSS_SCALING_BYTES_PER_PARAM, grad_accumulation_s, model_flops_per_step, simulate, stage_transfer_s

DETERMINISTIC = settings(derandomize=True, database=None, deadline=None, max_examples=40)
MODEL = ModelConfig(name="m", hidden_size=2048, num_layers=16, num_heads=16, num_kv_heads=4, ffn_size=5632, vocab_size=32000)
GPT = ModelConfig(name="gpt", hidden_size=2048, num_layers=16, num_heads=16, ffn_size=8192, vocab_size=51200,
                  norm="layernorm", mlp="gelu", positions="learned", tie_embeddings=True, max_position_embeddings=2048)
TRAIN = TrainConfig(seq_len=2048, global_batch=64)
HW = load_machine("a100-80gb")
STACKS_ = st.builds(
    SoftwareStack, attention=st.sampled_from(list(Attention)), dp_overlap=st.booleans(), tp_overlap=st.sampled_from(list(TpOverlap)),
    batch_major=st.booleans(), reentrant_recompute=st.booleans(), fsdp_copy_out=st.booleans(),
    fused_grad_accumulation=st.booleans(), reduce_every_micro_batch=st.booleans(), overlap_p2p=st.booleans(),
    fused_cross_entropy=st.booleans(),
)
LAYOUTS = st.builds(
    Layout, dp=st.sampled_from([1, 2, 4]), tp=st.sampled_from([1, 2, 4]), pp=st.sampled_from([1, 2, 4]),
    micro_batch=st.sampled_from([1, 2]), recompute=st.sampled_from(list(Recompute)), sequence_parallel=st.booleans(),
    zero_stage=st.integers(0, 3), stack=st.one_of(st.sampled_from(list(STACKS.values())), STACKS_),
)


def test_breakdown_sums_to_the_step_time_and_utilisation_is_sane():
    est = simulate(GPT, TRAIN, Layout(dp=2, tp=4, pp=2, micro_batch=2, recompute=Recompute.FULL), HW)
    assert est.breakdown.total_s == pytest.approx(est.step_time_s, rel=1e-12)
    assert 0 < est.mfu < est.hfu < 1
    assert est.tokens_per_s == pytest.approx(TRAIN.tokens_per_step / est.step_time_s)
    assert est.breakdown.comm_s_by_axis["tp"] > 0 and est.breakdown.comm_s_by_axis["pp"] > 0


def test_model_flops_follow_megatron():
    # Narayanan et al. 2021's formula without recompute (72 = 3 passes × 24), its attention term
    # s/(6h) halved for the causal mask (costmodel.workloads.flops).
    n_layers, h, s, v = GPT.num_layers, GPT.hidden_size, TRAIN.seq_len, GPT.vocab_size
    expected = 72 * TRAIN.global_batch * s * n_layers * h * h * (1 + s / (12 * h) + v / (12 * n_layers * h))
    assert model_flops_per_step(GPT, TRAIN) == pytest.approx(expected, rel=1e-3)


def _scaled(hw: Machine, flops: float = 1.0, bandwidth: float = 1.0) -> Machine:
    return hw.model_copy(update={
        "peak_flops_per_s": hw.peak_flops_per_s * flops, "hbm_bytes_per_s": hw.hbm_bytes_per_s * bandwidth,
        "intra": hw.intra.model_copy(update={"bytes_per_s": hw.intra.bytes_per_s * bandwidth}),
        "inter": hw.inter.model_copy(update={"bytes_per_s": hw.inter.bytes_per_s * bandwidth}),
    })


@DETERMINISTIC
@given(layout=LAYOUTS, flops=st.floats(1.0, 4.0), bandwidth=st.floats(1.0, 4.0))
def test_more_flops_or_bandwidth_never_predicts_a_slower_step(layout, flops, bandwidth):
    base = simulate(MODEL, TRAIN, layout, HW).step_time_s
    assert simulate(MODEL, TRAIN, layout, _scaled(HW, flops=flops)).step_time_s <= base * (1 + 1e-9)
    assert simulate(MODEL, TRAIN, layout, _scaled(HW, bandwidth=bandwidth)).step_time_s <= base * (1 + 1e-9)


@DETERMINISTIC
@given(layout=LAYOUTS, factor=st.sampled_from([2, 3, 4]))
def test_step_time_is_monotone_in_global_batch(layout, factor):
    small = simulate(MODEL, TRAIN, layout, HW).step_time_s
    large = simulate(MODEL, TRAIN.model_copy(update={"global_batch": TRAIN.global_batch * factor}), layout, HW).step_time_s
    assert large >= small


def _step_s(model: ModelConfig, layout: Layout, **facts: object) -> float:
    return simulate(model, TRAIN, layout.model_copy(update={"stack": stack_with(layout.stack, **facts)}), HW).step_time_s


def test_software_facts_move_step_time_the_right_way():
    base = Layout(dp=8, micro_batch=2)
    assert _step_s(GPT, base, attention=Attention.MATERIALIZED) > _step_s(GPT, base)
    assert _step_s(GPT, base, dp_overlap=False) >= _step_s(GPT, base)
    assert _step_s(MODEL, base, fused_elementwise=False) > _step_s(MODEL, base)
    tp = Layout(dp=2, tp=4, micro_batch=2, sequence_parallel=True, recompute=Recompute.FULL)
    gemm, backward, none = (_step_s(MODEL, tp, tp_overlap=o) for o in (TpOverlap.GEMM, TpOverlap.BACKWARD, TpOverlap.NONE))
    assert gemm < backward < none and _step_s(MODEL, tp) == gemm  # the jax stack's collective matmul, under sequence parallelism
    assert _step_s(MODEL, tp, batch_major=True) > _step_s(MODEL, tp)
    assert _step_s(MODEL, tp, reentrant_recompute=True) > _step_s(MODEL, tp)
    fsdp = Layout(dp=8, zero_stage=3)
    assert _step_s(MODEL, fsdp, fsdp_copy_out=True) > _step_s(MODEL, fsdp)
    accumulating = Layout(dp=2, micro_batch=2)
    assert _step_s(MODEL, accumulating, fused_grad_accumulation=True) < _step_s(MODEL, accumulating)
    zero2 = Layout(dp=2, micro_batch=2, zero_stage=2, stack=stack_with("megatron-core"))  # the JAX program reduces every micro-batch anyway
    assert _step_s(MODEL, zero2, reduce_every_micro_batch=True) > _step_s(MODEL, zero2)


def test_fp16_pays_for_loss_scaling_on_top_of_its_fp16_gradient_traffic():
    layout = Layout(dp=8, micro_batch=8)  # one micro-batch: no accumulation kernel
    bf16, fp16 = (TRAIN.with_precision(Precision(p)) for p in ("bf16", "fp16"))
    params = stage_params_per_device(MODEL, layout)
    bandwidth = HW.hbm_bytes_per_s * HW.efficiency.hbm
    bf16_as_fp16 = simulate(MODEL, bf16.model_copy(update={"grad_dtype": Dtype.FP16}), layout, HW)
    # fp16 and bf16 share the A100's tensor-core peak: the difference is the unscaling pass.
    assert (simulate(MODEL, fp16, layout, HW).breakdown.optimizer_s - bf16_as_fp16.breakdown.optimizer_s
            == pytest.approx(params * LOSS_SCALING_BYTES_PER_PARAM / bandwidth))
    # Megatron reduces fp16 gradients but bf16 runs' fp32 main gradients; the JAX program
    # reduces each layer gradient in the compute dtype either way.
    megatron = layout.model_copy(update={"stack": stack_with("megatron-core")})
    assert (simulate(MODEL, fp16, megatron, HW).breakdown.comm_s_by_axis["dp"]
            < simulate(MODEL, bf16, megatron, HW).breakdown.comm_s_by_axis["dp"])
    assert (simulate(MODEL, fp16, layout, HW).breakdown.comm_s_by_axis["dp"]
            == simulate(MODEL, bf16, layout, HW).breakdown.comm_s_by_axis["dp"])


def test_unfused_gradient_accumulation_streams_the_gradient_and_the_accumulator_per_extra_micro_batch():
    fp16 = TRAIN.model_copy(update={"compute_dtype": Dtype.FP16, "grad_dtype": Dtype.FP16})
    layout = Layout(dp=2, micro_batch=4)  # 8 micro-batches
    bandwidth = HW.hbm_bytes_per_s * HW.efficiency.hbm
    params = stage_params_per_device(MODEL, layout)
    expected = 7 * params * (2 + 2 * 2) / bandwidth  # read the gradient, read and write the accumulator
    assert grad_accumulation_s(MODEL, fp16, layout, HW) == pytest.approx(expected)
    assert grad_accumulation_s(MODEL, fp16, layout.model_copy(update={"zero_stage": 2}), HW) == pytest.approx(expected / 2)
    assert grad_accumulation_s(MODEL, fp16, layout.model_copy(update={"micro_batch": 32}), HW) == 0  # one micro-batch
    fused = layout.model_copy(update={"stack": stack_with("jax", fused_grad_accumulation=True)})
    assert grad_accumulation_s(MODEL, fp16, fused, HW) == 0


def test_stage_transfer_sends_a_tensor_parallel_slice_and_regathers_it_without_sequence_parallelism():
    activation = 2 * TRAIN.seq_len * MODEL.hidden_size * TRAIN.compute_dtype.bytes  # micro-batch 2
    layout = Layout(tp=4, pp=2, dp=8, micro_batch=2)  # stages 32 devices apart: across nodes
    tp_group = HW.groups(layout)["tp"]
    assert stage_transfer_s(MODEL, TRAIN, layout, HW) == pytest.approx(p2p_s(activation / 4, HW.inter) + all_gather_s(activation, tp_group))
    sp = layout.model_copy(update={"sequence_parallel": True})
    assert stage_transfer_s(MODEL, TRAIN, sp, HW) == pytest.approx(p2p_s(activation / 4, HW.inter))
    assert stage_transfer_s(MODEL, TRAIN, Layout(tp=4, dp=8), HW) == 0


def test_pipeline_transfers_are_exposed_communication():
    est = simulate(MODEL, TRAIN, Layout(dp=2, pp=4, micro_batch=2), HW)
    transfers_s = 2 * 16 * stage_transfer_s(MODEL, TRAIN, est.layout, HW)  # 16 micro-batches, one chunk each
    assert est.breakdown.comm_s_by_axis["pp"] == pytest.approx(transfers_s)
    assert est.breakdown.exposed_comm_s >= transfers_s


def test_overlapped_interleaved_transfers_hide_behind_compute_but_still_count_as_pp_traffic():
    layout = Layout(dp=2, pp=4, micro_batch=2, interleave=2, schedule="interleaved", stack=stack_with("jax", overlap_p2p=False))
    blocking = simulate(MODEL, TRAIN, layout, HW)
    overlapped = simulate(MODEL, TRAIN, layout.model_copy(update={"stack": stack_with("jax", overlap_p2p=True)}), HW)
    non_interleaved = Layout(dp=2, pp=4, micro_batch=2, stack=stack_with("jax", overlap_p2p=True))
    assert overlapped.step_time_s < blocking.step_time_s
    assert overlapped.breakdown.comm_s_by_axis["pp"] == pytest.approx(blocking.breakdown.comm_s_by_axis["pp"])
    # Megatron-Core refuses to overlap transfers without a virtual pipeline: 1F1B still blocks.
    assert simulate(MODEL, TRAIN, non_interleaved, HW).step_time_s == pytest.approx(
        simulate(MODEL, TRAIN, non_interleaved.model_copy(update={"stack": STACKS["jax"]}), HW).step_time_s)


def test_memory_comes_with_the_estimate():
    est = simulate(MODEL, TRAIN, Layout(dp=8), HW)
    assert est.memory.hbm_bytes == HW.hbm_bytes and est.fits == est.memory.fits


@pytest.mark.parametrize(("layout", "message"), [
    (Layout(tp=3), "not divisible by tp=3"),
    (Layout(pp=32), "num_layers=16 < pp"),
    (Layout(dp=3), "global_batch=64 is not divisible"),
])
def test_inconsistent_layouts_are_refused(layout, message):
    with pytest.raises(InvalidPlanError, match=message):
        simulate(MODEL, TRAIN, layout, HW)


def test_too_long_sequences_for_learned_positions():
    with pytest.raises(InvalidConfigError, match="learned positions"):
        simulate(GPT, TRAIN.model_copy(update={"seq_len": 4096}), Layout(), HW)


def test_tiny_hand_machine_runs():
    tier = Tier(bytes_per_s=1e10, latency_s=0)
    hw = Machine(name="toy", peak_flops_per_s=1e13, hbm_bytes_per_s=1e11, hbm_bytes=1e10, devices_per_node=2, intra=tier, inter=tier)
    assert simulate(MODEL, TRAIN, Layout(dp=2, pp=2), hw).step_time_s > 0


def test_balanced_stages_shorten_the_end_stages_and_the_step():
    from costmodel.step.simulator import balanced_layout

    big_vocab = ModelConfig(name="m", hidden_size=2048, num_layers=16, num_heads=16, ffn_size=8192, vocab_size=256000)
    train = TrainConfig(seq_len=2048, global_batch=64)
    hw = load_machine("a100-80gb")
    even = Layout(pp=4, dp=2, micro_batch=1, stack=STACKS["megatron-core"])
    uneven = balanced_layout(big_vocab, train, even, hw)
    assert uneven.stage_layers is not None and sum(uneven.stage_layers) == 16
    assert uneven.stage_layers[-1] < max(uneven.stage_layers)  # the head's stage carries fewer layers
    assert simulate(big_vocab, train, uneven, hw).step_time_s < simulate(big_vocab, train, even, hw).step_time_s
    # In lockstep the head runs outside the stages' slots, on every device: the even split stays.
    lockstep = even.model_copy(update={"stack": STACKS["jax"]})
    assert balanced_layout(big_vocab, train, lockstep, hw) == lockstep


def test_memory_of_uneven_stages_costs_the_busiest_middle_stage():
    m = ModelConfig(name="m", hidden_size=1024, num_layers=16, num_heads=16, ffn_size=4096, vocab_size=1000)
    train = TrainConfig(seq_len=2048, global_batch=64)
    heavy_middle = simulate(m, train, Layout(pp=4, stage_layers=(1, 13, 1, 1)), load_machine("a100-80gb"))
    assert heavy_middle.memory.stage == "stage 1"


def test_temporaries_mapped_afresh_each_step_cost_their_first_touch():
    from costmodel.hardware.profile import StepAllocator

    layout = Layout(dp=2, tp=4, micro_batch=2)
    pooled = simulate(GPT, TRAIN, layout, HW)
    mem = pooled.memory
    fresh_bytes = mem.grads_bytes + mem.activations_bytes + mem.temporary_bytes
    mapped = HW.model_copy(update={"step_allocator": StepAllocator(fresh_above_bytes=fresh_bytes / 2, first_touch_s_per_byte=1e-10)})
    est = simulate(GPT, TRAIN, layout, mapped)
    assert pooled.breakdown.first_touch_s == 0 and est.breakdown.first_touch_s == pytest.approx(fresh_bytes * 1e-10)
    assert est.step_time_s == pytest.approx(pooled.step_time_s + est.breakdown.first_touch_s)
    below = HW.model_copy(update={"step_allocator": StepAllocator(fresh_above_bytes=2 * fresh_bytes, first_touch_s_per_byte=1e-10)})
    assert simulate(GPT, TRAIN, layout, below).step_time_s == pooled.step_time_s  # reused from the heap: no faults


def test_lora_step_skips_frozen_weight_gradients():
    lora = TrainConfig(seq_len=2048, global_batch=64, workload="finetune-lora")
    lay = Layout(dp=8, micro_batch=1, recompute="full")
    full, tuned = simulate(MODEL, TRAIN, lay, HW), simulate(MODEL, lora, lay, HW)
    # About 4·N + attention against 6·N + attention per token, plus the adapters' thin (HBM-bound) GEMMs.
    assert 0.6 < tuned.breakdown.compute_s / full.breakdown.compute_s < 0.85
    assert 0.66 < model_flops_per_step(MODEL, lora) / model_flops_per_step(MODEL, TRAIN) < 0.75  # attention keeps 3×
    assert tuned.breakdown.optimizer_s < full.breakdown.optimizer_s / 100
    assert tuned.memory.total_bytes < full.memory.total_bytes / 3


LLAMA3_8B = ModelConfig(name="llama3-8b", hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8, ffn_size=14336,
                        vocab_size=128256)


def test_llama3_8b_fits_one_a100_40gb_only_offloaded_and_its_pcie_term_is_the_napkins():
    hw, train = load_machine("a100-40gb"), TrainConfig(seq_len=2048, global_batch=4)
    on_device = simulate(LLAMA3_8B, train, Layout(micro_batch=4, recompute=Recompute.FULL), hw)
    offloaded = simulate(LLAMA3_8B, train, Layout(micro_batch=4, recompute=Recompute.FULL, offload="optimizer"), hw)
    assert on_device.fits is False and offloaded.fits is True
    # Napkin: 8.03e9 parameters (embedding and head 2·V·h, per layer q,o h² each, k,v h·h/4 each, MLP 3·h·F, two norms),
    # fp32 gradients down and bf16 parameters up, over PCIe Gen4 x16 at the ~25 GB/s usable per direction.
    h, f, v, layers = 4096, 14336, 128256, 32
    params = 2 * v * h + layers * (2 * h * h + 2 * h * h // 4 + 3 * h * f + 2 * h) + h
    napkin_s = (4 + 2) * params / 25e9
    off = offloaded.breakdown.offload
    assert off.transfer_s == pytest.approx(napkin_s, rel=0.1)
    # Exposed: the copy up; the gradients (1.25 s) hide behind a 4-sequence backward.
    assert offloaded.breakdown.offload_transfer_s == pytest.approx(2 * params / 25e9, rel=0.1)
    assert offloaded.breakdown.cpu_optimizer_s == off.cpu_adam_s > 0 and offloaded.breakdown.optimizer_s == 0
    assert offloaded.breakdown.total_s == pytest.approx(offloaded.step_time_s, rel=1e-12)
    host = offloaded.memory.host
    assert offloaded.memory.host_bytes == host.total_bytes == pytest.approx(18 * params)  # 4 + 8 + 4 + 2 B, one micro-batch
    assert offloaded.memory.optimizer_bytes == 0 < offloaded.memory.total_bytes < 40 * 2**30


def test_offloading_where_no_host_is_described_is_refused():
    with pytest.raises(UnsupportedError, match="describes no host"):
        simulate(MODEL, TRAIN, Layout(offload="optimizer"), load_machine("a40"))


def test_host_memory_that_does_not_fit_makes_the_layout_not_fit():
    hw = load_machine("a100-40gb")
    tiny_host = hw.model_copy(update={"host": hw.host.model_copy(update={"memory_bytes_per_node": 1e9})})
    est = simulate(MODEL, TrainConfig(seq_len=2048, global_batch=2), Layout(micro_batch=1, offload="optimizer"), tiny_host)
    assert est.memory.host.capacity_bytes == 1e9
    assert est.memory.total_bytes < est.memory.hbm_bytes and est.memory.host.fits is False and est.fits is False


def test_offloaded_gradient_copies_hide_behind_backward_only_where_the_stack_overlaps_them():
    hw, train = load_machine("a100-40gb"), TrainConfig(seq_len=2048, global_batch=8)
    lay = Layout(micro_batch=4, recompute=Recompute.FULL, offload="optimizer")
    overlapped = simulate(LLAMA3_8B, train, lay, hw).breakdown.offload
    queued = simulate(LLAMA3_8B, train, lay.model_copy(update={"stack": stack_with("jax", dp_overlap=False)}), hw).breakdown.offload
    assert overlapped.exposed_grads_s < 0.1 * queued.exposed_grads_s
    assert queued.exposed_grads_s == pytest.approx((queued.grads_to_host_bytes + queued.grads_from_host_bytes) / queued.link_bytes_per_s)


def test_offloaded_activations_shrink_the_device_and_cost_what_pcie_does_not_hide():
    hw, train = load_machine("a100-40gb"), TrainConfig(seq_len=2048, global_batch=8)
    lay = Layout(micro_batch=4, recompute=Recompute.NONE, stack=stack_with("jax"))
    kept = simulate(LLAMA3_8B, train, lay, hw)
    off = simulate(LLAMA3_8B, train, lay.model_copy(update={"offload_activations": True}), hw)
    assert off.memory.activations_bytes < kept.memory.activations_bytes / 10
    host = off.memory.host.activations_bytes
    # Each of the 2 micro-batches copies its saved tensors down and up at 25.6 GB/s; each direction hides behind
    # that micro-batch's forward or backward (the napkin: what the copy takes beyond it).
    copy_s = host / 25.6e9
    napkin = 2 * (max(0.0, copy_s - kept.breakdown.compute_s / 6) + max(0.0, copy_s - kept.breakdown.compute_s / 3))
    assert off.breakdown.activation_offload_s == pytest.approx(napkin, rel=0.5, abs=0.05)
    assert off.step_time_s == pytest.approx(kept.step_time_s + off.breakdown.activation_offload_s, rel=1e-9)
    assert off.breakdown.total_s == pytest.approx(off.step_time_s, rel=1e-12)


def _precision_step(model_name: str, hardware: str, precision: str, *, layout: Layout):
    from costmodel.hardware.machine import train_machine
    from costmodel.hardware.registry import load_hardware
    from planner.config import load_model

    train = TrainConfig(seq_len=1024, global_batch=8).with_precision(Precision(precision))
    return simulate(load_model(model_name), train, layout, train_machine(load_hardware(hardware), train))


@pytest.mark.parametrize("hardware, slow, fast, peak_ratio", [("t4", "fp32", "fp16", 65 / 8.1), ("a100-80gb", "tf32", "bf16", 2.0),
                                                             ("a100-80gb", "fp32", "tf32", 156 / 19.5)])
def test_gemm_time_scales_with_the_dtype_peaks(hardware, slow, fast, peak_ratio):
    # Compute-bound: gpt2-medium, 8 × 1024 tokens on one device; the GEMM efficiency curve is
    # one per part, so the GEMM and attention time follows the peaks exactly.
    layout = Layout(micro_batch=8, recompute="full")
    a, b = (_precision_step("gpt2-medium", hardware, p, layout=layout) for p in (slow, fast))
    assert a.breakdown.compute_s / b.breakdown.compute_s == pytest.approx(peak_ratio, rel=0.01)
    # The whole step moves less: HBM-bound kernels only double their bytes from 16 to 32 bits.
    assert 1 < a.step_time_s / b.step_time_s < peak_ratio


def test_fp8_speeds_up_the_linear_gemms_only():
    layout = Layout(dp=4, tp=2, micro_batch=1, recompute="selective", sequence_parallel=True, stack=stack_with("megatron-core"))
    bf16, fp8 = (_precision_step("llama3-8b", "h100-sxm", p, layout=layout) for p in ("bf16", "fp8"))
    # Linear GEMMs at twice the peak, attention and the head not: less than 2×, and the casts add HBM time.
    assert 1.2 < bf16.breakdown.compute_s / fp8.breakdown.compute_s < 2.0
    assert fp8.breakdown.memory_bound_s > bf16.breakdown.memory_bound_s
    assert fp8.mfu > bf16.mfu and fp8.model_flops == bf16.model_flops  # MFU stays against the bf16 peak
    assert fp8.memory.activations_bytes < bf16.memory.activations_bytes


def test_the_optimizer_update_moves_the_bytes_its_state_is_stored_in():
    from costmodel.step.simulator import OPTIMIZER_BYTES_PER_PARAM, optimizer_bytes_per_param
    hw = load_machine("h100-sxm")
    lay = Layout(micro_batch=8, stack=stack_with("megatron-core"))
    by_state = {}
    for state, in_bwd, per_param in (("fp32", False, OPTIMIZER_BYTES_PER_PARAM), ("fp32", True, OPTIMIZER_BYTES_PER_PARAM - 8),
                                     ("bf16", False, 7 * 2 + 2 + 2), ("8bit", False, 3 * 2 + 4 * (1 + 4 / 2048) + 2 + 2),
                                     ("8bit", True, 3 * 2 + 4 * (1 + 4 / 2048))):
        train = TrainConfig(seq_len=1024, global_batch=8, optimizer_state=state, optimizer_in_backward=in_bwd)
        assert optimizer_bytes_per_param(train) == pytest.approx(per_param, rel=1e-12)
        by_state[state, in_bwd] = simulate(MODEL, train, lay, hw).breakdown.optimizer_s
    assert by_state["fp32", False] == pytest.approx(hw.stream_s(MODEL.total_params * OPTIMIZER_BYTES_PER_PARAM), rel=1e-9)
    assert by_state["fp32", False] > by_state["bf16", False] > by_state["8bit", False] > by_state["8bit", True]


def test_the_step_in_backward_with_gradient_accumulation_is_refused_in_one_line():
    train = TrainConfig(seq_len=1024, global_batch=8, optimizer_in_backward=True)
    with pytest.raises(InvalidPlanError, match="cannot accumulate 4 micro-batches"):
        simulate(MODEL, train, Layout(micro_batch=2), load_machine("h100-sxm"))

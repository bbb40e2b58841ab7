"""Tests `costmodel/step/memory.py`: itemised per-device memory."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.inputs.layout import Layout, Recompute, Schedule
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.stack import STACKS, Attention, stack_with
from costmodel.inputs.train_config import Dtype, TrainConfig
from costmodel.step.data_parallel import layer_params_per_device, stage_trainable_params
from costmodel.step.memory import accumulates_layer_by_layer, in_flight_microbatches, memory_breakdown

MODEL = ModelConfig(name="m", hidden_size=1024, num_layers=8, num_heads=16, ffn_size=4096, vocab_size=32000)
TRAIN = TrainConfig(seq_len=1024, global_batch=32)


def _states_per_param(mem, model=MODEL):
    return (mem.params_bytes + mem.grads_bytes + mem.optimizer_bytes) / model.total_params


def test_mixed_precision_adam_holds_16_to_18_bytes_per_parameter():
    assert 16 <= _states_per_param(memory_breakdown(MODEL, TRAIN, Layout())) <= 18
    pure_fp32 = TrainConfig(seq_len=1024, global_batch=32, compute_dtype=Dtype.FP32)
    assert _states_per_param(memory_breakdown(MODEL, pure_fp32, Layout())) == 16  # 4 + 4 + 8, no master copy


def test_zero_stages_shard_states_over_data_parallel():
    dp, megatron = 8, stack_with("megatron-core")
    stage = {z: memory_breakdown(MODEL, TRAIN, Layout(dp=dp, zero_stage=z, stack=megatron)) for z in range(4)}
    assert stage[1].optimizer_bytes == pytest.approx(stage[0].optimizer_bytes / dp)
    assert stage[3].params_bytes == pytest.approx(stage[0].params_bytes / dp)
    deepspeed = memory_breakdown(MODEL, TRAIN, Layout(dp=dp, zero_stage=2, stack=stack_with("deepspeed")))
    assert deepspeed.grads_bytes == pytest.approx(stage[0].grads_bytes / dp)


def test_zero_2_reducing_after_the_last_micro_batch_only_accumulates_whole_gradients():
    # Megatron's distributed optimizer reduces once a step: its ZeRO 2 holds what its ZeRO 1 does.
    # DeepSpeed reduce-scatters every micro-batch, so its accumulator is the shard.
    dp, micro = 8, Layout(dp=8, micro_batch=1).micro_batches(TRAIN)
    assert micro > 1
    for name, split in (("megatron-core", 1), ("deepspeed", dp)):
        one, two = (memory_breakdown(MODEL, TRAIN, Layout(dp=dp, zero_stage=z, micro_batch=1, stack=stack_with(name))) for z in (1, 2))
        assert two.grads_bytes == pytest.approx(one.grads_bytes / split)
    megatron = [memory_breakdown(MODEL, TRAIN, Layout(dp=dp, zero_stage=z, micro_batch=1, stack=stack_with("megatron-core")))
                for z in (1, 2)]
    assert megatron[0].total_bytes == pytest.approx(megatron[1].total_bytes)


def test_the_jax_program_holds_a_bf16_copy_beside_the_split_master_under_zero_1_2():
    # `keeps_compute_copy`: ZeRO 0 and 3 step the fp32 weights themselves; ZeRO 1-2 a bf16 copy,
    # the fp32 master split over data with the moments, as Megatron's distributed optimizer.
    dp, n = 8, MODEL.total_params
    stage = {z: memory_breakdown(MODEL, TRAIN, Layout(dp=dp, zero_stage=z)) for z in range(4)}
    assert stage[0].params_bytes == pytest.approx(4 * n) and stage[0].optimizer_bytes == pytest.approx(8 * n)
    for z in (1, 2):
        assert stage[z].params_bytes == pytest.approx(2 * n)
        assert stage[z].optimizer_bytes == pytest.approx((4 + 8) * n / dp)
    assert stage[3].params_bytes == pytest.approx(4 * n / dp)


@settings(derandomize=True, database=None, deadline=None, max_examples=60)
@given(dp=st.sampled_from([1, 2, 4, 8]), tp=st.sampled_from([1, 2, 4]), pp=st.sampled_from([1, 2, 4]),
       recompute=st.sampled_from(list(Recompute)), zero=st.integers(0, 2))
def test_memory_never_grows_when_zero_stage_rises(dp, tp, pp, recompute, zero):
    # 16 layers: every stage holds at least 4. (FSDP keeps two gathered layers besides its
    # shards, so a stage of one or two layers can really hold more under ZeRO 3 than 2.)
    deep = MODEL.model_copy(update={"num_layers": 16})
    lay = Layout(dp=dp, tp=tp, pp=pp, recompute=recompute, zero_stage=zero)
    higher = lay.model_copy(update={"zero_stage": zero + 1})
    assert memory_breakdown(deep, TRAIN, higher).total_bytes <= memory_breakdown(deep, TRAIN, lay).total_bytes


def test_tensor_parallel_shards_layer_weights():
    one, four = memory_breakdown(MODEL, TRAIN, Layout()), memory_breakdown(MODEL, TRAIN, Layout(tp=4))
    assert four.params_bytes == pytest.approx(one.params_bytes / 4, rel=0.01)


@pytest.mark.parametrize(("stack", "schedule", "v", "m", "expected"), [
    ("megatron-core", Schedule.ONE_F_ONE_B, 1, 16, 4), ("megatron-core", Schedule.ONE_F_ONE_B, 1, 2, 2),
    ("megatron-core", Schedule.GPIPE, 1, 16, 16), ("megatron-core", Schedule.INTERLEAVED, 2, 16, 4 * (1 + 3 / 8)),
    # Lockstep (the jax stack): a ring of S = 4 micro-batches and its scratch slot (with 2 only, both and the scratch);
    # interleaved 2vS - 1 = 15 chunks.
    ("jax", Schedule.ONE_F_ONE_B, 1, 16, 5), ("jax", Schedule.ONE_F_ONE_B, 1, 2, 3), ("jax", Schedule.GPIPE, 1, 16, 16),
    ("jax", Schedule.INTERLEAVED, 2, 16, 15 / 2),
])
def test_first_stage_in_flight_microbatches(stack, schedule, v, m, expected):
    layout = Layout(pp=4, interleave=v, schedule=schedule, stack=STACKS[stack])
    assert in_flight_microbatches(layout, m) == pytest.approx(expected)


def test_fits_and_margin_against_hbm():
    mem = memory_breakdown(MODEL, TRAIN, Layout(), hbm_bytes=80 * 2**30)
    assert mem.fits and mem.margin_bytes == pytest.approx(80 * 2**30 - mem.total_bytes)
    tight = memory_breakdown(MODEL, TRAIN, Layout(), hbm_bytes=mem.total_bytes / 2)
    assert tight.fits is False and tight.margin_bytes < 0
    assert memory_breakdown(MODEL, TRAIN, Layout()).fits is None


def test_pipeline_reports_the_fuller_end_stage():
    mem = memory_breakdown(MODEL, TRAIN, Layout(pp=4))
    assert mem.stage in ("first", "last")
    assert mem.total_bytes < memory_breakdown(MODEL, TRAIN, Layout()).total_bytes


@pytest.mark.parametrize(("tp", "sp"), [(1, False), (4, False), (4, True)])
def test_materialized_attention_holds_the_score_matrices_flash_does_not(tp, sp):
    # Per layer and micro-batch: the softmax output (2 B), dropout mask (1 B) and dropout output
    # (2 B) of the a·s² scores, split over tp; flash keeps an fp32 log-sum-exp per query and head.
    gpt = ModelConfig(name="gpt", hidden_size=1024, num_layers=8, num_heads=16, ffn_size=4096, vocab_size=32000,
                      norm="layernorm", mlp="gelu", positions="learned")
    lay = Layout(tp=tp, sequence_parallel=sp, micro_batch=2, stack=stack_with("jax", dropout=True))
    flash, mat = (memory_breakdown(gpt, TRAIN, lay.model_copy(update={"stack": stack_with(lay.stack, attention=a)})) for a in Attention)
    b, s, a = 2, TRAIN.seq_len, gpt.num_heads
    per_layer = (5 * a * s * s * b - 4 * a * s * b) / tp
    assert mat.activations_bytes - flash.activations_bytes == pytest.approx(gpt.num_layers * per_layer, rel=1e-12)


def test_full_recompute_keeps_the_same_activations_for_either_kernel():
    lay = Layout(tp=4, recompute=Recompute.FULL, stack=stack_with("jax", attention=Attention.FLASH))
    flash = memory_breakdown(MODEL, TRAIN, lay)
    mat = memory_breakdown(MODEL, TRAIN, lay.model_copy(update={"stack": stack_with(lay.stack, attention=Attention.MATERIALIZED)}))
    assert mat.activations_bytes == flash.activations_bytes
    # Recomputing a layer materializes its scores once more: a transient, not a kept activation.
    assert mat.temporary_bytes > flash.temporary_bytes


def test_gradient_accumulation_holds_one_micro_batch_gradient_beside_the_accumulator():
    def extra_temporary_bytes(micro_batch, fused=False, fp32_weights=False, manual=False, every=True, **layout):
        """Temporaries beyond one micro-batch's logits and their gradient."""
        stack = stack_with("jax", fused_grad_accumulation=fused, fp32_weights=fp32_weights, manual_data_parallel=manual,
                           reduce_every_micro_batch=every)
        mem = memory_breakdown(MODEL, TRAIN, Layout(micro_batch=micro_batch, stack=stack, **layout))
        return mem.temporary_bytes - 2 * micro_batch * TRAIN.seq_len * MODEL.vocab_size * 4

    # Mixed precision: in the compute dtype, only its dp shard with ZeRO 2.
    assert extra_temporary_bytes(8) - extra_temporary_bytes(32) == pytest.approx(2 * MODEL.total_params)
    zero2 = {mb: extra_temporary_bytes(mb, dp=4, zero_stage=2) for mb in (2, 8)}
    assert zero2[2] - zero2[8] == pytest.approx(2 * MODEL.total_params / 4)
    # Reduced after the last micro-batch only: summed whole, so added whole, as under ZeRO 1.
    once = {z: extra_temporary_bytes(2, every=False, dp=4, zero_stage=z) for z in (1, 2)}
    assert once[2] == once[1] > zero2[2] + 2 * MODEL.total_params / 2
    # fp32 weights reduced where XLA puts it: an fp32 gradient, split with the optimizer state from ZeRO 1.
    fp32 = {mb: extra_temporary_bytes(mb, fp32_weights=True) for mb in (8, 32)}
    assert fp32[8] - fp32[32] == pytest.approx(4 * MODEL.total_params)
    zero1 = {mb: extra_temporary_bytes(mb, fp32_weights=True, dp=4, zero_stage=1) for mb in (2, 8)}
    assert zero1[2] - zero1[8] == pytest.approx(4 * MODEL.total_params / 4)
    # Formed locally (the JAX program), the gradient of the weights' bf16 copy (`keeps_compute_copy`): whole until the
    # micro-batch's backward ends (ZeRO 2), or added in layer by layer (ZeRO 1): one layer's and the ends'.
    local = {zero: {mb: extra_temporary_bytes(mb, fp32_weights=True, manual=True, dp=4, zero_stage=zero) for mb in (2, 8)}
             for zero in (1, 2)}
    assert local[2][2] - local[2][8] == pytest.approx(2 * MODEL.total_params)
    all_but_one_layer = (MODEL.num_layers - 1) * layer_params_per_device(MODEL, Layout())
    assert local[1][2] - local[1][8] == pytest.approx(2 * (MODEL.total_params - all_but_one_layer))
    # GEMMs that add into the accumulator themselves leave no micro-batch gradient behind.
    assert extra_temporary_bytes(8, fused=True) == pytest.approx(extra_temporary_bytes(32))


def test_gpipe_last_stage_keeps_every_micro_batch_logits():
    logits = TRAIN.seq_len * MODEL.vocab_size * 4  # micro-batch 1, fp32
    last = {s: memory_breakdown(MODEL, TRAIN, Layout(pp=2, micro_batch=1, schedule=s)) for s in (Schedule.GPIPE, Schedule.ONE_F_ONE_B)}
    assert last[Schedule.GPIPE].stage == last[Schedule.ONE_F_ONE_B].stage == "last"
    assert last[Schedule.GPIPE].temporary_bytes - last[Schedule.ONE_F_ONE_B].temporary_bytes == pytest.approx((32 - 1) * logits)


def test_reduction_buckets_exist_only_to_overlap_the_backward():
    overlapped = memory_breakdown(MODEL, TRAIN, Layout(dp=4, micro_batch=8))
    after_backward = memory_breakdown(MODEL, TRAIN, Layout(dp=4, micro_batch=8, stack=stack_with("jax", dp_overlap=False)))
    assert overlapped.temporary_bytes - after_backward.temporary_bytes == pytest.approx(2 * 25e6)


LORA = TrainConfig(seq_len=1024, global_batch=32, workload="finetune-lora")


def test_lora_memory_is_frozen_weights_plus_adapter_state_napkin():
    from costmodel.inputs.workload import adapter_params_per_layer

    mem = memory_breakdown(MODEL, LORA, Layout(micro_batch=1))
    adapters = MODEL.num_layers * adapter_params_per_layer(MODEL, LORA.workload.lora)
    assert mem.frozen_params_bytes == pytest.approx(2 * MODEL.total_params)  # bf16, no master copy
    assert mem.params_bytes - mem.frozen_params_bytes == pytest.approx(2 * adapters)
    assert mem.grads_bytes == pytest.approx(4 * adapters) and mem.optimizer_bytes == pytest.approx(12 * adapters)
    assert mem.activations_bytes < memory_breakdown(MODEL, TRAIN, Layout(micro_batch=1)).activations_bytes


@pytest.mark.parametrize("frozen, bytes_per_matrix_param", [("int8", 1.0), ("int4", 0.5)])
def test_quantized_frozen_layer_weights_shrink_only_the_layers(frozen, bytes_per_matrix_param):
    from costmodel.inputs.workload import norm_params_per_layer

    train = TrainConfig(seq_len=1024, global_batch=32, workload="finetune-lora", lora={"frozen_dtype": frozen})
    mem = memory_breakdown(MODEL, train, Layout(micro_batch=1))
    matrices = MODEL.num_layers * (MODEL.params_per_layer - norm_params_per_layer(MODEL))
    rest = MODEL.total_params - matrices
    assert mem.frozen_params_bytes == pytest.approx(matrices * bytes_per_matrix_param + 2 * rest)


def test_zero_shards_what_exists_under_lora():
    plain = memory_breakdown(MODEL, LORA, Layout(dp=8, micro_batch=1))
    zero1 = memory_breakdown(MODEL, LORA, Layout(dp=8, micro_batch=1, zero_stage=1))
    zero3 = memory_breakdown(MODEL, LORA, Layout(dp=8, micro_batch=1, zero_stage=3))
    assert zero1.frozen_params_bytes == plain.frozen_params_bytes  # ZeRO 1 has no optimizer state of frozen weights to shard
    assert zero1.optimizer_bytes == pytest.approx(plain.optimizer_bytes / 8)
    assert zero3.frozen_params_bytes == pytest.approx(plain.frozen_params_bytes / 8)


def test_pretraining_has_no_frozen_weights():
    assert memory_breakdown(MODEL, TRAIN, Layout()).frozen_params_bytes == 0


def test_offloaded_optimizer_state_leaves_the_device_for_the_host():
    lay = Layout(dp=2, pp=2, micro_batch=1, stack=stack_with("deepspeed"))  # ZeRO-Offload's stack: a compute-dtype copy on the device
    kept = memory_breakdown(MODEL, TRAIN, lay)
    off = memory_breakdown(MODEL, TRAIN, Layout(dp=2, pp=2, micro_batch=1, stack=lay.stack, offload="optimizer"), host_capacity_bytes=1e12)
    assert off.optimizer_bytes == 0 < kept.optimizer_bytes and off.grads_bytes < kept.grads_bytes
    assert off.params_bytes == kept.params_bytes and off.stage == kept.stage
    # Host: this device's 1/dp partition of its stage, 18 B per parameter plus 2 B of accumulators (16 micro-batches).
    partition = kept.optimizer_bytes / 12 / lay.dp  # ZeRO 0 keeps 12 B per parameter of the stage
    assert off.host_bytes == pytest.approx(20 * partition) and off.host.fits
    assert kept.host is None and kept.host_bytes == 0


def test_offloaded_host_state_is_the_largest_stage_partitions():
    # The last stage's logits make it the busiest device; the first, with three layers and the embedding, offloads the most.
    wide_vocab = MODEL.model_copy(update={"vocab_size": 128000})
    lay = Layout(pp=4, stage_layers=(3, 2, 2, 1), micro_batch=1, offload="optimizer")
    mem = memory_breakdown(wide_vocab, TrainConfig(seq_len=4096, global_batch=32), lay)
    first = stage_trainable_params(wide_vocab, TRAIN, lay, 0)
    assert mem.stage == "last" and first > stage_trainable_params(wide_vocab, TRAIN, lay, 3)
    assert mem.host.master_weights_bytes == pytest.approx(4 * first)


def test_fp8_frozen_weights_take_one_byte_and_te_keeps_their_transposes_as_frozen_memory():
    from costmodel.inputs.train_config import Precision
    from costmodel.inputs.workload import norm_params_per_layer

    train = TrainConfig(seq_len=1024, global_batch=32, workload="finetune-lora", lora={"frozen_dtype": "fp8"}).with_precision(Precision.FP8)
    matrices = MODEL.num_layers * (MODEL.params_per_layer - norm_params_per_layer(MODEL))
    rest = MODEL.total_params - matrices
    jax_program = memory_breakdown(MODEL, train, Layout(micro_batch=1))
    assert jax_program.frozen_params_bytes == pytest.approx(matrices + 2 * rest)
    te = memory_breakdown(MODEL, train, Layout(micro_batch=1, stack=stack_with("megatron-core")))
    assert te.frozen_params_bytes - jax_program.frozen_params_bytes == pytest.approx(MODEL.num_layers * MODEL.params_per_layer)
    assert te.params_bytes - te.frozen_params_bytes == pytest.approx(jax_program.params_bytes - jax_program.frozen_params_bytes)
    assert te.grads_bytes == jax_program.grads_bytes  # adapters only


def test_fsdp1_lora_gives_frozen_weights_gradients_held_whole_under_no_sync():
    from costmodel.inputs.workload import adapter_params_per_layer
    from costmodel.step.data_parallel import frozen_layer_bytes

    lora = TrainConfig(seq_len=1024, global_batch=32, workload="finetune-lora", lora={"targets": "q,v"})
    frozen_layers = MODEL.num_layers * frozen_layer_bytes(MODEL, lora, Layout())
    adapter_grads = MODEL.num_layers * adapter_params_per_layer(MODEL, lora.workload.lora) * lora.grad_dtype.bytes

    def grads(stack, global_batch):
        train = lora.model_copy(update={"global_batch": global_batch})
        return memory_breakdown(MODEL, train, Layout(dp=4, micro_batch=1, zero_stage=3, stack=stack_with(stack))).grads_bytes

    assert grads("pytorch-fsdp1", 32) == pytest.approx(adapter_grads / 4)  # frozen: no gradient, sharded adapters'
    assert grads("lit-gpt", 32) == pytest.approx(adapter_grads + frozen_layers)  # 8 micro-batches: whole, under no_sync
    assert grads("lit-gpt", 4) == pytest.approx((adapter_grads + frozen_layers) / 4)  # one micro-batch: reduce-scattered


@pytest.mark.parametrize("stack, fp32_state", [("megatron-core", 2 + 4 + 12), ("jax", 4 + 4 + 8)])
def test_fine_tuning_optimizer_states_hold_their_bytes_per_parameter(stack, fp32_state):
    # Hand arithmetic: pure bf16 2 + 2 + 2·2; 8-bit AdamW 2 + 2 + 2·(1 + 4/2048); in backward only the largest
    # weight's gradient (here the untied head, vocab × hidden, in bf16).
    lay = Layout(micro_batch=32, stack=stack_with(stack))
    states = {(s, b): memory_breakdown(MODEL, TrainConfig(seq_len=1024, global_batch=32, optimizer_state=s, optimizer_in_backward=b), lay)
              for s, b in (("fp32", False), ("bf16", False), ("8bit", False), ("8bit", True))}
    assert _states_per_param(states["fp32", False]) == fp32_state
    assert _states_per_param(states["bf16", False]) == 8
    assert _states_per_param(states["8bit", False]) == pytest.approx(4 + 2 * (1 + 4 / 2048), rel=1e-12)
    int8_bwd = states["8bit", True]
    assert int8_bwd.grads_bytes == MODEL.vocab_size * MODEL.hidden_size * 2
    assert int8_bwd.optimizer_bytes == states["8bit", False].optimizer_bytes
    assert int8_bwd.activations_bytes == states["fp32", False].activations_bytes


def test_the_step_in_backward_holds_one_weights_gradient_sharded_as_zero_splits_it():
    train = TrainConfig(seq_len=1024, global_batch=32, optimizer_state="bf16", optimizer_in_backward=True)
    mem = memory_breakdown(MODEL, train, Layout(dp=4, zero_stage=2, micro_batch=8, stack=stack_with("megatron-core")))
    assert mem.grads_bytes == MODEL.vocab_size * MODEL.hidden_size * 2 / 4


def test_the_loss_in_pieces_keeps_one_piece_s_logits_and_a_head_gradient_buffer():
    model = ModelConfig(name="m", hidden_size=1024, num_layers=4, num_heads=16, ffn_size=4096, vocab_size=128000)
    train = TrainConfig(seq_len=4096, global_batch=2)
    whole = memory_breakdown(model, train, Layout(micro_batch=2))
    pieces = memory_breakdown(model, train, Layout(micro_batch=2, stack=stack_with("jax", cross_entropy_chunks=8)))
    logits = 2 * 4096 * model.padded_vocab_size * 4
    assert whole.temporary_bytes - pieces.temporary_bytes == pytest.approx(
        2 * logits - 2 * logits / 8 - model.padded_vocab_size * 1024 * 4)


MOE = ModelConfig(name="moe", hidden_size=1024, num_layers=8, num_heads=16, ffn_size=4096, vocab_size=32000, num_experts=8,
                  experts_per_token=2)


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_expert_state_shards_over_the_expert_data_group_so_zero_memory_is_ep_blind(zero):
    # ZeRO splits each expert's state over the dp / ep devices holding that expert (Megatron's distributed
    # optimizer, MaxText): per device every parameter's state is 1 / dp of it, whatever ep is.
    in_loop = stack_with("jax", manual_data_parallel=False)  # the fp32 weights stepped themselves, whatever ep
    dense_ep, spread = (memory_breakdown(MOE, TRAIN, Layout(dp=8, ep=ep, zero_stage=zero, stack=in_loop)) for ep in (1, 8))
    assert spread.optimizer_bytes == pytest.approx(dense_ep.optimizer_bytes)
    assert spread.optimizer_bytes == pytest.approx(MOE.total_params * TRAIN.moment_bytes_per_param / 8, rel=1e-6)


def test_without_zero_expert_parallelism_divides_the_experts_state():
    whole, spread = (memory_breakdown(MOE, TRAIN, Layout(dp=8, ep=ep)) for ep in (1, 8))
    experts = MOE.num_layers * MOE.routed_expert_params_per_layer
    assert whole.optimizer_bytes - spread.optimizer_bytes == pytest.approx(experts * (1 - 1 / 8) * TRAIN.moment_bytes_per_param)


def test_offloaded_parameters_leave_the_device_only_what_zero_3_gathers():
    lora = TrainConfig(seq_len=1024, global_batch=8, workload="finetune-lora")
    kept = memory_breakdown(MODEL, lora, Layout(dp=2, micro_batch=4, zero_stage=3))
    off = memory_breakdown(MODEL, lora, Layout(dp=2, micro_batch=4, zero_stage=3, offload="params"), host_capacity_bytes=1e12)
    assert off.params_bytes == off.grads_bytes == off.optimizer_bytes == off.frozen_params_bytes == 0
    assert (off.activations_bytes, off.temporary_bytes) == (kept.activations_bytes, kept.temporary_bytes)
    # Host: the frozen shard as the device held it, the adapters' shard with its gradient and moments (fp32 here).
    host = off.host
    assert host.frozen_weights_bytes == pytest.approx(kept.frozen_params_bytes)
    adapters = host.master_weights_bytes / 4
    assert (host.grads_bytes, host.moments_bytes) == (pytest.approx(4 * adapters), pytest.approx(8 * adapters))
    assert off.host_bytes == pytest.approx(host.frozen_weights_bytes + 16 * adapters) and host.fits


def test_offloaded_activations_leave_two_layers_on_the_device_and_the_rest_on_the_host():
    lay = Layout(micro_batch=4, recompute="full")
    kept = memory_breakdown(MODEL, TRAIN, lay)
    off = memory_breakdown(MODEL, TRAIN, lay.model_copy(update={"offload_activations": True}), host_capacity_bytes=1e12)
    from costmodel.step.activations import activation_bytes_per_layer
    per_layer = activation_bytes_per_layer(MODEL, TRAIN, lay)
    assert off.activations_bytes == pytest.approx(kept.activations_bytes - (MODEL.num_layers - 2) * per_layer)
    assert off.host.activations_bytes == pytest.approx(kept.activations_bytes - off.activations_bytes)
    assert off.host_bytes == off.host.activations_bytes and off.host.master_weights_bytes == 0 and off.fits is kept.fits
    assert (off.params_bytes, off.temporary_bytes) == (kept.params_bytes, kept.temporary_bytes)


def test_hugging_faces_loss_holds_one_more_fp32_logits_buffer():
    fused = memory_breakdown(MODEL, TRAIN, Layout(micro_batch=4))
    hf = memory_breakdown(MODEL, TRAIN, Layout(micro_batch=4, stack=stack_with("jax", loss_buffers=3)))
    assert hf.temporary_bytes - fused.temporary_bytes == 4 * 1024 * MODEL.vocab_size * 4  # tokens × vocabulary × fp32
    assert STACKS["hf-trainer"].loss_buffers == 3 and STACKS["megatron-core"].loss_buffers == 2


def test_the_jax_program_holds_one_layers_gradient_beside_a_whole_sum_under_zero_0_and_1():
    """Layer by layer (ZeRO 0-1, several micro-batches) a micro-batch's gradient beside the sum is one
    layer's and the ends'; ZeRO 2 reduce-scatters each micro-batch's whole gradient after its backward."""
    def temporary(zero: int, micro_batch: int) -> float:
        return memory_breakdown(MODEL, TRAIN, Layout(dp=8, zero_stage=zero, micro_batch=micro_batch)).temporary_bytes

    assert [accumulates_layer_by_layer(MODEL, TRAIN, Layout(dp=8, zero_stage=z, micro_batch=1)) for z in range(4)] == [
        True, True, False, False]
    assert not accumulates_layer_by_layer(MODEL, TRAIN, Layout(dp=8, zero_stage=1, micro_batch=4))  # one micro-batch
    # The compute copy's whole bf16 gradient under ZeRO 2, against one layer's and the ends' under ZeRO 1.
    all_but_one_layer = (MODEL.num_layers - 1) * layer_params_per_device(MODEL, Layout()) * 2
    assert all_but_one_layer <= temporary(2, 1) - temporary(1, 1) < 1.1 * all_but_one_layer

"""Tests `costmodel/step/kernels.py`: the fused-kernel table of one layer."""

import pytest

from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.stack import Attention, stack_with
from costmodel.inputs.train_config import TrainConfig
from costmodel.step.kernels import KernelKind, forms_gradients_locally, head_forward_kernels, layer_forward_kernels

GPT = ModelConfig(name="gpt", hidden_size=1024, num_layers=4, num_heads=16, ffn_size=4096, vocab_size=5000,
                  norm="layernorm", mlp="gelu", positions="learned", tie_embeddings=True)
LLAMA = ModelConfig(name="llama", hidden_size=1024, num_layers=4, num_heads=16, num_kv_heads=4, ffn_size=2816, vocab_size=5000)
TRAIN = TrainConfig(seq_len=512, global_batch=8)


def _matmul_flops(kernels):
    return sum(k.total_flops for k in kernels if k.kind is not KernelKind.MEMORY)


def _named(kernels, name):
    return next(k for k in kernels if k.name == name)


def test_materialized_gpt_layer_matches_megatron_forward_flops():
    # Megatron: forward FLOPs per layer = 24·b·s·h² (1 + s / (6h)).
    b, s, h = 2, TRAIN.seq_len, GPT.hidden_size
    kernels = layer_forward_kernels(GPT, TRAIN, Layout(micro_batch=b, stack=stack_with("jax", attention=Attention.MATERIALIZED)))
    assert _matmul_flops(kernels) == pytest.approx(24 * b * s * h * h * (1 + s / (6 * h)), rel=1e-12)


def test_tensor_and_context_parallel_divide_the_work():
    one = _matmul_flops(layer_forward_kernels(LLAMA, TRAIN, Layout(stack=stack_with("jax", attention=Attention.MATERIALIZED))))
    tp4 = _matmul_flops(layer_forward_kernels(LLAMA, TRAIN, Layout(tp=4, stack=stack_with("jax", attention=Attention.MATERIALIZED))))
    cp2 = _matmul_flops(layer_forward_kernels(LLAMA, TRAIN, Layout(cp=2, stack=stack_with("jax", attention=Attention.MATERIALIZED))))
    assert tp4 == pytest.approx(one / 4) and cp2 == pytest.approx(one / 2)


def test_flash_attention_has_no_score_traffic_and_skips_the_masked_half():
    flash = layer_forward_kernels(GPT, TRAIN, Layout(stack=stack_with("jax", attention=Attention.FLASH, dropout=True)))
    mat = layer_forward_kernels(GPT, TRAIN, Layout(stack=stack_with("jax", attention=Attention.MATERIALIZED, dropout=True)))
    flash_core = [k for k in flash if k.in_attention_core]
    mat_core = [k for k in mat if k.in_attention_core]
    assert _matmul_flops(flash_core) == pytest.approx(0.5 * _matmul_flops(mat_core))
    assert sum(k.bytes for k in flash_core) < sum(k.bytes for k in mat_core) / 10


def test_sequence_parallel_splits_the_residual_stream_kernels():
    plain = layer_forward_kernels(GPT, TRAIN, Layout(tp=4))
    sp = layer_forward_kernels(GPT, TRAIN, Layout(tp=4, sequence_parallel=True))
    assert _named(sp, "attn_norm").bytes == pytest.approx(_named(plain, "attn_norm").bytes / 4)
    assert _matmul_flops(sp) == pytest.approx(_matmul_flops(plain))


def test_moe_layer_costs_top_k_experts_and_a_capacity_its_idle_slots_too():
    moe = LLAMA.model_copy(update={"num_experts": 8, "experts_per_token": 2})
    dense = _matmul_flops([k for k in layer_forward_kernels(LLAMA, TRAIN, Layout()) if k.name.startswith("mlp")])
    for stack, slots in (("megatron-core", 2), ("jax", 2 * 1.25)):  # dropless; the JAX program's capacity factor
        lay = Layout(stack=stack_with(stack))
        experts = _matmul_flops([k for k in layer_forward_kernels(moe, TRAIN, lay) if k.name.startswith("expert")])
        assert experts == pytest.approx(slots * dense)


def test_head_projects_onto_the_vocabulary_split_by_tp():
    lm_head = _named(head_forward_kernels(GPT, TRAIN, Layout(tp=2)), "lm_head")
    assert lm_head.flops == pytest.approx(2 * TRAIN.seq_len * GPT.hidden_size * GPT.padded_vocab_size / 2)


def test_megatron_cross_entropy_moves_its_op_by_op_fp32_passes():
    # Megatron's vocab-parallel cross-entropy: 9.5 fp32 passes over the logits forward, 3.5 backward.
    fused = _named(head_forward_kernels(GPT, TRAIN, Layout(tp=2)), "cross_entropy")
    megatron = _named(head_forward_kernels(GPT, TRAIN, Layout(tp=2, stack=stack_with("megatron-core"))), "cross_entropy")
    logits = TRAIN.seq_len * GPT.padded_vocab_size / 2
    assert megatron.bytes == pytest.approx(9.5 * 4 * logits) and fused.bytes == pytest.approx(3 * 4 * logits)
    assert megatron.bytes * megatron.backward_scale == pytest.approx(3.5 * 4 * logits)


def test_backward_traffic_follows_each_kernels_passes():
    # Megatron's fused bias-dropout-add: 3.5 passes forward (sum + one-byte mask), 5.5 backward.
    gpt = {k.name: k for k in layer_forward_kernels(GPT, TRAIN, Layout(stack=stack_with("megatron-core")))}
    assert gpt["attn_residual"].bytes == pytest.approx(3.5 * TRAIN.seq_len * GPT.hidden_size * 2)
    # The JAX program trains without dropout: a plain residual add (3 passes each way).
    jax_gpt = {k.name: k for k in layer_forward_kernels(GPT, TRAIN, Layout())}
    assert jax_gpt["attn_residual"].bytes == pytest.approx(3 * TRAIN.seq_len * GPT.hidden_size * 2)
    assert jax_gpt["attn_residual"].backward_scale == 1
    assert gpt["attn_residual"].backward_scale == pytest.approx(5.5 / 3.5)
    assert gpt["qkv"].backward_scale == 2 and gpt["flash_attention"].backward_scale == 2.5
    eager_stack = stack_with("jax", fused_elementwise=False, fused_norm=False)
    eager = {k.name: k for k in layer_forward_kernels(LLAMA, TRAIN, Layout(stack=eager_stack))}
    assert eager["attn_norm"].bytes == pytest.approx(7 * gpt["attn_norm"].bytes)  # 14 passes to 2
    fused = {k.name: k for k in layer_forward_kernels(LLAMA, TRAIN, Layout())}
    fused_norm = {k.name: k for k in layer_forward_kernels(LLAMA, TRAIN, Layout(stack=stack_with("jax", fused_elementwise=False)))}
    assert fused_norm["attn_norm"].bytes == fused["attn_norm"].bytes and fused_norm["rope"].bytes == eager["rope"].bytes


def test_lora_freezes_weight_gemms_and_adds_thin_adapter_gemms():
    lora = TrainConfig(**{**TRAIN.model_dump(), "workload": "finetune-lora"})
    base = {k.name: k for k in layer_forward_kernels(LLAMA, TRAIN, Layout(tp=2))}
    tuned = {k.name: k for k in layer_forward_kernels(LLAMA, lora, Layout(tp=2))}
    assert tuned["qkv"].backward_scale == 1.0 and tuned["attn_out"].backward_scale == 1.0
    assert tuned["flash_attention"].backward_scale == base["flash_attention"].backward_scale
    tokens, r = 512, 16
    # wq: A whole (1024 x 16), B split over tp (16 x 1024/2): 2·tokens·(1024·16 + 16·512).
    assert tuned["lora_wq_down"].flops + tuned["lora_wq_up"].flops == 2 * tokens * (1024 * r + r * 512)
    assert {n for n in tuned if n.startswith("lora_") and tuned[n].kind is KernelKind.MATMUL} == {
        f"lora_{w}_{p}" for w in ("wq", "wk", "wv", "wo") for p in ("down", "up")}
    head = {k.name: k for k in head_forward_kernels(LLAMA, lora, Layout())}
    assert head["lm_head"].backward_scale == 1.0


def test_lora_adapter_elementwise_passes_dropout_and_fused_qkv():
    plain = TrainConfig(**{**TRAIN.model_dump(), "workload": "finetune-lora"})
    nemo = TrainConfig(**{**TRAIN.model_dump(), "workload": "finetune-lora", "lora": {"dropout": 0.1, "fused_qkv": True}})
    eager = Layout(tp=2, stack=stack_with("megatron-core"))
    without = {k.name: k for k in layer_forward_kernels(LLAMA, plain, eager)}
    tuned = {k.name: k for k in layer_forward_kernels(LLAMA, nemo, eager)}
    # A compiled program (the JAX stack's XLA) fuses the adapter's elementwise ops away.
    assert not any(k.name.startswith("lora_wo_") and k.name.endswith(("_dropout", "_scale", "_add"))
                   for k in layer_forward_kernels(LLAMA, nemo, Layout(tp=2)))
    tokens, h = 512, 1024
    assert "lora_wo_dropout" not in without  # no dropout unless the run set one
    # wo is row-parallel: its adapter reads tokens x h/2; dropout writes the input and a 1-byte mask.
    drop = tuned["lora_wo_dropout"]
    assert drop.bytes == 2.5 * 2 * tokens * h / 2 and drop.backward_scale == 1.0
    # The add's backward is the sum of the two gradients of the adapter's input (3 passes over it).
    add = tuned["lora_wo_add"]
    assert add.bytes == 3 * 2 * tokens * h and add.bytes * add.backward_scale == 3 * 2 * tokens * h / 2
    # One adapter over the fused qkv: one down GEMM reads the input once instead of three times.
    assert "lora_wqkv_down" in tuned and "lora_wq_down" not in tuned
    assert tuned["lora_wqkv_down"].flops == without["lora_wq_down"].flops
    assert tuned["lora_wqkv_up"].flops == sum(without[f"lora_{w}_up"].flops for w in ("wq", "wk", "wv"))


def test_fp8_gemms_read_one_byte_operands_and_add_their_casts():
    from costmodel.inputs.train_config import Precision

    m = ModelConfig(name="m", hidden_size=1024, num_layers=2, num_heads=16, ffn_size=4096, vocab_size=1000, mlp="gelu")
    bf16 = TrainConfig(seq_len=512)
    fp8 = bf16.with_precision(Precision.FP8)
    plain = {k.name: k for k in layer_forward_kernels(m, bf16, Layout())}
    quant = {k.name: k for k in layer_forward_kernels(m, fp8, Layout())}
    tokens, h, f = 512, 1024, 4096
    assert quant["mlp_in"].linear and quant["mlp_in"].flops == plain["mlp_in"].flops
    assert quant["mlp_in"].bytes == tokens * h + h * f + 2 * tokens * f  # x and W in fp8, y in bf16
    # Read bf16, write the fp8 cast and its transpose: 4 bytes an element of x; the backward's casts dy.
    cast = quant["mlp_in_input_cast"]
    assert cast.bytes == 4 * tokens * h and cast.bytes * cast.backward_scale == 4 * tokens * f
    assert quant["mlp_in_weight_cast"].bytes == 4 * h * f and quant["mlp_in_weight_cast"].backward_scale == 0
    assert not any(k.linear for k in quant.values() if k.in_attention_core)  # attention stays bf16
    gemms = ("qkv", "attn_out", "mlp_in", "mlp_out")
    assert set(quant) - set(plain) == {f"{g}_{c}_cast" for g in gemms for c in ("input", "weight")}


def test_fp8_lora_runs_frozen_gemms_in_fp8_without_weight_gradients_and_adapters_in_bf16():
    from costmodel.inputs.train_config import Precision

    lora = TrainConfig(seq_len=512, global_batch=8, workload="finetune-lora", lora={"frozen_dtype": "fp8"}).with_precision(Precision.FP8)
    ks = {k.name: k for k in layer_forward_kernels(LLAMA, lora, Layout(tp=2))}
    for name in ("qkv", "attn_out", "mlp_in", "mlp_out"):
        assert ks[name].linear and ks[name].backward_scale == 1.0  # fp8 peak, input gradient only
        assert f"{name}_input_cast" in ks and f"{name}_weight_cast" not in ks  # stored fp8: no weight cast
    # qkv reads its fp8 input and weight at one byte, writes a bf16 result.
    tokens, qkv_out = 512, (1024 + 2 * 256) / 2
    assert ks["qkv"].bytes == tokens * 1024 + 1024 * qkv_out + 2 * tokens * qkv_out
    adapters = [k for n, k in ks.items() if n.startswith("lora_") and k.kind is KernelKind.MATMUL]
    assert adapters and not any(k.linear for k in adapters) and all(k.backward_scale == 2.0 for k in adapters)
    bf16_frozen = {k.name for k in layer_forward_kernels(LLAMA, lora.model_copy(update={"workload": lora.workload.model_copy(
        update={"lora": lora.workload.lora.model_copy(update={"frozen_dtype": "bf16"})})}), Layout(tp=2))}
    assert "qkv_weight_cast" in bf16_frozen


def test_fp32_weights_are_cast_once_per_layer_forward_and_their_shard_under_zero3():
    cast = _named(layer_forward_kernels(LLAMA, TRAIN, Layout(tp=2)), "weight_cast")
    matrices = LLAMA.params_per_layer - 2 * LLAMA.hidden_size  # without the two RMSNorm scales
    assert cast.count * cast.bytes == pytest.approx(matrices / 2 * (4 + 2)) and cast.backward_scale == 0
    fsdp = _named(layer_forward_kernels(LLAMA, TRAIN, Layout(dp=4, zero_stage=3)), "weight_cast")
    assert fsdp.count * fsdp.bytes == pytest.approx(matrices / 4 * 6)
    assert "weight_cast" not in {k.name for k in layer_forward_kernels(LLAMA, TRAIN, Layout(stack=stack_with("megatron-core")))}


def test_a_sliding_window_costs_fused_attention_s_times_w_and_leaves_materialized_scores_whole():
    full = ModelConfig(name="m", hidden_size=1024, num_layers=2, num_heads=16, ffn_size=4096, vocab_size=1000)
    windowed = full.model_copy(update={"sliding_window": 4096})
    train, flash = TrainConfig(seq_len=32768), Layout(micro_batch=1, stack=stack_with("jax", attention=Attention.FLASH))

    def core_flops(model, layout, train=train):
        return sum(k.flops for k in layer_forward_kernels(model, train, layout) if k.in_attention_core)

    s, w = 32768, 4096
    assert core_flops(windowed, flash) / core_flops(full, flash) == pytest.approx((s * w - w * w / 2) / (s * s / 2))
    assert core_flops(windowed, flash, TrainConfig(seq_len=w)) == core_flops(full, flash, TrainConfig(seq_len=w))
    materialized = flash.model_copy(update={"stack": stack_with("jax", attention=Attention.MATERIALIZED)})
    assert core_flops(windowed, materialized) == core_flops(full, materialized)


def test_the_loss_in_pieces_runs_the_head_and_the_loss_once_more_in_backward():
    model = ModelConfig(name="m", hidden_size=256, num_layers=2, num_heads=4, ffn_size=1024, vocab_size=1000)
    train = TrainConfig(seq_len=128, global_batch=2)
    whole = {k.name: k for k in head_forward_kernels(model, train, Layout())}
    pieces = {k.name: k for k in head_forward_kernels(model, train, Layout(stack=stack_with("jax", cross_entropy_chunks=4)))}
    assert pieces["lm_head"].backward_scale == whole["lm_head"].backward_scale + 1
    assert pieces["cross_entropy"].backward_scale == whole["cross_entropy"].backward_scale + 1



def test_packed_documents_cut_the_flash_kernel_to_each_documents_causal_triangle():
    # `TrainConfig.document_len`: S / L documents of L²/2 pairs each, where one document has S²/2.
    from planner.config import load_model

    model, layout = load_model("llama3-8b"), Layout(micro_batch=1, stack=stack_with("jax", attention=Attention.FLASH))

    def flops(train: TrainConfig) -> float:
        return next(k.flops for k in layer_forward_kernels(model, train, layout) if k.kind is KernelKind.FLASH_ATTENTION)

    whole = flops(TrainConfig(seq_len=4096))
    assert flops(TrainConfig(seq_len=4096, document_len=512)) == whole / 8
    assert flops(TrainConfig(seq_len=4096, document_len=4096)) == whole


@pytest.mark.parametrize("layout, local", [
    (Layout(dp=8, zero_stage=3), True),
    (Layout(dp=2, tp=4, zero_stage=1), True),
    (Layout(dp=2, tp=4, zero_stage=2), True),
    (Layout(dp=2, tp=4, zero_stage=3), False),  # the data-axes region does not take tensor axes beside it
    (Layout(dp=2, pp=4, zero_stage=1), False),
    (Layout(dp=2, cp=4, zero_stage=1), False),
    (Layout(dp=1, tp=8), False),
])
def test_the_jax_stack_forms_gradients_locally_beside_tensor_axes_up_to_zero_2(layout, local):
    train = TrainConfig(seq_len=1024, global_batch=64)
    assert forms_gradients_locally(LLAMA, train, layout) is local
    moe = LLAMA.model_copy(update={"num_experts": 4, "experts_per_token": 2, "moe_ffn_size": 1024})
    assert forms_gradients_locally(moe, train, layout) is (local and layout.tp == 1)

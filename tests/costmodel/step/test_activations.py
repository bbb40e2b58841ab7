"""Tests `costmodel/step/activations.py` against Korthikanti et al. 2022's closed forms.

The paper's forms assume materialized attention: its 5·a·s/h term is the stored softmax
output and dropout output (16-bit) and dropout mask (one byte), each a·s² per sequence.
Flash attention stores none of them, only the output (already in the 34) and an fp32
log-sum-exp per query and head. The forms assume dropout, which the JAX program has not
(`SoftwareStack.dropout`), so they are checked with it on.
"""

import pytest

from costmodel.inputs.layout import Layout, Recompute
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.stack import Attention, stack_with
from costmodel.inputs.train_config import TrainConfig
from costmodel.step.activations import activation_bytes_per_layer, activation_table

# GPT-3 175B as in the paper: h = 12288, a = 96, s = 2048, b = 1, t = 8.
GPT3 = ModelConfig(name="gpt3", hidden_size=12288, num_layers=96, num_heads=96, ffn_size=4 * 12288, vocab_size=51200,
                   norm="layernorm", mlp="gelu", positions="learned", tie_embeddings=True)
S, B, H, A, T = 2048, 1, 12288, 96, 8
TRAIN = TrainConfig(seq_len=S, global_batch=64)


def _bytes(attention=Attention.MATERIALIZED, **layout):
    return activation_bytes_per_layer(GPT3, TRAIN, Layout(stack=stack_with("jax", attention=attention, dropout=True),
                                                                 micro_batch=B, **layout))


def _logsumexp_bytes(t=1):
    return 4 * A * S * B / t  # fp32, one per query and head


def test_no_parallelism():
    assert _bytes() == pytest.approx(S * B * H * (34 + 5 * A * S / H), rel=1e-12)


def test_tensor_parallel():
    assert _bytes(tp=T) == pytest.approx(S * B * H * (10 + 24 / T + 5 * A * S / (H * T)), rel=1e-12)


def test_tensor_and_sequence_parallel():
    assert _bytes(tp=T, sequence_parallel=True) == pytest.approx(S * B * H * (34 / T + 5 * A * S / (H * T)), rel=1e-12)


def test_selective_recompute_with_sequence_parallel():
    assert _bytes(tp=T, sequence_parallel=True, recompute=Recompute.SELECTIVE) == pytest.approx(S * B * H * 34 / T, rel=1e-12)


def test_full_recompute_keeps_the_layer_input():
    assert _bytes(tp=T, recompute=Recompute.FULL) == pytest.approx(2 * S * B * H, rel=1e-12)
    assert _bytes(tp=T, sequence_parallel=True, recompute=Recompute.FULL) == pytest.approx(2 * S * B * H / T, rel=1e-12)


def test_flash_attention_keeps_34_sbh_and_the_logsumexp():
    assert _bytes(Attention.FLASH) == pytest.approx(S * B * H * 34 + _logsumexp_bytes(), rel=1e-12)
    assert _bytes(Attention.FLASH, tp=T, sequence_parallel=True) == pytest.approx(S * B * H * 34 / T + _logsumexp_bytes(T), rel=1e-12)


@pytest.mark.parametrize("layout", [{}, {"tp": T}, {"tp": T, "sequence_parallel": True}])
def test_materialized_attention_adds_the_s_squared_terms_over_flash(layout):
    t = layout.get("tp", 1)
    difference = S * B * H * 5 * A * S / (H * t) - _logsumexp_bytes(t)
    assert _bytes(**layout) - _bytes(Attention.FLASH, **layout) == pytest.approx(difference, rel=1e-12)


def test_recompute_erases_the_kernel_difference():
    # Full recompute keeps only the layer input; selective recompute drops the s² terms, so
    # materialized keeps what flash does bar the log-sum-exp.
    for sp in (False, True):
        assert _bytes(tp=T, sequence_parallel=sp, recompute=Recompute.FULL) == _bytes(
            Attention.FLASH, tp=T, sequence_parallel=sp, recompute=Recompute.FULL)
    selective = {"tp": T, "sequence_parallel": True, "recompute": Recompute.SELECTIVE}
    assert _bytes(**selective) == pytest.approx(_bytes(Attention.FLASH, **selective) - _logsumexp_bytes(T), rel=1e-12)


def test_selective_recompute_saves_seventy_percent_for_gpt3():
    # Korthikanti et al. section 5: for GPT-3, 5as/h = 80, so selective recompute drops 80 / (34 + 80) of it.
    sp = _bytes(tp=T, sequence_parallel=True)
    assert 1 - _bytes(tp=T, sequence_parallel=True, recompute=Recompute.SELECTIVE) / sp == pytest.approx(80 / 114, rel=1e-12)


def test_flash_attention_drops_the_quadratic_terms_and_gqa_shrinks_kv():
    llama = ModelConfig(name="l", hidden_size=8192, num_layers=80, num_heads=64, num_kv_heads=8, ffn_size=28672, vocab_size=128256)
    train = TrainConfig(seq_len=8192, global_batch=8)
    flash = activation_bytes_per_layer(llama, train, Layout(stack=stack_with("jax", attention=Attention.FLASH)))
    materialized = activation_bytes_per_layer(llama, train, Layout(stack=stack_with("jax", attention=Attention.MATERIALIZED)))
    assert materialized - flash > 0.9 * 2 * 64 * 8192 * 8192  # the fp32-free bf16 score matrix at least
    names = {t.name: t.bytes for t in activation_table(llama, train, Layout())}
    assert names["k"] == names["q"] / 8
    assert "attn_dropout_mask" not in names  # RMSNorm models train without dropout


def test_torchtitan_policies_sit_between_none_and_full():
    none, full = _bytes(), _bytes(recompute=Recompute.FULL)
    for policy in (Recompute.SELECTIVE_OP, Recompute.SELECTIVE_LAYER):
        assert full < _bytes(recompute=policy) < none


def test_lora_keeps_inputs_only_where_an_adapter_reads_them():
    m = ModelConfig(name="l", hidden_size=1024, num_layers=2, num_heads=16, num_kv_heads=4, ffn_size=2816, vocab_size=1000)
    materialized = Layout(stack=stack_with("jax", attention="materialized"))
    attn = {t.name for t in activation_table(m, TrainConfig(seq_len=S, workload="finetune-lora"), materialized)}
    both = {t.name for t in activation_table(m, TrainConfig(seq_len=S, workload="finetune-lora", lora={"targets": ["attn", "mlp"]}),
                                             materialized)}
    full = {t.name for t in activation_table(m, TrainConfig(seq_len=S), materialized)}
    assert full - attn == {"mlp_input", "mlp_down_input"}  # only weight gradients of frozen MLP matrices read them
    assert full <= both and {"lora_w_out_down_output", "lora_wq_down_output"} <= both
    assert {"mlp_norm_input", "mlp_up_output", "mlp_gate_output", "q", "k", "v"} <= attn  # the backward through frozen layers
    no_adapters_on_attn = TrainConfig(seq_len=S, workload="finetune-lora", lora={"targets": ["mlp"]})
    flash = {t.name for t in activation_table(m, no_adapters_on_attn, Layout(stack=stack_with("jax", attention="flash")))}
    assert "attn_out_proj_input" in flash and "qkv_input" not in flash  # the flash backward reads its output


def test_bitsandbytes_4bit_linears_keep_every_frozen_input():
    m = ModelConfig(name="l", hidden_size=1024, num_layers=2, num_heads=16, ffn_size=2752, vocab_size=1000)
    qv = {"rank": 8, "targets": "q,v"}
    lit, nf4 = Layout(stack=stack_with("lit-gpt")), TrainConfig(seq_len=S, workload="finetune-lora", lora=qv | {"frozen_dtype": "nf4"})
    int4 = TrainConfig(seq_len=S, workload="finetune-lora", lora=qv | {"frozen_dtype": "int4"})
    kept = sum(t.bytes for t in activation_table(m, nf4, lit))
    # MatMul4Bit keeps the MLP's input (h wide) and the down projection's input (ffn wide); q,v's adapters and the flash
    # backward already keep the qkv and output projections' inputs.
    assert kept - sum(t.bytes for t in activation_table(m, int4, lit)) == S * (1024 + 2752) * 2
    newer_bnb = Layout(stack=stack_with("lit-gpt", bnb_4bit_saves_input=False))
    assert sum(t.bytes for t in activation_table(m, nf4, newer_bnb)) == sum(t.bytes for t in activation_table(m, int4, lit))


def test_fp8_keeps_the_linear_inputs_in_one_byte():
    from costmodel.inputs.train_config import Precision

    m = ModelConfig(name="m", hidden_size=1024, num_layers=2, num_heads=16, num_kv_heads=4, ffn_size=4096, vocab_size=1000)
    bf16 = {t.name: t.bytes for t in activation_table(m, TrainConfig(seq_len=512), Layout())}
    fp8_train = TrainConfig(seq_len=512).with_precision(Precision.FP8)
    fp8 = {t.name: t.bytes for t in activation_table(m, fp8_train, Layout(stack=stack_with("megatron-core")))}
    assert {t.name: t.bytes for t in activation_table(m, fp8_train, Layout())} == bf16  # the JAX program keeps bf16 inputs
    halved = {n for n in bf16 if fp8[n] == bf16[n] / 2}
    assert halved == {"qkv_input", "attn_out_proj_input", "mlp_input", "mlp_down_input"}
    assert all(fp8[n] == bf16[n] for n in bf16.keys() - halved)  # norm inputs, q/k/v, MLP pre-activations: bf16


def test_fp8_lora_keeps_the_adapters_inputs_in_bf16_and_no_fp8_inputs_of_frozen_gemms():
    from costmodel.inputs.train_config import Precision

    m = ModelConfig(name="m", hidden_size=1024, num_layers=2, num_heads=16, ffn_size=4096, vocab_size=1000)
    te = Layout(stack=stack_with("megatron-core"))
    lora = TrainConfig(seq_len=512, workload="finetune-lora", lora={"frozen_dtype": "fp8"})
    fp8 = {t.name: t.bytes for t in activation_table(m, lora.with_precision(Precision.FP8), te)}
    assert fp8 == {t.name: t.bytes for t in activation_table(m, lora, te)}  # what LoRA keeps is bf16 either way
    assert fp8["qkv_input"] == 512 * 1024 * 2 and "mlp_input" not in fp8


def _per_token_unit(model, train, layout):
    """Bytes one layer keeps per token per hidden unit."""
    return sum(t.bytes for t in activation_table(model, train, layout)) / (train.seq_len * model.hidden_size)


def test_lit_gpt_eager_layer_keeps_what_its_pytorch_code_saves():
    h, f, r = 4096, 11008, 8  # Llama 2 7B, Lit-GPT's q,v adapters with dropout 0.05
    m = ModelConfig(name="l", hidden_size=h, num_layers=2, num_heads=32, ffn_size=f, vocab_size=1000)
    train = TrainConfig(seq_len=S, workload="finetune-lora", lora={"rank": r, "targets": "q,v", "dropout": 0.05})
    expected = (2  # norm_1 input (x * x keeps x)
                + 2 + 2 + 6  # roped copies of q and k, and the fused qkv output v is a view of
                + 32 * 4 / h  # the flash kernel's fp32 log-sum-exp per head
                + 2 + 2  # attention output (proj's input, a view of it), norm_2 input
                + 3 * 2 * f / h  # silu's input, silu's output and fc_2's output
                + 2 + 1  # the one dropout of the fused qkv LoRA layer: its output (A's input) and bool mask
                + 2 * r * 2 / h)  # each adapter's x·A
    assert _per_token_unit(m, train, Layout(stack=stack_with("lit-gpt"))) == pytest.approx(expected, rel=1e-12)
    assert _per_token_unit(m, train, Layout(stack=stack_with("pytorch-fsdp1"))) == pytest.approx(expected - 4 - 1, rel=1e-12)


def test_fused_qkv_views_with_grouped_kv_heads_copy_k_and_v_to_every_head():
    m = ModelConfig(name="l", hidden_size=1024, num_layers=2, num_heads=16, num_kv_heads=4, ffn_size=2816, vocab_size=1000)
    train = TrainConfig(seq_len=S, workload="finetune-lora")
    views = {t.name: t.bytes for t in activation_table(m, train, Layout(stack=stack_with("jax", fused_qkv_views=True)))}
    assert views["k"] == views["v"] == views["q"] == S * 1024 * 2 and "qkv_output" not in views


def test_only_an_eager_gated_mlp_keeps_its_activation_output():
    gated = ModelConfig(name="l", hidden_size=1024, num_layers=2, num_heads=16, ffn_size=2816, vocab_size=1000)
    gelu = ModelConfig(name="g", hidden_size=1024, num_layers=2, num_heads=16, ffn_size=2816, vocab_size=1000, mlp="gelu")
    for model, eager_extra in ((gated, S * 2816 * 2), (gelu, 0)):
        fused = sum(t.bytes for t in activation_table(model, TrainConfig(seq_len=S), Layout()))
        eager_layout = Layout(stack=stack_with("jax", fused_elementwise=False))
        eager = sum(t.bytes for t in activation_table(model, TrainConfig(seq_len=S), eager_layout))
        assert eager - fused == eager_extra


def test_each_separate_adapter_keeps_its_own_dropout():
    m = ModelConfig(name="l", hidden_size=1024, num_layers=2, num_heads=16, ffn_size=2816, vocab_size=1000)
    train = TrainConfig(seq_len=S, workload="finetune-lora", lora={"targets": "q,v,o", "dropout": 0.1})
    no_dropout = train.model_copy(update={"workload": train.workload.model_copy(
        update={"lora": train.workload.lora.model_copy(update={"dropout": 0.0})})})
    peft = Layout(stack=stack_with("jax", adapter_dropout_saved=True))
    # q and v each drop out the qkv input (2 x (2 + 1) bytes) and o its input (2 + 1), which the flash backward keeps
    # anyway; without the dropouts, q and v's A read the qkv input itself (2).
    extra = _per_token_unit(m, train, peft) - _per_token_unit(m, no_dropout, peft)
    assert extra == pytest.approx(2 * 3 + 3 - 2, rel=1e-12)
    assert _per_token_unit(m, train, Layout()) == _per_token_unit(m, no_dropout, Layout())  # the JAX program: unchanged

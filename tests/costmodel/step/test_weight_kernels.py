import pytest

from costmodel.errors import UnsupportedError
from costmodel.hardware.machine import train_machine
from costmodel.hardware.registry import load_hardware
from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import TrainConfig
from costmodel.step.inference import simulate_inference
from costmodel.step.kernels import KernelKind
from costmodel.step.weight_kernels import (
    CUDA_OLD_INSTRUCTIONS_PER_WEIGHT,
    CUDA_OLD_ROW_THRESHOLD,
    EXLLAMA_RECONSTRUCT_ROWS,
    gptq_linear_kernels,
)

D_IN, D_OUT = 5120, 13824
LLAMA2_13B = ModelConfig(name="llama2-13b", hidden_size=5120, num_layers=40, num_heads=40, ffn_size=13824, vocab_size=32000)


def _decode(kernel: str, *, batch: int = 1, weight_dtype: str = "int4") -> TrainConfig:
    return TrainConfig(workload="decode", global_batch=batch, seq_len=1024,
                       inference={"weight_dtype": weight_dtype, "weight_kernel": kernel, "serving_stack": "hf-eager"})


def test_cuda_old_reads_and_dequantizes_the_weights_again_for_every_row():
    one, four = (gptq_linear_kernels("up", rows=r, d_in=D_IN, d_out=D_OUT, train=_decode("autogptq-cuda-old")) for r in (1, 4))
    assert [k.name for k in one] == ["up_zero_fill", "up", "up_to_fp16"]
    gemv_1, gemv_4 = one[1], four[1]
    assert gemv_1.instructions == pytest.approx(D_IN * D_OUT * CUDA_OLD_INSTRUCTIONS_PER_WEIGHT)
    assert gemv_4.instructions == pytest.approx(4 * gemv_1.instructions)
    assert gemv_4.bytes - 4 * D_IN * D_OUT * 0.5 == pytest.approx(4 * (gemv_1.bytes - D_IN * D_OUT * 0.5))


def test_cuda_old_dequantizes_eagerly_into_a_16_bit_copy_from_its_row_threshold():
    kernels = gptq_linear_kernels("up", rows=CUDA_OLD_ROW_THRESHOLD, d_in=D_IN, d_out=D_OUT, train=_decode("autogptq-cuda-old"))
    dequant = [k for k in kernels if k.kind is KernelKind.MEMORY]
    assert len(dequant) == 5 and sum(k.bytes for k in dequant) == pytest.approx(16.5 * D_IN * D_OUT)
    (gemm,) = [k for k in kernels if k.kind is KernelKind.MATMUL]
    assert gemm.bytes >= 2 * D_IN * D_OUT and gemm.flops == 2 * CUDA_OLD_ROW_THRESHOLD * D_IN * D_OUT


def test_exllama_reconstructs_the_fp16_weight_from_eight_rows():
    below = gptq_linear_kernels("up", rows=EXLLAMA_RECONSTRUCT_ROWS - 1, d_in=D_IN, d_out=D_OUT, train=_decode("exllama"))
    at = gptq_linear_kernels("up", rows=EXLLAMA_RECONSTRUCT_ROWS, d_in=D_IN, d_out=D_OUT, train=_decode("exllama"))
    assert len(below) == 1 and below[0].instructions > 0
    assert [k.name for k in at] == ["up_reconstruct", "up"] and at[0].bytes == pytest.approx(2.5 * D_IN * D_OUT)
    assert at[1].instructions == 0


def test_the_fused_kernel_is_not_gptqs():
    with pytest.raises(ValueError, match="fused"):
        gptq_linear_kernels("up", rows=1, d_in=D_IN, d_out=D_OUT, train=_decode("fused"))


def _step(kernel: str, batch: int, hardware: str = "a100-80gb"):
    train = _decode(kernel, batch=batch).with_precision("fp16")
    return simulate_inference(LLAMA2_13B, train, Layout(), train_machine(load_hardware(hardware), train))


def test_gptq_kernels_cost_more_than_a_fused_one_where_they_re_read_or_copy_the_weights():
    fused, cuda_old, exllama = (_step(k, 16) for k in ("fused", "autogptq-cuda-old", "exllama"))
    assert cuda_old.time_per_output_token_s > exllama.time_per_output_token_s > fused.time_per_output_token_s
    # a 1k prompt is above both row thresholds: the dequantized copy's traffic is the whole difference
    assert cuda_old.time_to_first_token_s > exllama.time_to_first_token_s > fused.time_to_first_token_s


def test_a_part_without_an_issue_rate_refuses_the_per_row_kernels():
    with pytest.raises(UnsupportedError, match="no instruction issue rate"):
        _step("exllama", 1, hardware="l40s")

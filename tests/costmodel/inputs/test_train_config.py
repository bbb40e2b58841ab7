"""Tests `costmodel/inputs/train_config.py`: the precision recipes as dtype policies."""

import pytest
from pydantic import ValidationError

from costmodel.inputs.train_config import Dtype, Precision, TrainConfig


@pytest.mark.parametrize("precision, compute, linear_peak, other_peak", [
    ("fp32", "float32", "float32", "float32"),
    ("tf32", "float32", "tf32", "tf32"),
    ("bf16", "bfloat16", "bfloat16", "bfloat16"),
    ("fp16", "float16", "float16", "float16"),
    ("fp8", "bfloat16", "float8_e4m3fn", "bfloat16"),
])
def test_each_precision_sets_storage_and_the_peaks_its_gemms_run_at(precision, compute, linear_peak, other_peak):
    t = TrainConfig().with_precision(Precision(precision))
    assert (t.compute_dtype.value, t.linear_peak_dtype, t.matmul_peak_dtype) == (compute, linear_peak, other_peak)
    assert t.precision.value == precision  # the recipe reads back from the policy, as a plan JSON carries it


def test_fp32_and_tf32_keep_no_separate_compute_copy_and_fp32_gradients():
    for precision in (Precision.FP32, Precision.TF32):
        t = TrainConfig().with_precision(precision)
        assert t.compute_dtype is t.param_dtype is Dtype.FP32 and t.grad_dtype is Dtype.FP32 and not t.loss_scaled


def test_a_precision_survives_the_json_round_trip():
    t = TrainConfig(seq_len=128, global_batch=4).with_precision(Precision.FP8)
    back = TrainConfig.model_validate_json(t.model_dump_json())
    assert back == t and back.is_fp8 and Dtype.TF32.bytes == 4


def test_a_train_config_written_before_the_typed_workloads_still_loads():
    # As plan files before costmodel.workloads wrote it: the workload's name, its settings beside it.
    old = ('{"seq_len": 4096, "global_batch": 8, "workload": "decode", "lora": null, '
           '"inference": {"prompt_len": 100, "kv_block_size": 16, "max_token_latency_ms": null, "weight_dtype": "int8", '
           '"kv_cache_dtype": "fp8"}}')
    train = TrainConfig.model_validate_json(old)
    assert train.workload.kind == "decode" and train.workload.serving.weight_dtype.value == "int8" and train.prompt_len == 100
    assert TrainConfig.model_validate_json(train.model_dump_json()) == train
    lora = TrainConfig.model_validate_json('{"workload": "finetune-lora", "lora": {"rank": 8}, "inference": null}')
    assert lora.workload.lora.rank == 8 and not lora.workload.trains_base_weights


def test_settings_beside_a_workload_they_do_not_fit_are_refused():
    with pytest.raises(ValidationError, match="serving settings given for workload pretrain"):
        TrainConfig(workload="pretrain", inference={"prompt_len": 10})
    with pytest.raises(ValidationError, match="prompt_len=10 exceeds the context length 8"):
        TrainConfig(workload="prefill", seq_len=8, inference={"prompt_len": 10})


def test_pure_bf16_and_8bit_state_keep_weights_and_gradients_in_bf16():
    from costmodel.inputs.train_config import OptimizerState
    for state in ("bf16", "8bit"):
        t = TrainConfig(optimizer_state=state)
        assert (t.param_dtype, t.grad_dtype, t.compute_dtype) == (Dtype.BF16,) * 3
        assert TrainConfig.model_validate_json(t.model_dump_json()) == t
        # The precision recipe applied after the state keeps the pure-bf16 dtypes.
        assert t.with_precision(Precision.BF16).grad_dtype is Dtype.BF16
    assert TrainConfig(optimizer_state="8bit").moment_bytes_per_param == pytest.approx(2 * (1 + 4 / 2048), rel=1e-12)
    assert TrainConfig().moment_bytes_per_param == 8 and TrainConfig(optimizer_state="bf16").moment_bytes_per_param == 4
    back = TrainConfig().with_optimizer_state(OptimizerState.BF16).with_optimizer_state(OptimizerState.FP32)
    assert back == TrainConfig()
    assert TrainConfig().with_optimizer_state(OptimizerState.FP32, in_backward=True).param_dtype is Dtype.FP32


def test_a_16_bit_state_over_other_dtypes_is_refused():
    with pytest.raises(ValidationError, match="optimizer_state=bf16 keeps weights and gradients in bf16"):
        TrainConfig(optimizer_state="bf16", param_dtype="float32")
    from costmodel.errors import InvalidConfigError
    with pytest.raises(InvalidConfigError, match="8bit keeps the weights in bf16, not in the float32 compute dtype"):
        TrainConfig().with_precision(Precision.FP32).with_optimizer_state("8bit")

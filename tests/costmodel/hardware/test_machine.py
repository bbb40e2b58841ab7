"""Tests `costmodel/hardware/machine.py`: the peaks a precision runs at, and parts without them refused."""

import pytest

from costmodel.errors import InvalidConfigError
from costmodel.hardware.machine import check_peak, supported_precisions, train_machine
from costmodel.hardware.registry import load_hardware
from costmodel.inputs.train_config import Precision, TrainConfig


def _machine(hardware: str, precision: str):
    return train_machine(load_hardware(hardware), TrainConfig().with_precision(Precision(precision)))


def test_fp8_runs_linear_layers_at_the_fp8_peak_and_the_rest_at_bf16():
    m = _machine("h100-sxm", "fp8")
    assert m.linear_peak == pytest.approx(1978.9e12) and m.peak_flops_per_s == pytest.approx(989.4e12)


@pytest.mark.parametrize("hardware, precision, peak_tflops", [("t4", "fp32", 8.1), ("a100-80gb", "tf32", 156), ("v100", "fp16", 125)])
def test_one_peak_for_every_gemm_outside_fp8(hardware, precision, peak_tflops):
    m = _machine(hardware, precision)
    assert m.peak_flops_per_s == m.linear_peak == pytest.approx(peak_tflops * 1e12)


@pytest.mark.parametrize("hardware, precision, label", [("a100-80gb", "fp8", "float8"), ("v100", "tf32", "tf32"),
                                                        ("t4", "bf16", "bfloat16")])
def test_a_part_without_the_peak_is_refused_naming_the_parts_with_one(hardware, precision, label):
    with pytest.raises(InvalidConfigError, match=f"^{hardware} has no {label} peak; parts with one: ") as err:
        _machine(hardware, precision)
    assert "\n" not in str(err.value) and err.value.exit_code == 2
    if precision == "fp8":
        having = str(err.value).split("parts with one: ")[1].split(";")[0].split(", ")
        assert "h100-sxm" in having and "h200" in having and not any(p.startswith("a100") for p in having)


def test_supported_precisions_follow_the_catalog():
    assert [p.value for p in supported_precisions(load_hardware("a100-80gb"))] == ["fp32", "tf32", "bf16", "fp16"]
    assert [p.value for p in supported_precisions(load_hardware("tpu-v5p"))] == ["bf16"]
    check_peak(load_hardware("h200"), "float8_e4m3fn")  # has it: no error


def test_fp8_frozen_weights_are_refused_outside_the_fp8_recipe():
    lora = TrainConfig(workload="finetune-lora", lora={"frozen_dtype": "fp8"})
    assert train_machine(load_hardware("h100-sxm"), lora.with_precision(Precision.FP8)).linear_peak > 0
    with pytest.raises(InvalidConfigError, match="needs --precision fp8"):
        train_machine(load_hardware("h100-sxm"), lora)
    with pytest.raises(InvalidConfigError, match="no float8 peak"):  # the part is named before the storage
        train_machine(load_hardware("a100-80gb"), lora.with_precision(Precision.FP8))

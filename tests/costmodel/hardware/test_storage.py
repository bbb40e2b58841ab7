"""Tests `costmodel/hardware/storage.py`: storage rates scale with the job's devices, presets say where they come from."""

import pytest
from pydantic import ValidationError

from costmodel.hardware.profile import ClusterSpec
from costmodel.hardware.registry import load_hardware
from costmodel.hardware.storage import ASSUMED_SHARED_STORAGE, SUPERPOD_H100_STANDARD, StorageSpec


def test_a_scalable_unit_gets_the_superpod_guideline_and_four_units_four_times_it():
    assert SUPERPOD_H100_STANDARD.read_bytes_per_s(n_devices=256) == pytest.approx(40e9)
    assert SUPERPOD_H100_STANDARD.write_bytes_per_s(n_devices=4 * 256) == pytest.approx(4 * 20e9)


def test_every_profile_says_its_storage_rates_are_assumed():
    # The SuperPOD figure was recalled, not checked against NVIDIA's document: labelled as such.
    assert load_hardware("h100-sxm").storage == load_hardware("dgx-h100").storage == SUPERPOD_H100_STANDARD
    assert "SuperPOD" in SUPERPOD_H100_STANDARD.label() and "not checked" in SUPERPOD_H100_STANDARD.label()
    for name in ("h100-sxm", "a100-80gb", "tpu-v5p-pod", "cpu"):
        storage = load_hardware(name).storage
        assert storage.assumed and storage.label().startswith("assumed: ")


def test_a_cluster_file_without_storage_loads_with_the_labelled_assumption(tmp_path):
    data = load_hardware("h100-sxm").model_dump(mode="json", exclude={"storage"})
    path = tmp_path / "mine.json"
    path.write_text(ClusterSpec.model_validate(data | {"name": "mine"}).model_dump_json(exclude={"storage"}))
    assert load_hardware(str(path)).storage == ASSUMED_SHARED_STORAGE


def test_a_zero_storage_rate_is_refused():
    with pytest.raises(ValidationError):
        StorageSpec(read_bytes_per_s_per_device=0, write_bytes_per_s_per_device=1e9, assumed=True, source="x")

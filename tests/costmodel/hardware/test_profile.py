"""Tests `costmodel/hardware/profile.py`, `costmodel/hardware/catalog.py` and `costmodel/hardware/clusters.py`:
profiles, presets and loading."""

import json

import pytest

from costmodel.errors import InvalidConfigError, UnsupportedError
from costmodel.hardware.catalog import CATALOG
from costmodel.hardware.clusters import CLUSTERS, HARDWARE
from costmodel.hardware.machine import machine_for
from costmodel.hardware.profile import ClusterSpec
from costmodel.hardware.registry import list_hardware, load_hardware

REQUIRED = ["a100-40gb", "a100-80gb", "h100-sxm", "h200", "a40", "v100", "t4", "tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e",
            "cpu", "h100-96gb-hbm2e-500w", "h100-95gb-hbm2e-lowtdp"]


@pytest.mark.parametrize("name", REQUIRED)
def test_every_required_part_is_in_the_catalog_with_sources(name):
    cluster = load_hardware(name)
    assert cluster.device.hbm_bytes > 0 and cluster.device.hbm_bytes_per_s > 0
    assert cluster.device.source and cluster.intra_node.link.source and cluster.inter_node.source
    assert max(cluster.device.peak_flops_per_s.values()) > 0


def test_datasheet_numbers():
    a100, h100 = load_hardware("a100-80gb").device, load_hardware("h100-sxm").device
    assert a100.peak_for("bfloat16") == 312e12 and a100.hbm_bytes_per_s == 2039e9
    assert h100.peak_for("bfloat16") == pytest.approx(989.4e12) and h100.peak_for("float8_e4m3fn") == pytest.approx(1978.9e12)
    assert load_hardware("a100-80gb").inter_node.bytes_per_s_per_device(8) == 25e9  # 200 Gb/s NIC per GPU
    assert load_hardware("h100-sxm").inter_node.bytes_per_s_per_device(8) == 50e9  # 400 Gb/s
    assert load_hardware("t4").inter_node.bytes_per_s_per_device(4) == 100e9 / 8 / 4  # one 100 GbE per node of 4


def test_power_capped_part_differs_from_sxm():
    capped, sxm = load_hardware("h100-96gb-hbm2e-500w").device, load_hardware("h100-sxm").device
    assert capped.power_limit_w < sxm.power_limit_w
    assert capped.peak_for("bfloat16") < sxm.peak_for("bfloat16")
    assert capped.efficiency.matmul(1e12) < sxm.efficiency.matmul(1e12)


def test_missing_dtype_is_unsupported():
    with pytest.raises(UnsupportedError, match="v100 has no bfloat16"):
        load_hardware("v100").device.peak_for("bfloat16")


def test_unknown_name_lists_known_ones():
    with pytest.raises(InvalidConfigError, match="unknown hardware 'h900'; fix: did you mean 'h200'\\? Otherwise .*a100-80gb"):
        load_hardware("h900")
    assert list_hardware() == sorted(HARDWARE) == sorted([*CATALOG, *CLUSTERS])


def test_json_profile_round_trip_and_override(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(CATALOG["h100-sxm"].model_copy(update={"name": "mine"}).model_dump_json())
    cluster = load_hardware(str(path), devices_per_node=4)
    assert cluster.name == "mine" and cluster.devices_per_node == 4
    assert ClusterSpec.model_validate_json(cluster.model_dump_json()) == cluster


@pytest.mark.parametrize(("content", "message"), [("{", "Invalid JSON"), (json.dumps({"name": "x"}), "device")])
def test_malformed_profile(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(InvalidConfigError, match=message):
        load_hardware(str(path))


def test_devices_per_node_must_be_positive():
    with pytest.raises(InvalidConfigError, match="devices-per-node=0"):
        load_hardware("a100-80gb", devices_per_node=0)


@pytest.mark.parametrize("name", sorted(CLUSTERS))
def test_presets_load_and_cite_their_facts(name):
    cluster = load_hardware(name)
    assert cluster.name == name and len(cluster.description) > 100 and cluster.inter_node.source
    assert ClusterSpec.model_validate_json(cluster.model_dump_json()) == cluster
    dtype = "bfloat16" if "bfloat16" in cluster.device.peak_flops_per_s else "float16"  # V100 and T4 have no bf16
    assert machine_for(cluster, compute_dtype=dtype).inter.bytes_per_s > 0


@pytest.mark.parametrize(("preset", "part"), [("dgx-a100", "a100-80gb"), ("dgx-h100", "h100-sxm")])
def test_dgx_presets_give_the_numbers_of_the_parts_they_stand_behind(preset, part):
    assert machine_for(load_hardware(preset)).model_copy(update={"name": part}) == machine_for(load_hardware(part))


def test_preset_facts():
    h100, pcie, v5p = load_hardware("dgx-h100"), load_hardware("a100-pcie-server"), load_hardware("tpu-v5p-pod")
    assert (h100.inter_node.nics_per_node, h100.inter_node.nic_gbit_per_s, h100.inter_node.rail_optimized) == (8, 400, True)
    assert h100.intra_node.link.bytes_per_s == 450e9  # 900 GB/s bidirectional
    assert pcie.intra_node.kind == "nvlink-pairs" and pcie.inter_node.bytes_per_s_per_device(8) == 12.5e9  # 4 × 200 Gb/s / 8
    assert v5p.devices_per_node == 16 * 16 * 24 and v5p.wraparound
    assert v5p.inter_node.bytes_per_s_per_device(v5p.devices_per_node) == 50e9 / 8  # DCN 50 Gbps per chip


def test_devices_per_node_keeps_each_devices_share_of_the_nics():
    four = load_hardware("dgx-h100", devices_per_node=4)
    assert four.inter_node.nics_per_node == 4 and four.inter_tier() == load_hardware("dgx-h100").inter_tier()
    assert load_hardware("t4", devices_per_node=8).inter_node.nics_per_node == 2
    with pytest.raises(InvalidConfigError, match=r"would split t4's NICs \(1 per 4 devices\) unevenly; fix: give a multiple of 4"):
        load_hardware("t4", devices_per_node=2)

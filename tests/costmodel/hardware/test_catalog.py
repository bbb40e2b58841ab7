"""Tests `costmodel/hardware/catalog.py`: the 2026 parts (issue 40) load, with dense peaks in a sensible order,
cited figures, usable memory and the efficiencies they borrow; GB200 NVL72 is one 72-GPU NVLink domain."""

import pytest

from costmodel.hardware.catalog import CATALOG, NVLINK5, XGMI_MI300
from costmodel.hardware.fabric import IntraNodeKind
from costmodel.hardware.machine import supported_precisions
from costmodel.hardware.mesh import axis_links, parse_mesh
from costmodel.hardware.registry import load_hardware
from costmodel.inputs.train_config import Precision, TrainConfig
from planner.api import plan

NEW_PARTS = ("b200", "gb200", "mi300x", "mi325x", "l4", "l40s", "a10g", "rtx-4090", "rtx-a6000")
FP4 = "float4_e2m1fn"
# Dense TFLOP/s, from each datasheet's sparse figure halved (or its dense table), as the catalog cites them.
DENSE_BF16 = {"b200": 2250, "gb200": 2500, "mi300x": 1307.4, "mi325x": 1307.4, "l4": 121, "l40s": 362.05, "a10g": 125,
              "rtx-4090": 165.2, "rtx-a6000": 154.8}


@pytest.mark.parametrize("part", NEW_PARTS)
def test_each_new_part_loads_with_a_cited_source_and_usable_memory(part):
    device = load_hardware(part).device
    assert device.name == part and any(doc in device.source for doc in ("datasheet", "whitepaper"))
    assert "usable" in device.source
    # the driver's figure or an assumption said so; never above what the chips hold (B200: 192 GB on 8 stacks)
    assert 0.9 * device.hbm_bytes <= device.usable_bytes <= 1.1 * device.hbm_bytes
    assert device.reserve_bytes > 0


@pytest.mark.parametrize("part", NEW_PARTS)
def test_peaks_are_dense_and_ordered_fp4_fp8_bf16_tf32_fp32(part):
    peaks = load_hardware(part).device.peak_flops_per_s
    assert peaks["bfloat16"] == pytest.approx(DENSE_BF16[part] * 1e12)
    ladder = [peaks[d] for d in (FP4, "float8_e4m3fn", "bfloat16", "tf32", "float32") if d in peaks]
    assert ladder == sorted(ladder, reverse=True)


def test_fp4_peaks_are_listed_where_published_but_no_precision_runs_them():
    with_fp4 = sorted(c.device.name for c in CATALOG.values() if FP4 in c.device.peak_flops_per_s)
    assert with_fp4 == ["b200", "gb200"]
    assert load_hardware("b200").device.peak_flops_per_s[FP4] == 2 * load_hardware("b200").device.peak_flops_per_s["float8_e4m3fn"]
    base = TrainConfig()
    assert all(FP4 not in {base.with_precision(p).matmul_peak_dtype, base.with_precision(p).linear_peak_dtype} for p in Precision)
    assert [p.value for p in supported_precisions(load_hardware("b200"))][-1] == "fp8"


def test_new_parts_borrow_the_nearest_calibrated_parts_efficiencies():
    h100, a100 = CATALOG["h100-sxm"].device.efficiency, CATALOG["a100-80gb"].device.efficiency
    for part in ("b200", "gb200"):
        assert CATALOG[part].device.efficiency == h100 and "H100's calibrated" in CATALOG[part].device.source
    for part in ("l4", "l40s", "a10g", "rtx-a6000"):
        assert CATALOG[part].device.efficiency == a100 and "A100's calibrated" in CATALOG[part].device.source
    # The RTX 4090's GEMMs and bandwidth are measured (published benchmarks); only the A100's calibration carries over.
    rtx = CATALOG["rtx-4090"].device
    assert rtx.efficiency != a100 and "gemm_benchmarks.csv" in rtx.source and rtx.efficiency.flash_attention == a100.flash_attention


def test_node_fabrics_of_the_new_parts():
    kinds = {part: load_hardware(part).intra_node.kind for part in NEW_PARTS}
    assert kinds["b200"] is kinds["gb200"] is IntraNodeKind.NVSWITCH
    assert kinds["mi300x"] is kinds["mi325x"] is IntraNodeKind.XGMI_MESH
    assert {kinds[p] for p in ("l4", "l40s", "a10g", "rtx-4090")} == {IntraNodeKind.PCIE}
    assert kinds["rtx-a6000"] is IntraNodeKind.NVLINK_PAIRS and load_hardware("rtx-a6000").intra_node.pair_link.bytes_per_s == 56.25e9
    assert load_hardware("b200").intra_node.link == NVLINK5 and NVLINK5.bytes_per_s == 900e9  # 1.8 TB/s bidirectional
    assert XGMI_MI300.bytes_per_s == 7 * 64e9  # 7 links of 128 GB/s bidirectional
    assert "xGMI mesh (xgmi-mi300)" in load_hardware("mi300x").summary()


def test_gb200_nvl72_is_one_72_gpu_nvlink_domain_per_rack():
    rack = load_hardware("gb200-nvl72")
    assert rack.devices_per_node == 72 and rack.device == load_hardware("gb200").device
    assert rack.intra_tier() == load_hardware("gb200").intra_tier() and rack.inter_tier() == load_hardware("gb200").inter_tier()
    links = axis_links(parse_mesh("data=2,expert=9,tensor=8"), rack)
    assert links["tensor"].tiers == links["expert"].tiers == ("nvlink5",)
    assert links["data"].tiers == ("ib-ndr400",) and links["data"].nodes_per_group == 2


def test_dgx_b200_preset_gives_the_b200_profiles_numbers():
    preset, part = load_hardware("dgx-b200"), load_hardware("b200")
    assert preset.device == part.device and preset.intra_tier() == part.intra_tier() and preset.inter_tier() == part.inter_tier()
    assert "DGX B200 User Guide" in preset.description


def test_a_moe_plan_on_two_gb200_nvl72_racks_keeps_expert_and_tensor_axes_in_a_rack():
    p = plan("mixtral-8x7b", devices=144, hardware="gb200-nvl72")
    axes = {a.parallelism: a for a in p.mesh}
    assert p.layout.n_devices == 144 and p.layout.ep > 1 and p.layout.tp * p.layout.ep <= 72
    assert all(axes[k].links == ("nvlink5",) and axes[k].nodes_spanned == 1 for k in ("tp", "ep") if k in axes)
    assert axes["dp"].links == ("nvlink5", "ib-ndr400") and axes["dp"].nodes_spanned == 2


def test_the_rtx_4090_gemm_curve_is_the_published_medians():
    import csv
    import statistics
    from pathlib import Path

    from costmodel.hardware.catalog import _RTX4090_MICROBENCH

    data = Path(__file__).resolve().parents[3] / "benchmarks" / "data" / "gemm_benchmarks.csv"
    by_size: dict[int, list[float]] = {}
    for r in csv.DictReader(data.open()):
        if r["hardware"] == "rtx-4090" and r["kernel"] == "gemm" and r["m"] and r["m"] == r["n"] == r["k"]:
            n = int(r["m"])
            if n & (n - 1) == 0 and n >= 512:  # the aligned sizes training shapes have
                by_size.setdefault(n, []).append(float(r["measured_value"]) / 165.2)
    for n, effs in by_size.items():
        assert _RTX4090_MICROBENCH.matmul(2 * n**3) == pytest.approx(min(statistics.median(effs), 0.97), abs=0.06), n


def test_the_v6e_gemm_plateau_is_the_published_device_time_measurement():
    v6e = CATALOG["tpu-v6e"].device
    assert v6e.efficiency.matmul(2 * 8192**3) == pytest.approx(0.79, abs=0.005)  # 1510.9 µs of device time at 8192³
    assert v6e.efficiency.matmul(1e9) < v6e.efficiency.matmul(1e11) < v6e.efficiency.matmul(1e13) == pytest.approx(0.79)
    assert "gpu-tpu-pedia" in v6e.source and CATALOG["tpu-v5p"].device.efficiency.matmul(1e13) == pytest.approx(0.85)


def test_the_mi300x_takes_its_measured_fraction_of_the_h100s_gemm_rate_and_its_own_stream_bandwidth():
    from costmodel.hardware.catalog import MI300X_GEMM_FRACTION_OF_H100

    h100, mi300x = CATALOG["h100-sxm"].device.efficiency, CATALOG["mi300x"].device.efficiency
    for flops in (1e9, 1e11, 1e13):
        assert mi300x.matmul(flops) == pytest.approx(MI300X_GEMM_FRACTION_OF_H100 * h100.matmul(flops))
    # 668.4 of 1307.4 TF against the H100's 794.5 of 989.4 (the same size sweep of torch.matmul)
    assert MI300X_GEMM_FRACTION_OF_H100 == pytest.approx((668.4 / 1307.4) / (794.5 / 989.4), abs=0.01)
    assert mi300x.hbm == pytest.approx(4.09 / 5.3, abs=0.005) and mi300x.gemm_hbm < mi300x.hbm
    assert CATALOG["mi325x"].device.efficiency == mi300x and "measured" in CATALOG["mi300x"].device.source

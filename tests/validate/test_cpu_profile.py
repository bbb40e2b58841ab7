"""Tests `validate/cpu_profile.py`: the micro-benchmarks give a sane profile, cached atomically."""

from validate.cpu_profile import CpuMeasurement, cached_measurement, cpu_cluster


def test_measured_profile_is_sane_and_cached(tmp_path):
    cache = tmp_path / "cpu.json"
    measured = cached_measurement(cache=cache)
    assert cache.is_file() and cached_measurement(cache=cache) == measured
    flops = [f for f, _ in measured.matmul_flops_per_s]
    assert flops == sorted(flops) and all(1e8 < rate < 1e13 for _, rate in measured.matmul_flops_per_s)
    assert 1e8 < measured.memory_bytes_per_s < 1e12 and 0 < measured.kernel_floor_s < 0.01


def test_emulated_devices_share_the_host():
    measured = CpuMeasurement(matmul_flops_per_s=((1e6, 1e9), (1e9, 8e10)), memory_bytes_per_s=1.6e10, kernel_floor_s=1e-5)
    one, eight = cpu_cluster(measured, n_devices=1), cpu_cluster(measured, n_devices=8)
    assert one.device.peak_flops_per_s["float32"] == 8 * eight.device.peak_flops_per_s["float32"] == 8e10
    assert eight.intra_node.bytes_per_s == eight.device.hbm_bytes_per_s == 2e9
    assert one.device.efficiency.matmul(1e6) < one.device.efficiency.matmul(1e9) == 1.0

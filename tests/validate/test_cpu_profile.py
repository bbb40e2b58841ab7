"""Tests `validate/cpu_profile.py`: the micro-benchmarks give a sane profile, cached per device count."""

import json

from validate import cpu_profile
from validate.cpu_profile import CpuMeasurement, cached_measurement, cpu_clock, cpu_cluster, host_name, other_cpu_share


def _fake(n_devices: int, peak: float = 8e10) -> CpuMeasurement:
    return CpuMeasurement(n_devices=n_devices, matmul_flops_per_s=((1e6, peak / 4), (1e9, peak)), memory_kernel_bytes_per_s=4e9,
                          first_touch_s_per_byte=1e-9, transpose_s_per_byte=1e-10, fused_transpose_s_per_byte=1e-9, kernel_floor_s=1e-6,
                          link_bytes_per_s=1e9, link_latency_s=1e-5, load_average=0.3,
                          other_cpu_share=0.0, host=host_name(), jax_version=cpu_profile.version("jax"))


def test_two_devices_measure_sane_numbers_and_are_cached(tmp_path):
    cache = tmp_path / "cpu.json"
    measured = cached_measurement(2, cache=cache)
    assert measured.n_devices == 2 and json.loads(cache.read_text()).keys() == {"2"}
    assert cached_measurement(2, cache=cache) == measured  # from the cache: a new measurement would differ
    flops = [f for f, _ in measured.matmul_flops_per_s]
    assert flops == sorted(flops) and all(1e8 < rate < 1e13 for _, rate in measured.matmul_flops_per_s)
    assert 1e7 < measured.memory_kernel_bytes_per_s < 1e12 and 1e7 < measured.link_bytes_per_s < 1e12
    assert 0 <= measured.kernel_floor_s < 1e-3 and 0 <= measured.link_latency_s < 1e-2
    assert 0 <= measured.first_touch_s_per_byte < 1e-7  # faulting in 1 GB takes well under 100 s
    # A transposing copy streams its bytes at ~0.1-30 GB/s per device; fusing a ReLU's backward into it makes it slower, not faster.
    assert 0 <= measured.transpose_s_per_byte < measured.fused_transpose_s_per_byte < 1e-7
    assert measured.other_cpu_share is None or 0 <= measured.other_cpu_share <= 1


def test_each_device_count_has_its_entry_and_recalibrate_replaces_it(tmp_path, monkeypatch):
    cache = tmp_path / "cpu.json"
    cache.write_text('{"matmul_flops_per_s": [], "memory_bytes_per_s": 1}')  # an older format: ignored
    peaks = iter([1e10, 2e10, 3e10, 4e10])
    monkeypatch.setattr(cpu_profile, "measure_in_subprocess", lambda n: _fake(n, next(peaks)))
    one, eight = cached_measurement(1, cache=cache), cached_measurement(8, cache=cache)
    assert (one.peak_flops_per_s, eight.peak_flops_per_s) == (1e10, 2e10) == (cached_measurement(1, cache=cache).peak_flops_per_s, 2e10)
    assert cached_measurement(1, cache=cache, recalibrate=True).peak_flops_per_s == 3e10
    assert sorted(json.loads(cache.read_text())) == ["1", "8"]
    entries = json.loads(cache.read_text())
    del entries["8"]["first_touch_s_per_byte"]  # measured before that benchmark existed: measured again
    cache.write_text(json.dumps(entries))
    assert cached_measurement(8, cache=cache).peak_flops_per_s == 4e10


def test_cluster_holds_one_device_of_n():
    cluster = cpu_cluster(_fake(8))
    assert cluster.devices_per_node == 8 and cluster.device.peak_flops_per_s == {"float32": 8e10}
    assert cluster.device.efficiency.matmul(1e6) == 0.25 and cluster.device.efficiency.matmul(1e9) == 1.0
    assert (cluster.device.hbm_bytes_per_s, cluster.intra_node.link.bytes_per_s, cluster.intra_node.link.latency_s) == (4e9, 1e9, 1e-5)
    assert cluster.device.step_allocator.first_touch_s_per_byte == 1e-9 and cluster.device.step_allocator.fresh_above_bytes == 32 * 2**20
    assert (cluster.device.gradient_transpose.plain_s_per_byte, cluster.device.gradient_transpose.fused_s_per_byte) == (1e-10, 1e-9)


def test_other_cpu_share_is_a_fraction():
    share = other_cpu_share(cpu_clock(), (sum(range(10**6)), cpu_clock())[1])
    assert share is None or 0 <= share <= 1

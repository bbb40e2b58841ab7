"""The ``cpu`` hardware profile, measured on this host by micro-benchmarks the project runs itself.

The catalog's ``cpu`` entry holds placeholders; a timed validation on emulated CPU devices
needs what this host really does. Measured here, with JAX, medians of repeats:

- matmul FLOP/s of square float32 GEMMs from 128 to 1024 (the largest gives the peak,
  the others the efficiency curve for small GEMMs),
- memory bandwidth of a streaming elementwise op (bytes read + written per second),
- the per-kernel floor (a tiny op's time).

N emulated devices are threads of one process on the same cores: they share its compute and
its memory bandwidth, so one device of N gets 1/N of each (`cpu_cluster`). Transfers
between emulated devices are memory copies: the link tier runs at the per-device memory
bandwidth. Results are cached in ``~/.cache/jax-parallel-planner/cpu_profile.json``.

>>> m = CpuMeasurement(matmul_flops_per_s=((1e6, 2e9), (1e9, 4e10)), memory_bytes_per_s=8e9, kernel_floor_s=2e-5)
>>> c = cpu_cluster(m, n_devices=4)
>>> c.device.peak_flops_per_s["float32"], c.device.hbm_bytes_per_s, c.devices_per_node
(10000000000.0, 2000000000.0, 4)
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from costmodel.hardware import ClusterSpec, DeviceKind, DeviceSpec, LinkSpec
from costmodel.roofline import Efficiency

CACHE = Path.home() / ".cache" / "jax-parallel-planner" / "cpu_profile.json"
_GIB = 2**30


class CpuMeasurement(BaseModel):
    """What the micro-benchmarks measured on the whole host (all cores, one process)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    matmul_flops_per_s: tuple[tuple[float, float], ...] = Field(description="(FLOPs of the GEMM, FLOP/s reached), ascending.")
    memory_bytes_per_s: float = Field(description="Streaming elementwise bandwidth, read + write.")
    kernel_floor_s: float = Field(description="Time of a tiny jitted op.")


def _median_s(fn, *args, repeats: int = 7) -> float:
    fn(*args).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args).block_until_ready()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure() -> CpuMeasurement:
    """Run the micro-benchmarks on this process's first device (a few seconds)."""
    import jax
    import jax.numpy as jnp

    matmul = jax.jit(jnp.dot)
    curve = []
    for n in (128, 256, 512, 1024):
        a = jnp.ones((n, n), jnp.float32)
        flops = 2.0 * n**3
        curve.append((flops, flops / _median_s(matmul, a, a)))
    x = jnp.ones((32 * 2**20,), jnp.float32)
    stream = jax.jit(lambda v: v * 1.0001 + 1.0)
    memory = 2 * x.nbytes / _median_s(stream, x)
    tiny = jnp.ones((8,), jnp.float32)
    floor = _median_s(jax.jit(lambda v: v + 1.0), tiny, repeats=51)
    return CpuMeasurement(matmul_flops_per_s=tuple(curve), memory_bytes_per_s=memory, kernel_floor_s=floor)


def cached_measurement(*, recalibrate: bool = False, cache: Path = CACHE) -> CpuMeasurement:
    """The cached measurement, or a fresh one (then cached) when absent or asked for."""
    if cache.is_file() and not recalibrate:
        return CpuMeasurement.model_validate_json(cache.read_text())
    measured = measure()
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(".tmp")
    tmp.write_text(measured.model_dump_json())
    tmp.replace(cache)
    return measured


def cpu_cluster(measured: CpuMeasurement, *, n_devices: int) -> ClusterSpec:
    """The ``cpu`` profile for ``n_devices`` emulated devices sharing the host measured."""
    peak = max(rate for _, rate in measured.matmul_flops_per_s)
    curve = tuple((flops, min(1.0, rate / peak)) for flops, rate in measured.matmul_flops_per_s)
    per_device_memory = measured.memory_bytes_per_s / n_devices
    device = DeviceSpec(
        name="cpu", kind=DeviceKind.CPU, peak_flops_per_s={"float32": peak / n_devices},
        hbm_bytes=16 * _GIB, hbm_bytes_per_s=per_device_memory,
        # Nothing is fused into a flash kernel here: attention runs as its matmuls.
        efficiency=Efficiency(matmul_curve=curve, flash_attention=1.0, hbm=1.0, kernel_floor_s=measured.kernel_floor_s),
        source=f"validate.cpu_profile micro-benchmarks on this host, shared by {n_devices} emulated devices",
    )
    link = LinkSpec(name="shared-memory", bytes_per_s=per_device_memory, latency_s=measured.kernel_floor_s, efficiency=1.0,
                    source="emulated devices copy through the host's memory")
    return ClusterSpec(name="cpu", device=device, devices_per_node=n_devices, intra_node=link, inter_node=link)

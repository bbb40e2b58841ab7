"""The ``cpu`` hardware profile, measured on this host by micro-benchmarks the project runs itself.

The catalog's ``cpu`` entry holds placeholders; a timed check on emulated CPU devices needs
what this host really does. `measure` runs every benchmark with JAX on all ``n_devices``
emulated devices at once (one GEMM, stream or collective per device, sharded over a 1-D
mesh), inside compiled loops where a call's dispatch would otherwise count, and keeps the
median of repeats:

- GEMM FLOP/s of square float32 GEMMs from 128 to 1024, each size timed as the three GEMMs
  a training step runs per weight (forward ``A·B``, input gradient ``G·Bᵀ``, weight
  gradient ``Aᵀ·G``; the simulator costs a backward as two GEMMs of the forward's size).
  The largest gives the peak, the others the efficiency curve for small GEMMs.
- The bandwidth of a memory-bound kernel: a fused layer norm (two reductions over rows of
  1024 plus elementwise work) over 64 MB per device, in place in a compiled loop, far
  beyond the 32 MB last-level cache (bytes read + written per second). A step's
  memory-bound kernels are norms, softmax, activations and the optimizer; on this CPU
  they are limited by their arithmetic (vector reductions, rsqrt, exp) more than by the
  memory: a plain ``a·x + b`` streamed at ~40 GB/s on one device, the layer norm at
  ~10 GB/s and a softmax alike; with eight devices at once ~6 and ~1.5 GB/s each.
- The first touch of freshly mapped memory: ``a·x + b`` writing a new 64 MB buffer per
  call, less the same in place, per byte written. XLA's CPU runtime allocates a device's
  step temporaries anew each step, and a large allocation is freshly mapped memory whose
  every page the kernel faults in and zeroes. Counted with ``getrusage`` minor faults, the
  1-device benchmark GPT faulted exactly its 149 MiB of temporaries per step; 8 devices
  with 35 MiB each faulted 8 × 35 MiB; 8 devices with 22 MiB or 16 MiB each faulted
  nothing, as glibc's malloc reuses freed memory below its mmap threshold (at most 32 MiB).
  `costmodel.hardware.profile.StepAllocator` carries both numbers to the simulator.
- The per-kernel floor: one iteration of a compiled loop around a tiny (8×8) GEMM.
- The link tier: a ``psum`` over the ``n_devices`` inside a compiled loop, of a few floats
  (latency) and of 4 MB per device (bandwidth, by the simulator's own ring formula).

Why one measurement per device count rather than the host's throughput / N: emulated
devices are threads of one process on the same cores, so N devices share its compute, but
how well depends on the size. Measured here (2 cores, quiet): one device reached
~190 GFLOP/s on 1024-GEMMs but only ~90 on 128-GEMMs (two threads on a small GEMM);
eight concurrent devices reached ~21 GFLOP/s each at every size from 128 to 1024 (~170
for the host). So one device's small GEMMs are inefficient where eight devices' are not,
and `cpu_cluster` takes the per-device numbers measured with all N devices busy. float32
only: bf16 GEMMs were no faster on this CPU (160–185 GFLOP/s against ~200 at 1024–2048),
so the timed check computes in float32 and the profile has no bf16 peak
(`DeviceSpec.peak_for` says so if asked).

Measurements are cached per device count in ``~/.cache/jax-parallel-planner/cpu_profile.json``
(another host or JAX version re-measures; ``recalibrate=True`` forces it).

>>> m = CpuMeasurement(n_devices=4, matmul_flops_per_s=((1e6, 2e9), (1e9, 4e10)), memory_kernel_bytes_per_s=2e9,
...                    first_touch_s_per_byte=1e-9, transpose_s_per_byte=1e-10, fused_transpose_s_per_byte=1e-9,
...                    kernel_floor_s=2e-6, link_bytes_per_s=1e9, link_latency_s=1e-5, load_average=0.5, other_cpu_share=0.0,
...                    host="x", jax_version="0")
>>> c = cpu_cluster(m)
>>> c.device.peak_flops_per_s["float32"], c.device.hbm_bytes_per_s, c.devices_per_node, c.intra_node.link.bytes_per_s
(40000000000.0, 2000000000.0, 4, 1000000000.0)
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec
from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, PositiveFloat, PositiveInt, ValidationError

from costmodel.hardware.fabric import IntraNodeFabric, IntraNodeKind, LinkSpec, host_network
from costmodel.hardware.profile import ClusterSpec, DeviceKind, DeviceSpec, GradientTranspose, StepAllocator
from costmodel.step.roofline import Efficiency
from validate.emulated import run_emulated

CACHE = Path.home() / ".cache" / "jax-parallel-planner" / "cpu_profile.json"
GEMM_SIZES = (128, 256, 512, 1024)
_GIB = 2**30
_GEMM_HOST_FLOPS = 8e9  # the host's work per timed GEMM call: tens of ms, so dispatch (~0.1 ms on 8 devices) is noise
_STREAM_BYTES = 64 * 2**20  # per device, read, and as much written: above the last-level cache and glibc's mmap threshold
_MMAP_THRESHOLD_MAX_BYTES = 32 * 2**20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit hosts
_LINK_BYTES = 4 * 2**20  # per device
_REPEATS = 7
_TRANSPOSE_TOKENS = 1024  # over the host: the timed check's GPT runs 8 × 128 tokens per step
_TRANSPOSE_REPEATS = 15  # the differences are a few ms: more repeats than elsewhere


class CpuMeasurement(BaseModel):
    """What the micro-benchmarks measured for one device while all ``n_devices`` ran at once."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n_devices: PositiveInt = Field(description="Emulated devices running the benchmarks concurrently.")
    matmul_flops_per_s: tuple[tuple[PositiveFloat, PositiveFloat], ...] = Field(
        description="(FLOPs of one device's GEMM, FLOP/s one device reached over forward + both gradient GEMMs), ascending.")
    memory_kernel_bytes_per_s: PositiveFloat = Field(description="One device's bandwidth in a fused layer norm, read + write, all at once.")
    first_touch_s_per_byte: NonNegativeFloat = Field(description="One device's seconds per byte to fault in fresh memory, all at once.")
    transpose_s_per_byte: NonNegativeFloat = Field(
        description="One device's seconds per cotangent byte a weight gradient spends beyond its GEMM (a transposing copy), all at once.")
    fused_transpose_s_per_byte: NonNegativeFloat = Field(
        description="The same with a ReLU's backward fused into the transposing copy.")
    kernel_floor_s: NonNegativeFloat = Field(description="Seconds per iteration of a compiled loop around a tiny GEMM.")
    link_bytes_per_s: PositiveFloat = Field(description="psum ring bandwidth per device (the memory-kernel bandwidth for 1 device).")
    link_latency_s: NonNegativeFloat = Field(description="Per-step latency (alpha) of the psum ring (0 for 1 device).")
    load_average: NonNegativeFloat = Field(description="1-minute load average when the benchmarks ended (this process included).")
    other_cpu_share: NonNegativeFloat | None = Field(
        description="Share of the host's cores other processes kept busy meanwhile (/proc/stat; None where unreadable).")
    host: str = Field(description="Processor and core count the numbers belong to.")
    jax_version: str = Field(description="jax version the numbers were measured with.")

    @property
    def peak_flops_per_s(self) -> float:
        return max(rate for _, rate in self.matmul_flops_per_s)


def host_name() -> str:
    """What identifies this host's compute for the cache."""
    return f"{platform.machine()} {platform.processor() or platform.system()}, {os.cpu_count()} cores"


def cpu_clock() -> tuple[float, float, float]:
    """(wall seconds, seconds the host's cores were busy, seconds this process ran): two
    readings give `other_cpu_share`. Busy time is NaN where ``/proc/stat`` is unreadable."""
    try:
        ticks = [float(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        busy_s = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait; steal counts
    except (OSError, ValueError, IndexError):
        busy_s = float("nan")
    return time.perf_counter(), busy_s, time.process_time()


def other_cpu_share(start: tuple[float, float, float], end: tuple[float, float, float]) -> float | None:
    """Share of the host's cores busy with other processes (or other VMs) between two `cpu_clock` readings."""
    wall_s, busy_s, own_s = (b - a for a, b in zip(start, end))
    if busy_s != busy_s or wall_s <= 0:
        return None
    return max(0.0, busy_s - own_s) / (wall_s * (os.cpu_count() or 1))


def _median_s(fn: Callable[..., Any], *args: Any, repeats: int = _REPEATS) -> float:

    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _per_iteration_s(make_loop: Callable[[int], Callable[..., Any]], x: Any, *, iterations: tuple[int, int]) -> float:
    """Seconds per iteration of the compiled loop ``make_loop(k)`` runs on ``x`` (k
    iterations), the call's fixed cost (dispatch to every device) cancelled."""
    few, many = iterations
    return max(0.0, (_median_s(make_loop(many), x) - _median_s(make_loop(few), x)) / (many - few))


def _gemm_curve(per_device: Callable[..., Any], n_devices: int) -> list[tuple[float, float]]:

    contractions = (((2,), (1,)), ((2,), (2,)), ((1,), (1,)))  # A·B, G·Bᵀ, Aᵀ·G; b = 1/n keeps x at ones

    @jax.jit
    def gemms(x: jax.Array, b: jax.Array, k: jax.Array) -> jax.Array:
        def body(_: Any, x: jax.Array) -> jax.Array:
            for contract in contractions:
                x = jax.lax.dot_general(x, b, (contract, ((0,), (0,))))
            return x
        return jax.lax.fori_loop(0, k, body, x)

    curve = []
    for n in GEMM_SIZES:
        flops = 2.0 * n**3
        k = max(1, round(_GEMM_HOST_FLOPS / (3 * flops * n_devices)))
        seconds = _median_s(gemms, per_device(n, n), per_device(n, n, value=1 / n), k, repeats=5 if k == 1 else _REPEATS)
        curve.append((flops, 3 * k * flops / seconds))
    return curve


def _link(per_device: Callable[..., Any], mesh: Any, n_devices: int) -> tuple[float, float]:
    """(bandwidth, latency) of the psum ring, inverting the simulator's 2(n−1)(S/(n·bw) + α)."""

    def psums(k: int) -> Callable[..., Any]:
        loop = lambda v: jax.lax.fori_loop(0, k, lambda _, v: jax.lax.pcast(jax.lax.psum(v, "d"), ("d",), to="varying"), v)  # noqa: E731
        return jax.jit(jax.shard_map(loop, mesh=mesh, in_specs=PartitionSpec("d"), out_specs=PartitionSpec("d")))

    steps = 2 * (n_devices - 1)
    small_s = _per_iteration_s(psums, per_device(8, value=0.0), iterations=(20, 220))
    large_s = _per_iteration_s(psums, per_device(_LINK_BYTES // 4, value=0.0), iterations=(2, 12))
    return steps / n_devices * _LINK_BYTES / max(large_s - small_s, 1e-9), small_s / steps


def _gradient_transpose(mesh: Any, n_devices: int) -> tuple[float, float]:
    """Seconds per cotangent byte a weight gradient ``xᵀ·g`` costs beyond the same GEMM on
    2-D operands, with ``g`` as it lies and with a ReLU's backward producing it: XLA's CPU
    backend copies ``g`` transposed (`costmodel.hardware.profile.GradientTranspose`). Per device
    x: [tokens, 256], g: [tokens, 1024] with 4 Mi tokens·features over the host, as JAX's
    transpose rule emits it for a ``[batch, seq, features]`` layer."""

    tokens, width, features = max(1, _TRANSPOSE_TOKENS // n_devices), 256, 1024
    cotangent_bytes = tokens * features * 4

    def local(fn: Callable[..., jax.Array]) -> Callable[..., jax.Array]:  # each device runs fn on its own block
        return jax.jit(jax.shard_map(lambda *blocks: fn(*(b[0] for b in blocks))[None], mesh=mesh,
                                     in_specs=PartitionSpec("d"), out_specs=PartitionSpec("d")))

    def weight_gradient(g_1xTxF: jax.Array, x_1xTxD: jax.Array) -> jax.Array:
        _, vjp = jax.vjp(lambda w: jnp.einsum("bsd,df->bsf", x_1xTxD, w), jnp.zeros((width, features), jnp.float32))
        return vjp(g_1xTxF)[0]

    def block(shape: tuple[int, ...], seed: int) -> jax.Array:
        values = jax.random.normal(jax.random.key(seed), (n_devices, *shape), jnp.float32)
        return jax.device_put(values, NamedSharding(mesh, PartitionSpec("d")))

    pre_1xTxF, g_1xTxF, x_1xTxD = block((1, tokens, features), 1), block((1, tokens, features), 2), block((1, tokens, width), 3)
    gemm_s = _median_s(local(lambda g, x: jnp.einsum("td,tf->df", x[0], g[0])), g_1xTxF, x_1xTxD, repeats=_TRANSPOSE_REPEATS)
    plain_s = _median_s(local(weight_gradient), g_1xTxF, x_1xTxD, repeats=_TRANSPOSE_REPEATS)
    fused_s = _median_s(local(lambda pre, g, x: weight_gradient(jnp.where(pre > 0, g, 0.0), x)), pre_1xTxF, g_1xTxF, x_1xTxD,
                        repeats=_TRANSPOSE_REPEATS)
    return max(0.0, plain_s - gemm_s) / cotangent_bytes, max(0.0, fused_s - gemm_s) / cotangent_bytes


def _layer_norm(x: Any) -> Any:

    centred = x - x.mean(-1, keepdims=True)
    return centred * jax.lax.rsqrt((centred * centred).mean(-1, keepdims=True) + 1e-5) * 1.0001


def measure(n_devices: int) -> CpuMeasurement:
    """Run the micro-benchmarks on this process's first ``n_devices`` devices, all at once
    (about 5 s for one device, 10 s for eight)."""

    start = cpu_clock()
    mesh = jax.make_mesh((n_devices,), ("d",), devices=jax.devices()[:n_devices])
    split = NamedSharding(mesh, PartitionSpec("d"))

    def per_device(*shape: int, value: float = 1.0) -> jax.Array:
        return jax.device_put(jnp.full((n_devices, *shape), value, jnp.float32), split)

    curve = _gemm_curve(per_device, n_devices)
    streamed = per_device(_STREAM_BYTES // 4 // 1024, 1024)
    axpy = lambda v: v * 1.0001 + 1.0  # noqa: E731
    fresh_s = _median_s(jax.jit(axpy, out_shardings=split), streamed)

    def in_place(kernel: Callable[[jax.Array], jax.Array]) -> Callable[[int], Callable[..., Any]]:
        return lambda k: jax.jit(lambda v: jax.lax.fori_loop(0, k, lambda _, v: kernel(v), v))

    in_place_s = _per_iteration_s(in_place(axpy), streamed, iterations=(2, 12))
    memory_kernel_bytes_per_s = 2 * _STREAM_BYTES / _per_iteration_s(in_place(_layer_norm), streamed, iterations=(2, 12))

    def tiny_gemms(k: int) -> Callable[..., Any]:  # a GEMM, unlike an elementwise op, is not fused into the loop around it
        return jax.jit(lambda v: jax.lax.fori_loop(0, k, lambda _, v: jnp.einsum("dij,djk->dik", v, v), v))

    floor_s = _per_iteration_s(tiny_gemms, per_device(8, 8, value=1 / 8), iterations=(100, 1100))
    link_bytes_per_s, latency_s = _link(per_device, mesh, n_devices) if n_devices > 1 else (memory_kernel_bytes_per_s, 0.0)
    transpose_s_per_byte, fused_transpose_s_per_byte = _gradient_transpose(mesh, n_devices)
    return CpuMeasurement(n_devices=n_devices, matmul_flops_per_s=tuple(curve), memory_kernel_bytes_per_s=memory_kernel_bytes_per_s,
                          first_touch_s_per_byte=max(0.0, fresh_s - in_place_s) / _STREAM_BYTES,
                          transpose_s_per_byte=transpose_s_per_byte, fused_transpose_s_per_byte=fused_transpose_s_per_byte,
                          kernel_floor_s=floor_s, link_bytes_per_s=link_bytes_per_s, link_latency_s=latency_s,
                          load_average=os.getloadavg()[0], other_cpu_share=other_cpu_share(start, cpu_clock()),
                          host=host_name(), jax_version=version("jax"))


def cpu_cluster(measured: CpuMeasurement) -> ClusterSpec:
    """The ``cpu`` profile: one of ``measured.n_devices`` emulated devices, all on one node."""
    peak = measured.peak_flops_per_s
    curve = tuple((flops, rate / peak) for flops, rate in measured.matmul_flops_per_s)
    device = DeviceSpec(
        name="cpu", kind=DeviceKind.CPU, peak_flops_per_s={"float32": peak},
        hbm_bytes=16 * _GIB, hbm_bytes_per_s=measured.memory_kernel_bytes_per_s,
        # Attention runs as its matmuls here: no fused kernel, so flash_attention is unused.
        efficiency=Efficiency(matmul_curve=curve, flash_attention=1.0, hbm=1.0, kernel_floor_s=measured.kernel_floor_s),
        step_allocator=StepAllocator(fresh_above_bytes=_MMAP_THRESHOLD_MAX_BYTES, first_touch_s_per_byte=measured.first_touch_s_per_byte),
        gradient_transpose=GradientTranspose(plain_s_per_byte=measured.transpose_s_per_byte,
                                             fused_s_per_byte=measured.fused_transpose_s_per_byte),
        source=f"validate.cpu_profile micro-benchmarks on {measured.host}, {measured.n_devices} emulated devices at once",
    )
    link = LinkSpec(name="shared-memory", bytes_per_s=measured.link_bytes_per_s, latency_s=measured.link_latency_s, efficiency=1.0,
                    source="psum over the emulated devices in a compiled loop, measured by validate.cpu_profile")
    return ClusterSpec(name="cpu", device=device, devices_per_node=measured.n_devices,
                       intra_node=IntraNodeFabric(kind=IntraNodeKind.SHARED_MEMORY, link=link),
                       inter_node=host_network(link, measured.n_devices))


def measure_in_subprocess(n_devices: int, *, timeout_s: float = 300) -> CpuMeasurement:
    """`measure` in a fresh Python with ``n_devices`` emulated CPU devices."""
    code = f"from validate.cpu_profile import measure; print(measure({n_devices}).model_dump_json())"
    return CpuMeasurement.model_validate_json(run_emulated(code, n_devices, timeout_s=timeout_s, failure="the CPU micro-benchmarks failed",
                                                           fix="run python -c 'from validate.cpu_profile import measure; measure(1)' "
                                                               "to see why"))


def _cached_entries(cache: Path) -> dict[str, Any]:
    """Device count → measurement, as stored; an unreadable or older-format file holds none."""
    try:
        entries = json.loads(cache.read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in entries.items() if k.isdigit()} if isinstance(entries, dict) else {}


def cached_measurement(n_devices: int, *, recalibrate: bool = False, cache: Path = CACHE) -> CpuMeasurement:
    """The cached measurement for ``n_devices``, or a fresh one (then cached) when absent, from
    another host or JAX version, or asked for."""
    cached = _cached_entries(cache).get(str(n_devices))
    if cached is not None and not recalibrate:
        try:
            measured = CpuMeasurement.model_validate(cached)
        except ValidationError:  # measured by an older version of these benchmarks
            measured = None
        if measured and (measured.host, measured.jax_version) == (host_name(), version("jax")):
            return measured
    measured = measure_in_subprocess(n_devices)
    entries = {**_cached_entries(cache), str(n_devices): measured.model_dump()}  # re-read: another process may have added one
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(entries, indent=1, sort_keys=True))
    tmp.replace(cache)
    return measured

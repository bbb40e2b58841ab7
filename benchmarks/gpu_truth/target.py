"""What the run measures on: the backend, its hardware profile, and the facts the CSV records.

On a GPU the profile is the catalog's entry for the detected part (`profile_for_device_kind`);
on the CPU it is the ``cpu`` profile this host measured itself (`validate.cpu_profile`), for
one device. GEMMs run in bf16 where the profile has a bf16 peak, else in fp32 (the CPU
profile has fp32 only); fp8 GEMMs only where it has a float8 peak.

>>> profile_for_device_kind("NVIDIA H100 80GB HBM3"), profile_for_device_kind("NVIDIA H200")
('h100-sxm', 'h200')
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

from costmodel.errors import InvalidConfigError
from costmodel.hardware.machine import Machine, machine_for
from costmodel.hardware.profile import ClusterSpec
from costmodel.hardware.registry import load_hardware
from costmodel.inputs.train_config import Precision
from validate.cpu_profile import cached_measurement, cpu_cluster

FP8 = "float8_e4m3fn"
# Substrings of `jax.Device.device_kind` and the catalog profile each names; first match wins.
_DEVICE_PROFILES = (("H200", "h200"), ("H100", "h100-sxm"), ("A100-SXM4-40GB", "a100-40gb"), ("A100", "a100-80gb"))


def profile_for_device_kind(device_kind: str) -> str:
    """The catalog profile of a GPU by its ``device_kind``; an unknown part is refused."""
    for marker, profile in _DEVICE_PROFILES:
        if marker in device_kind:
            return profile
    raise InvalidConfigError(f"no hardware profile is known for {device_kind!r}", fix="name one with --hardware (plan hardware lists them)")


def driver_version() -> str:
    """The NVIDIA driver's version from ``nvidia-smi``, or "" where there is none."""
    if shutil.which("nvidia-smi") is None:
        return ""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=20, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.strip().splitlines()[0] if out.strip() else ""


@dataclass(frozen=True)
class Target:
    """The device the run measures and the profile that predicts it."""

    backend: str  # "gpu" or "cpu"
    quick: bool  # toy sizes
    device: str  # jax's device_kind
    driver: str
    jax_version: str
    cluster: ClusterSpec

    @property
    def dtype(self) -> str:
        """The compute dtype: bf16 where the profile has a bf16 peak, else fp32."""
        return "bfloat16" if "bfloat16" in self.cluster.device.peak_flops_per_s else "float32"

    @property
    def precision(self) -> Precision:
        """The training recipe whose GEMMs run at `dtype`."""
        return Precision.BF16 if self.dtype == "bfloat16" else Precision.FP32

    @property
    def has_fp8(self) -> bool:
        return FP8 in self.cluster.device.peak_flops_per_s

    def machine(self, dtype: str | None = None) -> Machine:
        """The simulator's view of the profile computing in ``dtype`` (default `dtype`)."""
        return machine_for(self.cluster, compute_dtype=dtype or self.dtype)

    @property
    def attention_implementation(self) -> str:
        """`jax.nn.dot_product_attention`'s fused implementation on this backend."""
        return "cudnn" if self.backend == "gpu" else "xla"


def detect_target(backend: str, *, quick: bool, hardware: str | None = None) -> Target:
    """The target of this process's first JAX device, checked against ``backend``.

    >>> detect_target("cpu", quick=True, hardware="h100-sxm").cluster.name
    'h100-sxm'
    """
    import jax  # why: keeps `--help` and the CSV helpers free of JAX's start-up

    device = jax.devices()[0]
    if backend == "gpu" and device.platform != "gpu":
        raise InvalidConfigError(f"--backend gpu, but JAX's first device is a {device.platform} ({device.device_kind})",
                                 fix="install jax with its CUDA plugin, or run --backend cpu")
    if hardware is not None:
        cluster = load_hardware(hardware, devices_per_node=1)
    elif backend == "gpu":
        cluster = load_hardware(profile_for_device_kind(device.device_kind), devices_per_node=1)
    else:
        cluster = cpu_cluster(cached_measurement(1))
    return Target(backend=backend, quick=quick, device=device.device_kind, driver=driver_version(), jax_version=version("jax"),
                  cluster=cluster)


def variant_run_parser(description: str) -> argparse.ArgumentParser:
    """The arguments of a one-device variant run (`benchmarks.gpu_truth.decode_layouts`,
    `benchmarks.gpu_truth.accumulate`): backend, toy sizes, where its CSV goes, its time budget."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--backend", choices=("gpu", "cpu"), default="gpu")
    parser.add_argument("--quick", action="store_true", help="toy sizes (the CPU check)")
    parser.add_argument("--out-dir", type=Path, default=Path("benchmarks/data/gpu"))
    parser.add_argument("--time-budget-s", type=float, default=150.0)
    return parser

"""Built-in hardware profiles, in SI units, each number with its source.

Peaks are dense (no structured sparsity). Efficiencies are what micro-benchmarks reach:
GEMM curves after the "maximum achievable matmul FLOPS" measurements (Bekman, *Machine
Learning Engineering*, compute/accelerator chapter: A100-SXM 86 %, H100-SXM 80 % of
peak on large bf16 GEMMs; small GEMMs fall off with tile/wave quantisation), fused
attention after Dao 2023 (FlashAttention-2: 50–73 % of A100 peak, 35–50 % on H100),
HBM after STREAM-like copy kernels (~85–90 %), NCCL bus bandwidth after nccl-tests
(NVLink ~77–80 % of link peak, InfiniBand ~90 %). Profiles marked ``calibrated`` had
their efficiencies fitted once over every published run on that hardware by
``benchmarks/calibrate.py`` (one fit per hardware type, never per run).
"""

from __future__ import annotations

import math

from costmodel.hardware.fabric import InterNodeFabric, IntraNodeFabric, IntraNodeKind, LinkSpec, host_network
from costmodel.hardware.host import HostSpec
from costmodel.hardware.profile import ClusterSpec, DeviceKind, DeviceSpec
from costmodel.hardware.storage import ASSUMED_LOCAL_DISK, ASSUMED_SHARED_STORAGE, SUPERPOD_H100_STANDARD, StorageSpec
from costmodel.step.roofline import Efficiency

GB, GIB, MIB, TFLOPS = 1e9, 2**30, 2**20, 1e12
_GBIT = 1e9 / 8

# --- links -------------------------------------------------------------------------------
NVLINK2 = LinkSpec(name="nvlink2", bytes_per_s=150 * GB, latency_s=2e-6, efficiency=0.8,
                   source="V100 SXM2: 6 NVLink2 links × 25 GB/s per direction (NVIDIA V100 datasheet)")
NVLINK3 = LinkSpec(name="nvlink3", bytes_per_s=300 * GB, latency_s=1e-6, efficiency=0.77,
                   source="A100: 600 GB/s bidirectional NVLink3 via NVSwitch (A100 datasheet); nccl-tests all-reduce busbw ~230 GB/s")
NVLINK4 = LinkSpec(name="nvlink4", bytes_per_s=450 * GB, latency_s=1e-6, efficiency=0.8,
                   source="H100/H200 SXM: 900 GB/s bidirectional NVLink4 (H100 datasheet); nccl-tests busbw ~360 GB/s")
PCIE3 = LinkSpec(name="pcie3-x16", bytes_per_s=16 * GB, latency_s=5e-6, efficiency=0.8, source="PCIe 3.0 x16: 15.75 GB/s per direction")
PCIE4 = LinkSpec(name="pcie4-x16", bytes_per_s=32 * GB, latency_s=5e-6, efficiency=0.8, source="PCIe 4.0 x16: 31.5 GB/s per direction")
PCIE5 = LinkSpec(name="pcie5-x16", bytes_per_s=64 * GB, latency_s=5e-6, efficiency=0.8, source="PCIe 5.0 x16: 63 GB/s per direction")
# Blackwell's NVLink and AMD's Infinity Fabric have no nccl-tests/rccl-tests figures here: their
# efficiency is NVLink4's, an assumption.
NVLINK5 = LinkSpec(name="nvlink5", bytes_per_s=900 * GB, latency_s=1e-6, efficiency=0.8,
                   source="B200/GB200: 1.8 TB/s bidirectional NVLink5 per GPU through NVLink switches (NVIDIA DGX B200 "
                          "User Guide, 'Hardware Overview': 2× NVLink5 switches, 14.4 TB/s aggregate for 8 GPUs; GB200 NVL72 "
                          "datasheet: 130 TB/s for 72 GPUs); efficiency assumed as NVLink4's")
XGMI_MI300 = LinkSpec(name="xgmi-mi300", bytes_per_s=448 * GB, latency_s=2e-6, efficiency=0.8,
                      source="MI300X/MI325X: 7 AMD Infinity Fabric (xGMI) links per GPU, 128 GB/s bidirectional each, one to "
                             "each peer of the 8-GPU platform, 896 GB/s aggregate bidirectional (AMD Instinct MI300X and MI325X "
                             "datasheets, amd.com): 448 GB/s per direction over all 7, what a group of 8 reaches; a group of 2 "
                             "has one link (64 GB/s per direction), not modelled; efficiency and latency assumed")
NVLINK3_BRIDGE_A6000 = LinkSpec(name="nvlink3-bridge-a6000", bytes_per_s=56.25 * GB, latency_s=1e-6, efficiency=0.77,
                                source="RTX A6000 datasheet: NVLink 2-way bridge, 112.5 GB/s bidirectional; efficiency as NVLink3")
LOOPBACK = LinkSpec(name="shared-memory", bytes_per_s=5 * GB, latency_s=20e-6, efficiency=0.5,
                    source="emulated devices on one host: copies through shared DRAM (placeholder, to calibrate)")


def _ici(name: str, per_chip_gbps: float, n_links: int) -> LinkSpec:
    # Cloud TPU docs give ICI bandwidth per chip over all its links, both directions.
    per_link_dir = per_chip_gbps * _GBIT / n_links / 2
    return LinkSpec(name=name, bytes_per_s=per_link_dir, latency_s=2e-6, efficiency=0.85,
                    source=f"Cloud TPU system architecture: {per_chip_gbps:.0f} Gbps ICI per chip over {n_links} torus links")


ICI_V4, ICI_V5P = _ici("ici-v4", 2400, 6), _ici("ici-v5p", 4800, 6)


# --- networks ----------------------------------------------------------------------------
def _one_nic_per_gpu(name: str, gbit_per_s: float, source: str) -> InterNodeFabric:
    # The part-named profiles stand for the vendor's reference node: one compute NIC per GPU,
    # rail-optimised and non-blocking as in NVIDIA's DGX SuperPOD reference architectures.
    return InterNodeFabric(name=name, nics_per_node=8, nic_gbit_per_s=gbit_per_s, rail_optimized=True, latency_s=5e-6,
                           efficiency=0.9, source=source)


IB_EDR = _one_nic_per_gpu("ib-edr100", 100, "InfiniBand EDR 100 Gb/s NIC per GPU")
IB_HDR = _one_nic_per_gpu("ib-hdr200", 200, "DGX A100: 8× Mellanox ConnectX-6 HDR 200 Gb/s, one per GPU (DGX A100 user guide)")
IB_NDR = _one_nic_per_gpu("ib-ndr400", 400, "DGX H100: 8× ConnectX-7 NDR 400 Gb/s, one per GPU (DGX H100 user guide); "
                                            "torchtitan runs: 400 Gb/s RDMA per GPU")
DGX_B200_NETWORK = _one_nic_per_gpu("ib-ndr400", 400, "NVIDIA DGX B200 User Guide: 4 OSFP ports for 8× ConnectX-7 single-port "
                                                        "cards, InfiniBand up to 400 Gb/s, one per GPU")
GB200_NVL72_NETWORK = InterNodeFabric(
    name="ib-ndr400", nics_per_node=72, nic_gbit_per_s=400, rail_optimized=True, latency_s=5e-6, efficiency=0.9,
    source="GB200 NVL72: one ConnectX-7 400 Gb/s InfiniBand NIC per GPU, 4 per compute tray of 4 GPUs (NVIDIA DGX GB200 "
           "datasheet: 72 OSFP single-port ConnectX-7; MLPerf Inference v6.1 GB200-NVL72 system descriptions: 4 NICs per "
           "4-GPU tray); rail-optimised and non-blocking as NVIDIA's DGX SuperPOD reference architectures are (assumed)")
# AMD's 8-GPU platforms as clouds run them: one 400 Gb/s NIC per GPU (Azure ND MI300X v5: 8× 400 Gb/s
# InfiniBand per VM, 3.2 Tb/s); rail-optimised assumed.
MI300_NETWORK = _one_nic_per_gpu("ib-ndr400", 400, "one 400 Gb/s InfiniBand NIC per GPU, as Azure's ND MI300X v5 VMs have "
                                                   "(8× 400 Gb/s per 8 GPUs); rail-optimised and non-blocking assumed")
ETH_400 = InterNodeFabric(name="eth-400g", nics_per_node=1, nic_gbit_per_s=400, rail_optimized=False, latency_s=20e-6,
                          efficiency=0.8, source="400 Gb/s per node, shared by its GPUs (AWS EC2 g6e.48xlarge: 400 Gbps EFA "
                                                 "networking for 8× L40S)")
ETH_100 = InterNodeFabric(name="eth-100g", nics_per_node=1, nic_gbit_per_s=100, rail_optimized=False, latency_s=20e-6,
                          efficiency=0.8, source="100 GbE per node, shared by its GPUs")


def dcn(chips_per_slice: int) -> InterNodeFabric:
    """The data-centre network between TPU slices: one 200 Gb/s NIC per host of 4 chips."""
    return InterNodeFabric(name="dcn", nics_per_node=max(1, chips_per_slice // 4), nic_gbit_per_s=200, rail_optimized=False,
                           latency_s=20e-6, efficiency=0.8,
                           source="Data-centre network between TPU slices: ~200 Gb/s per host of 4 chips, 50 Gbps per chip "
                                  "(Cloud TPU docs: multislice; v5p system architecture)")


# --- hosts (for offloading: costmodel.hardware.host, costmodel.step.offload) ---------------------------
# DRAM peaks are channels × transfer rate × 8 B: EPYC 7742 8× DDR4-3200 per socket, Xeon
# 8480C 8× DDR5-4800, Xeon 8168 6× DDR4-2666. A100 and H100 SXM reach the host over PCIe
# Gen4 and Gen5 x16; a node's switches may share an uplink between two GPUs (not modelled).
_EPYC_7742_PAIR = "2× AMD EPYC 7742, 128 cores, 8 channels DDR4-3200 per socket (409.6 GB/s)"
_XEON_8480C_PAIR = "2× Intel Xeon Platinum 8480C, 112 cores, 8 channels DDR5-4800 per socket (614.4 GB/s)"
DGX_A100_320GB_HOST = HostSpec(memory_bytes_per_node=1e12, cpu_cores_per_node=128, dram_bytes_per_s_per_node=409.6 * GB,
                               link=PCIE4, source=f"DGX A100 datasheet (320 GB system): 1 TB system memory; {_EPYC_7742_PAIR}")
DGX_A100_640GB_HOST = DGX_A100_320GB_HOST.model_copy(update={
    "memory_bytes_per_node": 2e12, "source": f"DGX A100 datasheet (640 GB system): 2 TB system memory; {_EPYC_7742_PAIR}"})
DGX_H100_HOST = HostSpec(memory_bytes_per_node=2e12, cpu_cores_per_node=112, dram_bytes_per_s_per_node=614.4 * GB, link=PCIE5,
                         source=f"DGX H100/H200 datasheets: 2 TB system memory; {_XEON_8480C_PAIR}")
DGX2_HOST = HostSpec(memory_bytes_per_node=1.5e12, cpu_cores_per_node=48, dram_bytes_per_s_per_node=256 * GB, link=PCIE3,
                     source="DGX-2 datasheet: 1.5 TB system memory, 2× Intel Xeon Platinum 8168 (48 cores), 6 channels "
                            "DDR4-2666 per socket (256 GB/s); the ZeRO-Offload paper's machine")
DGX_B200_HOST = HostSpec(memory_bytes_per_node=2e12, cpu_cores_per_node=112, dram_bytes_per_s_per_node=716.8 * GB, link=PCIE5,
                         source="NVIDIA DGX B200 User Guide, 'Hardware Overview': 2 TB system memory (32 DIMMs), 2× Intel Xeon "
                                "Platinum 8570, 56 cores each; 8 channels DDR5-5600 per socket (716.8 GB/s; Intel's figure for "
                                "the 8570, two DIMMs per channel may run slower: assumed at full speed); PCIe Gen5 to each GPU")
# Rented PCIe GPU servers state no host: assumed a DGX A100-class two-socket EPYC 7742 host with
# 512 GB, each GPU on its own PCIe Gen4 x16 link (so offloading can be planned; labelled assumed).
ASSUMED_PCIE4_SERVER_HOST = DGX_A100_320GB_HOST.model_copy(update={
    "memory_bytes_per_node": 512 * GB,
    "source": f"assumed (no published host for a rented 8-GPU PCIe server): 512 GB system memory; {_EPYC_7742_PAIR}; "
              "PCIe Gen4 x16 per GPU (the GPU's own interface)"})
# A GB200 superchip is one Grace CPU (72 cores, up to 480 GB LPDDR5X at up to 512 GB/s) and two B200
# GPUs on NVLink-C2C (900 GB/s bidirectional per superchip); the NVL72 has 36.
_C2C_SHARED = LinkSpec(name="nvlink-c2c", bytes_per_s=225 * GB, latency_s=1e-6, efficiency=0.8,
                       source="GB200 NVL72 datasheet: NVLink-C2C 900 GB/s bidirectional per superchip, assumed shared by its "
                              "two GPUs (225 GB/s each per direction); efficiency assumed as NVLink's")
GB200_NVL72_HOST = HostSpec(memory_bytes_per_node=36 * 480 * GB, cpu_cores_per_node=36 * 72,
                            dram_bytes_per_s_per_node=36 * 512 * GB, link=_C2C_SHARED,
                            source="GB200 NVL72 datasheet (nvidia.com/en-us/data-center/gb200-nvl72): 36 Grace CPUs, 2,592 Arm "
                                   "Neoverse V2 cores, up to 17 TB LPDDR5X at up to 18.4 TB/s (36 × 480 GB, 36 × 512 GB/s)")


# --- devices -----------------------------------------------------------------------------
# NCCL runs its collectives as kernels of 16–32 thread blocks, one SM each, that also stream
# through HBM: on 108–132 SMs, compute beside them loses roughly 0.15 of its speed (an
# estimate from that count, fitted where enough runs allow).
_GPU_OVERLAP_SLOWDOWN = 0.15
# A fused attention thread block's fixed work in key tokens, fitted to published forward sweeps by
# `python -m benchmarks.attention_accuracy` (never to training runs): Triton's tutorial kernel on an
# A100, head dim 64 (Ampere and Ada parts), and FlashAttention-3 on an H100 PCIe (Hopper and later).
AMPERE_ATTENTION_OVERHEAD_TOKENS = 179.0
HOPPER_ATTENTION_OVERHEAD_TOKENS = 248.0
_A100_MICROBENCH = Efficiency(matmul_curve=((1e9, 0.45), (1e10, 0.7), (1e11, 0.82), (1e12, 0.86)),
                              flash_attention=0.55, hbm=0.85, gemm_hbm=0.85, kernel_floor_s=5e-6,
                              overlap_slowdown=_GPU_OVERLAP_SLOWDOWN, attention_overhead_tokens=AMPERE_ATTENTION_OVERHEAD_TOKENS)
_H100_MICROBENCH = Efficiency(matmul_curve=((1e9, 0.3), (1e10, 0.55), (1e11, 0.72), (1e12, 0.8)),
                              flash_attention=0.45, hbm=0.85, gemm_hbm=0.85, kernel_floor_s=4e-6,
                              overlap_slowdown=_GPU_OVERLAP_SLOWDOWN, attention_overhead_tokens=HOPPER_ATTENTION_OVERHEAD_TOKENS)
# A power cap lowers sustained tensor-core clocks: at 500 W instead of 700 W an H100
# sustains roughly 85 % of its boost clock on GEMM-heavy work.
_H100_500W_MICROBENCH = _H100_MICROBENCH.calibrated(matmul_scale=0.85, flash_attention=0.45 * 0.85, hbm=0.85)
# benchmarks/calibrate.py, one fit per hardware type over all its published runs (an
# exhaustive search of its grid for the least mean error): 24 A100 runs (GEMM scale and
# bend, attention, HBM, overlap fitted), 11 H100-SXM runs (GEMM scale and bend, attention)
# and 5 capped-H100 runs (GEMM scale only). The A100 fit reaches the micro-benchmark curve's
# plateau at three times its sizes and scales it to 0.77 of peak on large GEMMs; its
# memory-bound kernels reach 0.55 of HBM bandwidth (fused softmax, norms and dropout over
# rows, below a plain copy's 0.85; a memory-bound GEMM streams its weights as a copy does and
# keeps the micro-benchmark's 0.85), its fused attention 0.35 of peak, and compute beside a
# collective runs 0.25 slower (the seven torchtitan runs, whose FSDP traffic overlaps a
# quarter to two fifths of their step, set it). The
# capped H100 sustains 0.50 of the 900 TF peak on large GEMMs (0.8 micro-benchmark × 0.85
# power cap × 0.74 fitted), below the 0.55 floor of calibrate.PHYSICAL_RANGE: that peak is
# itself an estimate (between the NVL's and the SXM's, as the torchtitan paper says).
_A100_EFF = _A100_MICROBENCH.calibrated(matmul_scale=0.90, matmul_knee=3.0, flash_attention=0.35, hbm=0.55,
                                        overlap_slowdown=0.25)
_H100_500W_EFF = _H100_500W_MICROBENCH.calibrated(matmul_scale=0.74, flash_attention=0.45 * 0.85, hbm=0.85)
# 11 Megatron-Core runs of the Megatron-LM README (one source; three runs per free parameter:
# GEMM scale, bend and fused attention): large GEMMs at 0.56 of the 989 TF peak, reached at
# three times the micro-benchmark's sizes, and fused attention at 0.35. The H200 is the same
# die under the same 700 W limit with faster HBM and has no runs of its own: it takes this fit.
_H100_EFF = _H100_MICROBENCH.calibrated(matmul_scale=0.70, matmul_knee=3.0, flash_attention=0.35, hbm=0.85)
# The RTX 4090 measured (benchmarks/data/gemm_benchmarks.csv): square bf16/fp16 GEMMs of five sources,
# the median at each power-of-two size (0.28 of the 165.2 TF peak at 512³, 0.70 at 1024³, 0.97
# from 2048³: boost clocks pass the nominal peak), and copy/stream kernels at 843–922 GB/s of
# 1,008 (median 0.91). No 4090 run is fitted: the A100's calibration carries over as an assumption
# (GEMM scale and knee, fused attention, memory-bound kernels at its 0.55 / 0.85 of stream bandwidth).
_RTX4090_MICROBENCH = Efficiency(matmul_curve=((2.7e8, 0.28), (2.1e9, 0.70), (1.7e10, 0.97), (1.1e12, 0.97)),
                                 flash_attention=0.55, hbm=0.91, gemm_hbm=0.91, kernel_floor_s=5e-6,
                                 overlap_slowdown=_GPU_OVERLAP_SLOWDOWN, attention_overhead_tokens=AMPERE_ATTENTION_OVERHEAD_TOKENS)
_RTX4090_EFF = _RTX4090_MICROBENCH.calibrated(matmul_scale=0.90, matmul_knee=3.0, flash_attention=0.35, hbm=0.55 * 0.91 / 0.85,
                                              overlap_slowdown=0.25)
_GENERIC_EFF = Efficiency()
# XLA's bf16 GEMMs on one v6e chip, device time from the JAX profiler (yangwhale/gpu-tpu-pedia
# tpu/v7_perf: results_trace_test.csv @6744feed, 8192³ in 1510.9 µs = 0.793 of the 918 TF peak;
# findings.md @cf60275f, 16384×18432×16384 at 0.788): a plateau near 0.79 where a v5e's reaches 0.92
# (the JAX Pallas TPU matmul guide). The generic curve's bend is kept below the plateau (the
# source's smaller shapes were timed with a Python dispatch each, so they bound it only from below).
# Fused attention, memory-bound kernels: no published v6e measurement, the generic values.
_TPU_V6E_MICROBENCH = _GENERIC_EFF.calibrated(matmul_scale=0.79 / _GENERIC_EFF.matmul(1e12),
                                              flash_attention=_GENERIC_EFF.flash_attention, hbm=_GENERIC_EFF.hbm)
# Where calibrate.py starts from: the micro-benchmark values before any fit.
MICROBENCHMARK_EFFICIENCY = {
    "a100-40gb": _A100_MICROBENCH, "a100-80gb": _A100_MICROBENCH,
    "h100-sxm": _H100_MICROBENCH, "h100-96gb-hbm2e-500w": _H100_500W_MICROBENCH, "h100-95gb-hbm2e-lowtdp": _H100_500W_MICROBENCH,
    "h200": _H100_MICROBENCH, "tpu-v6e": _TPU_V6E_MICROBENCH,
}
# Parts built on one die (the same SMs and tensor cores under other memory or power limits): what
# one part's runs teach about its GEMM kernels carries to the others, relative to each part's own
# micro-benchmark curve (benchmarks/simulator_accuracy.chip_transfer_pct).
CHIP = {"a100-40gb": "GA100", "a100-80gb": "GA100", "a100-80gb-pcie": "GA100",
        "h100-sxm": "GH100", "h100-96gb-hbm2e-500w": "GH100", "h100-95gb-hbm2e-lowtdp": "GH100", "h200": "GH100"}


def _gpu(name: str, *, peaks: dict[str, float], hbm_gib: float, hbm_gbps: float, power_w: float, source: str,
         usable_mib: float | None = None, usable_source: str = "", efficiency: Efficiency = _GENERIC_EFF,
         instructions_per_s: float | None = None) -> DeviceSpec:
    usable = f"; usable {usable_mib:,.0f} MiB: {usable_source}" if usable_mib else f"; usable: {usable_source}"
    return DeviceSpec(name=name, kind=DeviceKind.GPU, peak_flops_per_s={k: v * TFLOPS for k, v in peaks.items()},
                      hbm_bytes=hbm_gib * GIB, usable_hbm_bytes=usable_mib * MIB if usable_mib else None,
                      hbm_bytes_per_s=hbm_gbps * GB, power_limit_w=power_w, efficiency=efficiency,
                      instructions_per_s=instructions_per_s, source=source + usable)


# Thread instructions a second: each SM's 4 schedulers issue one 32-thread warp instruction a clock (the
# Ampere and Hopper whitepapers' SM diagrams). GA100 as the A100 ships: 108 SMs at 1,410 MHz boost (A100
# whitepaper); GH100 as the H100 SXM5 ships: 132 SMs at 1,980 MHz (its 66.9 TFLOPS fp32 = 132 × 128 lanes × 2 × 1.98 GHz).
_A100_INSTRUCTIONS_PER_S = 108 * 4 * 32 * 1.41e9
_H100_SXM_INSTRUCTIONS_PER_S = 132 * 4 * 32 * 1.98e9


# Usable memory is nvidia-smi's memory.total, the driver's figure (CUDA's own total can be lower
# still: an A100-SXM4-40GB's deviceQuery reports 40,339 MiB against nvidia-smi's 40,960). Figures
# from outputs posted in public threads; where none was found for a part, an assumption says so.
_MODAL_SMI = "nvidia-smi memory.total (modal-labs/modal-client#2797, its GPUs' reported totals)"


_AMPERE = {"float32": 19.5, "tf32": 156, "bfloat16": 312, "float16": 312, "int8": 624}
_HOPPER = {"float32": 66.9, "tf32": 494.7, "bfloat16": 989.4, "float16": 989.4, "float8_e4m3fn": 1978.9, "int8": 1978.9}
# Between H100 NVL (835 TF) and SXM (989 TF), as the torchtitan paper says of these parts.
_HOPPER_CAPPED = {k: v * 900 / 989.4 for k, v in _HOPPER.items()}

A100_40GB = _gpu("a100-40gb", peaks=_AMPERE, hbm_gib=40, hbm_gbps=1555, power_w=400, efficiency=_A100_EFF,
                 instructions_per_s=_A100_INSTRUCTIONS_PER_S,
                 source="NVIDIA A100 datasheet (SXM4 40GB)", usable_mib=40960, usable_source=_MODAL_SMI)
A100_80GB = _gpu("a100-80gb", peaks=_AMPERE, hbm_gib=80, hbm_gbps=2039, power_w=400, efficiency=_A100_EFF,
                 instructions_per_s=_A100_INSTRUCTIONS_PER_S,
                 source="NVIDIA A100 datasheet (SXM4 80GB)", usable_mib=81920, usable_source=_MODAL_SMI)
# No published runs on the PCIe card to fit: the SXM part's micro-benchmark efficiencies.
A100_80GB_PCIE = _gpu("a100-80gb-pcie", peaks=_AMPERE, hbm_gib=80, hbm_gbps=1935, power_w=300, efficiency=_A100_MICROBENCH,
                      instructions_per_s=_A100_INSTRUCTIONS_PER_S,
                      source="NVIDIA A100 datasheet (PCIe 80GB: HBM2e 1,935 GB/s, 300 W)", usable_mib=81920,
                      usable_source="nvidia-smi memory.total of an A800 80GB PCIe, the same board for export "
                                    "(pytorch/pytorch#37250); assumed the same for the A100 PCIe")
H100_SXM = _gpu("h100-sxm", peaks=_HOPPER, hbm_gib=80, hbm_gbps=3350, power_w=700, efficiency=_H100_EFF,
                instructions_per_s=_H100_SXM_INSTRUCTIONS_PER_S,
                source="NVIDIA H100 datasheet (SXM5 80GB HBM3)", usable_mib=81559,
                usable_source=f"{_MODAL_SMI}; the same on 8× H100 SXM in NVIDIA/nccl#1264")
H200 = _gpu("h200", peaks=_HOPPER, hbm_gib=141e9 / GIB, hbm_gbps=4800, power_w=700, efficiency=_H100_EFF,
            instructions_per_s=_H100_SXM_INSTRUCTIONS_PER_S,
            source="NVIDIA H200 datasheet (SXM, 141 GB HBM3e, 4.8 TB/s)", usable_mib=143771,
            usable_source="nvidia-smi memory.total on 8× H200 SXM (NVIDIA/cuda-samples#311)")
H100_96GB_500W = _gpu("h100-96gb-hbm2e-500w", peaks=_HOPPER_CAPPED, hbm_gib=96, hbm_gbps=2400, power_w=500,
                      efficiency=_H100_500W_EFF,
                      source="Meta Grand Teton H100, 96 GB HBM2e, 500 W cap (torchtitan benchmarks): peak between NVL and SXM "
                             "(torchtitan paper, arXiv 2410.06511); HBM2e ~2.4 TB/s assumed (6 stacks at H100-PCIe speed)",
                      usable_source="no driver figure found: the stated capacity assumed usable")
H100_95GB_LOWTDP = H100_96GB_500W.model_copy(update={"name": "h100-95gb-hbm2e-lowtdp", "hbm_bytes": 95 * GIB})
A40 = _gpu("a40", peaks={"float32": 37.4, "tf32": 74.8, "bfloat16": 149.7, "float16": 149.7, "int8": 299.3},
           hbm_gib=48, hbm_gbps=696, power_w=300, source="NVIDIA A40 datasheet (GDDR6)", usable_mib=46068,
           usable_source=f"assumed as the L40S's 48 GB GDDR6 with ECC reports it, {_MODAL_SMI}")
V100 = _gpu("v100", peaks={"float32": 15.7, "float16": 125}, hbm_gib=32, hbm_gbps=900, power_w=300,
            source="NVIDIA V100 datasheet (SXM2 32GB); no bf16 tensor cores", usable_mib=32768,
            usable_source="nvidia-smi memory.total of a V100-SXM2 32GB (Wan-Video/Wan2.1#5)")
T4 = _gpu("t4", peaks={"float32": 8.1, "float16": 65, "int8": 130}, hbm_gib=16, hbm_gbps=320, power_w=70,
          source="NVIDIA T4 datasheet (GDDR6)", usable_mib=15360, usable_source=_MODAL_SMI)



# --- the 2026 parts (issue 40). Peaks are dense: NVIDIA's and AMD's tables give the 2:4-sparse figure
# first or only ("with sparsity" footnotes); these are half of it. fp4 ("float4_e2m1fn", NVFP4/MXFP4
# GEMMs) is listed where published, but no --precision runs it: no stack here trains or serves in fp4.
# None of these parts has published runs to fit: each takes the efficiencies of the nearest calibrated
# part (Blackwell and CDNA3 the H100's, Ada and GA102 the A100's: Ada's kernels are Ampere's mma.sync
# kind, not Hopper's wgmma), an assumption each profile's source repeats; nothing fitted to them.
_ASSUMED_H100_EFF = "efficiencies the H100's calibrated ones (assumed: no runs on this part)"
_ASSUMED_A100_EFF = "efficiencies the A100's calibrated ones (assumed: no runs on this part)"
# HGX B200 datasheet (8 GPUs, sparse): FP4 144 PF, FP8 72 PF, INT8 72 POPS, FP16/BF16 36 PF, TF32 18 PF;
# FP32 600 TF. Per GPU, dense.
_BLACKWELL_HGX = {"float32": 75, "tf32": 1125, "bfloat16": 2250, "float16": 2250, "float8_e4m3fn": 4500, "int8": 4500,
                  "float4_e2m1fn": 9000}
# GB200 NVL72 datasheet (72 GPUs, sparse): FP4 1,440 PF, FP8/FP6 720 PF, INT8 720 POPS, FP16/BF16 360 PF,
# TF32 180 PF; FP32 5,760 TF. Per GPU, dense: the GB200's B200 runs at 1,200 W against the HGX part's 1,000 W.
_BLACKWELL_GB200 = {"float32": 80, "tf32": 1250, "bfloat16": 2500, "float16": 2500, "float8_e4m3fn": 5000, "int8": 5000,
                    "float4_e2m1fn": 10000}
# AMD Instinct MI300X and MI325X datasheets (the same CDNA3 die, peaks at the same clock): matrix FP32
# 163.4, TF32 653.7, FP16/BF16 1,307.4, FP8 2,614.9 TFLOPS, INT8 2,614.9 TOPS (dense; sparse doubles the
# last four). CDNA3's fp8 is the FNUZ encoding (float8_e4m3fnuz); the catalog keys every fp8 peak float8_e4m3fn.
_CDNA3 = {"float32": 163.4, "tf32": 653.7, "bfloat16": 1307.4, "float16": 1307.4, "float8_e4m3fn": 2614.9, "int8": 2614.9}
# The MI300X measured beside the H100 by one method each: the largest bf16 torch.matmul over a size sweep
# (stas00/ml-engineering compute/accelerator/README.md @744d01e: 668.4 TF, 0.511 of peak, against the
# H100's 794.5, 0.803) and fp8 hipBLASLt against cuBLASLt on Azure VMs (Azure AI-benchmarking-guide
# results @3de0c29: 0.443 against 0.652 of peak at 8192³, 0.388 against 0.696 at 16384³): its GEMMs reach
# 0.64 of the H100's fraction of peak (the three ratios 0.64, 0.68, 0.56; dense MFMA work holds ~1.2 of
# its 2.1 GHz). BabelStream triad on the same VM 4.09 of 5.3 TB/s (0.77); ROCm/aiter's tuned 8-bit GEMMs at
# one row (a8w8_tuned_gemm.csv @fbb52dd, 57344×8192 and 8192×28672) stream 0.60 and 0.53 of it (0.57).
# No MI300X training run is held: the H100's calibration carries over relative to each part's micro-benchmarks
# (GEMM scale and bend; its fused attention scaled as its GEMMs), an assumption.
MI300X_GEMM_FRACTION_OF_H100 = 0.64
_MI300X_MICROBENCH = _H100_MICROBENCH.calibrated(
    matmul_scale=MI300X_GEMM_FRACTION_OF_H100, flash_attention=_H100_MICROBENCH.flash_attention, hbm=0.77,
).model_copy(update={"gemm_hbm": 0.57})
_MI300X_EFF = _MI300X_MICROBENCH.calibrated(matmul_scale=0.70, matmul_knee=3.0, flash_attention=0.35 * MI300X_GEMM_FRACTION_OF_H100,
                                            hbm=0.77)
_MEASURED_MI300X_EFF = ("GEMM, stream and decode-GEMV efficiencies measured (the MI300X and the H100 by one method each: "
                        "catalog.MI300X_GEMM_FRACTION_OF_H100), the H100's calibration carried over relative to them "
                        "(assumed: no runs on this part)")

B200 = _gpu("b200", peaks=_BLACKWELL_HGX, hbm_gib=180e9 / GIB, hbm_gbps=8000, power_w=1000, efficiency=_H100_EFF,
            source="NVIDIA HGX B200 datasheet and DGX B200 User Guide (8× B200, 1,440 GB HBM3e, 64 TB/s: 180 GB and "
                   "8 TB/s per GPU; 1,000 W TGP as MLPerf system descriptions list it); the driver's bus width gives "
                   f"7.67 TB/s (pytorch/ao#4002), the datasheet's 8 TB/s kept; {_ASSUMED_H100_EFF}", usable_mib=183359,
            usable_source="nvidia-smi memory.total on 8× B200 (NVIDIA/TensorRT-LLM#10278)")
GB200 = _gpu("gb200", peaks=_BLACKWELL_GB200, hbm_gib=186e9 / GIB, hbm_gbps=8000, power_w=1200, efficiency=_H100_EFF,
             source="NVIDIA GB200 NVL72 datasheet (72 Blackwell GPUs, up to 13.4 TB HBM3e at 576 TB/s: 186 GB and 8 TB/s "
                    "per GPU; 1,200 W per GPU, NVIDIA Blackwell architecture technical brief); "
                    f"{_ASSUMED_H100_EFF}",
             usable_source="no driver figure found: the datasheet's 186 GB assumed usable (a B200's driver reports more "
                           "than its datasheet's 180 GB)")
MI300X = _gpu("mi300x", peaks=_CDNA3, hbm_gib=192e9 / GIB, hbm_gbps=5300, power_w=750, efficiency=_MI300X_EFF,
              source="AMD Instinct MI300X datasheet (192 GB HBM3, 5.3 TB/s, 750 W); JAX runs it through XLA's ROCm backend "
                     f"(the jax-rocm plugin), NCCL's place taken by RCCL; {_MEASURED_MI300X_EFF}", usable_mib=196592,
              usable_source="the KFD driver's VRAM of a CPX partition, 25,767,706,624 B, times its 8 partitions (rocminfo "
                            "and mem_banks in ROCm/legacy-rocm-build#4750; 191.98 GiB)")
MI325X = _gpu("mi325x", peaks=_CDNA3, hbm_gib=256e9 / GIB, hbm_gbps=6000, power_w=1000, efficiency=_MI300X_EFF,
              source="AMD Instinct MI325X datasheet (256 GB HBM3E, 6 TB/s, 1,000 W; peaks the MI300X's); JAX through XLA's "
                     "ROCm backend; the MI300X's efficiencies (the same die; assumed: no measurement of this part)",
              usable_mib=256 * 1024,
              usable_source="no driver figure found: the 256 GiB of AMD's ROCm GPU-specs table (VRAM in GiB) assumed usable "
                            "(the same table's 192 GiB for the MI300X is within 0.01 % of its driver's figure)")
L4 = _gpu("l4", peaks={"float32": 30.3, "tf32": 60, "bfloat16": 121, "float16": 121, "float8_e4m3fn": 242.5, "int8": 242.5},
          hbm_gib=24, hbm_gbps=300, power_w=72, efficiency=_A100_EFF,
          source=f"NVIDIA L4 datasheet (Ada, 24 GB GDDR6, 300 GB/s, 72 W, PCIe Gen4 x16); {_ASSUMED_A100_EFF}",
          usable_mib=23034, usable_source=_MODAL_SMI)
L40S = _gpu("l40s", peaks={"float32": 91.6, "tf32": 183, "bfloat16": 362.05, "float16": 362.05, "float8_e4m3fn": 733,
                           "int8": 733},
            hbm_gib=48, hbm_gbps=864, power_w=350, efficiency=_A100_EFF,
            source=f"NVIDIA L40S datasheet (Ada, 48 GB GDDR6 with ECC, 864 GB/s, 350 W, PCIe Gen4 x16); {_ASSUMED_A100_EFF}",
            usable_mib=46068, usable_source=_MODAL_SMI)
A10G = _gpu("a10g", peaks={"float32": 31.2, "tf32": 62.5, "bfloat16": 125, "float16": 125, "int8": 250},
            hbm_gib=24, hbm_gbps=600, power_w=300, efficiency=_A100_EFF,
            source="AWS's A10G (EC2 G5): NVIDIA publishes no datasheet for it; peaks, 24 GB GDDR6 and 600 GB/s assumed the "
                   "NVIDIA A10 datasheet's (GA102, PCIe Gen4 x16); its 300 W limit as nvidia-smi shows it (NVIDIA/DCGM#232); "
                   f"{_ASSUMED_A100_EFF}",
            usable_mib=23028, usable_source="nvidia-smi memory.total of an A10G (NVIDIA/DCGM#232; the A10's the same, "
                                            "modal-labs/modal-client#2797)")
# GeForce tensor cores run FP16/BF16 with FP32 accumulation (as training's GEMMs do) and FP8 with FP32
# accumulation at half their FP16-accumulate rate: those halved rates are its peaks.
RTX_4090 = _gpu("rtx-4090", peaks={"float32": 82.6, "tf32": 82.6, "bfloat16": 165.2, "float16": 165.2, "float8_e4m3fn": 330.3,
                                   "int8": 660.6},
                hbm_gib=24, hbm_gbps=1008, power_w=450, efficiency=_RTX4090_EFF,
                source="NVIDIA Ada GPU architecture whitepaper, appendix table (GeForce RTX 4090: FP16/BF16 tensor with FP32 "
                       "accumulate 165.2, FP8 with FP32 accumulate 330.3, TF32 82.6, INT8 660.6, FP32 82.6 TFLOPS dense; 24 GB "
                       "GDDR6X, 1,008 GB/s, 450 W, PCIe Gen4 x16, no NVLink); GEMM and stream efficiencies measured "
                       "(benchmarks/data/gemm_benchmarks.csv), the A100's calibration carried over (assumed: no runs fitted)",
                usable_mib=24564, usable_source="nvidia-smi memory.total on 2× RTX 4090 (RLinf/RLinf#255)")
RTX_A6000 = _gpu("rtx-a6000", peaks={"float32": 38.7, "tf32": 77.4, "bfloat16": 154.8, "float16": 154.8, "int8": 309.7},
                 hbm_gib=48, hbm_gbps=768, power_w=300, efficiency=_A100_EFF,
                 source="NVIDIA RTX A6000 datasheet (48 GB GDDR6 with ECC, 768 GB/s, 300 W, PCIe Gen4 x16, 2-way NVLink "
                        "bridge 112.5 GB/s; tensor 309.7 TFLOPS sparse) and the NVIDIA Ampere GA102 whitepaper's appendix "
                        "(FP16/BF16 with FP32 accumulate 154.8, TF32 77.4, INT8 309.7 dense); "
                        f"{_ASSUMED_A100_EFF}", usable_mib=49152,
                 usable_source="no driver figure found: the full 48 GiB assumed, as a GA102 RTX 3090 with ECC off (the RTX "
                               "A6000's default) reports all its 24,576 MiB (noonghunna/club-3090#1128)")


def _tpu(name: str, *, bf16_tflops: float, int8_tops: float, hbm_gib: float, hbm_gbps: float, source: str,
         efficiency: Efficiency = _GENERIC_EFF) -> DeviceSpec:
    return DeviceSpec(name=name, kind=DeviceKind.TPU,
                      peak_flops_per_s={"bfloat16": bf16_tflops * TFLOPS, "int8": int8_tops * TFLOPS},
                      hbm_bytes=hbm_gib * GIB, hbm_bytes_per_s=hbm_gbps * GB, efficiency=efficiency,
                      source=f"{source}; usable: no runtime figure found, the stated HBM assumed usable")


TPU_V4 = _tpu("tpu-v4", bf16_tflops=275, int8_tops=275, hbm_gib=32, hbm_gbps=1228, source="Cloud TPU v4 docs")
TPU_V5E = _tpu("tpu-v5e", bf16_tflops=197, int8_tops=394, hbm_gib=16, hbm_gbps=819, source="Cloud TPU v5e docs")
TPU_V5P = _tpu("tpu-v5p", bf16_tflops=459, int8_tops=918, hbm_gib=95, hbm_gbps=2765, source="Cloud TPU v5p docs")
TPU_V6E = _tpu("tpu-v6e", bf16_tflops=918, int8_tops=1836, hbm_gib=32, hbm_gbps=1640, efficiency=_TPU_V6E_MICROBENCH,
               source="Cloud TPU v6e (Trillium) docs; GEMM efficiency measured (yangwhale/gpu-tpu-pedia tpu/v7_perf, device "
                      "time: 0.79 of peak at 8192³)")
CPU = DeviceSpec(name="cpu", kind=DeviceKind.CPU,
                 peak_flops_per_s={"float32": 100 * GB, "bfloat16": 50 * GB},
                 hbm_bytes=24 * GIB, hbm_bytes_per_s=10 * GB,
                 efficiency=Efficiency(matmul_curve=((1e6, 0.2), (1e9, 0.5)), flash_attention=0.3, hbm=0.6, kernel_floor_s=2e-5),
                 source="this 2-core x86 host: placeholders (2 cores × ~2.5 GHz × 16 fp32 FMA lanes; DRAM), to be "
                        "replaced by the validator's micro-benchmarks")


def _cluster(device: DeviceSpec, intra: LinkSpec, inter: InterNodeFabric, *, per_node: int = 8,
             kind: IntraNodeKind = IntraNodeKind.NVSWITCH, storage: StorageSpec = ASSUMED_SHARED_STORAGE,
             host: HostSpec | None = None, node: str = "", pair_link: LinkSpec | None = None) -> ClusterSpec:
    return ClusterSpec(name=device.name, description=node, device=device, devices_per_node=per_node,
                       intra_node=IntraNodeFabric(kind=kind, link=intra, pair_link=pair_link),
                       inter_node=inter, storage=storage, host=host)


def _tpu_slice(device: DeviceSpec, ici: LinkSpec, torus: tuple[int, ...]) -> ClusterSpec:
    chips = math.prod(torus)
    return ClusterSpec(name=device.name, device=device, devices_per_node=chips,
                       intra_node=IntraNodeFabric(kind=IntraNodeKind.ICI_TORUS, link=ici, torus_dims=torus), inter_node=dcn(chips))


# Named by their part; `costmodel.hardware.clusters` adds clusters named after reference architectures.
CATALOG: dict[str, ClusterSpec] = {c.name: c for c in (
    _cluster(A100_40GB, NVLINK3, IB_HDR, host=DGX_A100_320GB_HOST),
    _cluster(A100_80GB, NVLINK3, IB_HDR, host=DGX_A100_640GB_HOST),
    # h100-sxm stands for DGX H100 nodes
    _cluster(H100_SXM, NVLINK4, IB_NDR, storage=SUPERPOD_H100_STANDARD, host=DGX_H100_HOST),
    _cluster(H200, NVLINK4, IB_NDR, host=DGX_H100_HOST),
    _cluster(H100_96GB_500W, NVLINK4, IB_NDR),
    _cluster(H100_95GB_LOWTDP, NVLINK4, IB_NDR),
    _cluster(A40, PCIE4, IB_HDR, kind=IntraNodeKind.PCIE),
    # Switched, as on a DGX-2's NVSwitch; a DGX-1's hybrid cube-mesh reaches some pairs more slowly.
    _cluster(V100, NVLINK2, IB_EDR, host=DGX2_HOST),
    _cluster(T4, PCIE3, ETH_100, per_node=4, kind=IntraNodeKind.PCIE),
    # b200 stands for DGX B200 nodes, gb200 for one GB200 NVL72 rack: 72 GPUs on one NVLink domain
    _cluster(B200, NVLINK5, DGX_B200_NETWORK, host=DGX_B200_HOST, node="A DGX B200 node (clusters.py: dgx-b200)."),
    _cluster(GB200, NVLINK5, GB200_NVL72_NETWORK, per_node=72, host=GB200_NVL72_HOST,
             node="One GB200 NVL72 rack as a node of 72 GPUs on one NVLink domain (clusters.py: gb200-nvl72)."),
    _cluster(MI300X, XGMI_MI300, MI300_NETWORK, kind=IntraNodeKind.XGMI_MESH,
             node="An 8-GPU AMD Instinct MI300X platform (OAM on one baseboard, a full xGMI mesh); one 400 Gb/s NIC per GPU."),
    _cluster(MI325X, XGMI_MI300, MI300_NETWORK, kind=IntraNodeKind.XGMI_MESH,
             node="An 8-GPU AMD Instinct MI325X platform (the MI300X platform's xGMI mesh); one 400 Gb/s NIC per GPU."),
    _cluster(L4, PCIE4, ETH_100, kind=IntraNodeKind.PCIE,
             node="8× L4 over PCIe Gen4 x16, 100 Gb/s per node (AWS EC2 g6.48xlarge and Google Cloud g2-standard-96)."),
    _cluster(L40S, PCIE4, ETH_400, kind=IntraNodeKind.PCIE,
             node="8× L40S over PCIe Gen4 x16, 400 Gb/s per node (AWS EC2 g6e.48xlarge)."),
    _cluster(A10G, PCIE4, ETH_100, kind=IntraNodeKind.PCIE,
             node="8× A10G over PCIe Gen4 x16, 100 Gb/s per node (AWS EC2 g5.48xlarge)."),
    _cluster(RTX_4090, PCIE4, ETH_100, kind=IntraNodeKind.PCIE, host=ASSUMED_PCIE4_SERVER_HOST,
             node="8× RTX 4090 over PCIe Gen4 x16 (assumed: a rented 8-GPU server; GeForce drivers disable peer-to-peer, so "
                  "NCCL stages through host memory, taken at PCIe speed, an assumption) and 100 Gb/s per node (assumed)."),
    _cluster(RTX_A6000, PCIE4, ETH_100, kind=IntraNodeKind.NVLINK_PAIRS, pair_link=NVLINK3_BRIDGE_A6000,
             node="8× RTX A6000 (assumed), GPUs 2k and 2k+1 joined by 2-way NVLink bridges, other pairs over PCIe Gen4 x16, "
                  "100 Gb/s per node (assumed)."),
    _tpu_slice(TPU_V4, ICI_V4, (4, 4, 4)),
    _tpu_slice(TPU_V5E, _ici("ici-v5e", 1600, 4), (16, 16)),
    _tpu_slice(TPU_V5P, ICI_V5P, (4, 4, 4)),
    _tpu_slice(TPU_V6E, _ici("ici-v6e", 3584, 4), (16, 16)),
    ClusterSpec(name="cpu", device=CPU, devices_per_node=1,
                intra_node=IntraNodeFabric(kind=IntraNodeKind.SHARED_MEMORY, link=LOOPBACK),
                inter_node=host_network(LOOPBACK, 1), storage=ASSUMED_LOCAL_DISK),
)}

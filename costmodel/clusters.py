"""Cluster presets named after vendor reference architectures, each fact cited in its description.

`HARDWARE` holds every built-in profile: the part-named ones of `costmodel.catalog`
(``h100-sxm``) and these (``dgx-h100``). ``dgx-a100`` and ``dgx-h100`` give the same
numbers as ``a100-80gb`` and ``h100-sxm``, which stand for those nodes.

>>> HARDWARE["dgx-h100"].inter_tier() == HARDWARE["h100-sxm"].inter_tier()
True
"""

from __future__ import annotations

from costmodel.catalog import (
    A100_80GB,
    A100_80GB_PCIE,
    CATALOG,
    DGX_A100_640GB_HOST,
    DGX_H100_HOST,
    H100_SXM,
    ICI_V4,
    ICI_V5P,
    NVLINK3,
    NVLINK4,
    PCIE4,
    TPU_V4,
    TPU_V5P,
    dcn,
)
from costmodel.fabric import InterNodeFabric, IntraNodeFabric, IntraNodeKind, LinkSpec
from costmodel.hardware import ClusterSpec
from costmodel.storage import SUPERPOD_H100_STANDARD

_SUPERPOD_A100 = ("NVIDIA DGX SuperPOD reference architecture with DGX A100 (RA-09950-001, 2020): compute fabric "
                  "rail-optimised, a non-blocking full fat tree")
_SUPERPOD_H100 = ("NVIDIA DGX SuperPOD reference architecture with DGX H100 (RA-11333-001), 'Network Fabrics': each scalable "
                  "unit of 32 nodes is rail-aligned, traffic between rails traverses the spine; as many leaf-spine as "
                  "node-leaf cables (non-blocking)")

DGX_A100 = ClusterSpec(
    name="dgx-a100",
    description="NVIDIA DGX A100 (640 GB): 8× A100-SXM4-80GB on six NVSwitches, NVLink3 600 GB/s bidirectional per GPU; "
                "8× single-port ConnectX-6 HDR 200 Gb/s InfiniBand for the compute fabric, one per GPU (NVIDIA DGX A100 "
                f"User Guide, network ports; DGX A100 datasheet). {_SUPERPOD_A100}.",
    device=A100_80GB, devices_per_node=8,
    intra_node=IntraNodeFabric(kind=IntraNodeKind.NVSWITCH, link=NVLINK3),
    inter_node=InterNodeFabric(name="ib-hdr200", nics_per_node=8, nic_gbit_per_s=200, rail_optimized=True, latency_s=5e-6,
                               efficiency=0.9, source=f"DGX A100 User Guide: 8× ConnectX-6 HDR 200 Gb/s; {_SUPERPOD_A100}"),
    host=DGX_A100_640GB_HOST,
)

DGX_H100 = ClusterSpec(
    name="dgx-h100",
    description="NVIDIA DGX H100: 8× H100-SXM5-80GB on four NVSwitches, NVLink4 900 GB/s bidirectional per GPU; four OSFP "
                "ports serving 8× single-port ConnectX-7 at 400 Gb/s NDR for the compute fabric, one per GPU (NVIDIA DGX "
                f"BasePOD reference architecture, core components; DGX H100 User Guide, network modules). {_SUPERPOD_H100}.",
    device=H100_SXM, devices_per_node=8,
    intra_node=IntraNodeFabric(kind=IntraNodeKind.NVSWITCH, link=NVLINK4),
    inter_node=InterNodeFabric(name="ib-ndr400", nics_per_node=8, nic_gbit_per_s=400, rail_optimized=True, latency_s=5e-6,
                               efficiency=0.9, source=f"DGX H100: 8× ConnectX-7 NDR 400 Gb/s; {_SUPERPOD_H100}"),
    storage=SUPERPOD_H100_STANDARD,
    host=DGX_H100_HOST,
)

NVLINK3_BRIDGE = LinkSpec(name="nvlink3-bridge", bytes_per_s=300e9, latency_s=1e-6, efficiency=0.77,
                          source="A100 PCIe datasheet: NVLink Bridge for 2 GPUs, 600 GB/s bidirectional; efficiency as NVLink3")

A100_PCIE_SERVER = ClusterSpec(
    name="a100-pcie-server",
    description="An 8-GPU PCIe server without NVSwitch: 8× A100 80GB PCIe, NVLink bridges joining GPUs 2k and 2k+1 (600 GB/s "
                "bidirectional per pair), other pairs over PCIe Gen4 x16 (64 GB/s bidirectional) (NVIDIA A100 datasheet, PCIe "
                "80GB). Four ConnectX-6 200 Gb/s compute NICs, one per two GPUs, the ratio of NVIDIA's 'PCIe Optimized 2-8-5' "
                "Enterprise Reference Architecture servers (2 CPUs, 8 GPUs, 5 network adapters; NVIDIA AI Enterprise "
                "reference architecture, compute node hardware). The leaf-spine network is taken as not rail-optimised and "
                "non-blocking: no vendor figure says otherwise.",
    device=A100_80GB_PCIE, devices_per_node=8,
    intra_node=IntraNodeFabric(kind=IntraNodeKind.NVLINK_PAIRS, link=PCIE4, pair_link=NVLINK3_BRIDGE),
    inter_node=InterNodeFabric(name="cx6-200g", nics_per_node=4, nic_gbit_per_s=200, rail_optimized=False, latency_s=5e-6,
                               efficiency=0.9, source="4× ConnectX-6 200 Gb/s per 8 GPUs (PCIe Optimized 2-8-5 ratio)"),
)

TPU_V4_POD = ClusterSpec(
    name="tpu-v4-pod",
    description="A full Cloud TPU v4 pod as one slice: 4096 chips in a 16x16x16 ICI 3D torus (Cloud TPU v4 docs: pod size "
                "4096 chips, 3D torus slices); pods joined by the data-centre network (multislice).",
    device=TPU_V4, devices_per_node=4096,
    intra_node=IntraNodeFabric(kind=IntraNodeKind.ICI_TORUS, link=ICI_V4, torus_dims=(16, 16, 16)),
    inter_node=dcn(4096),
)

TPU_V5P_POD = ClusterSpec(
    name="tpu-v5p-pod",
    description="The largest Cloud TPU v5p slice: 6144 chips (96 cubes) in a 16x16x24 ICI 3D torus, of a pod's 8960 chips "
                "(Cloud TPU v5p docs: 'The maximum v5p shape is 16x16x24'; DCN 50 Gbps per chip); slices joined by the "
                "data-centre network (multislice).",
    device=TPU_V5P, devices_per_node=6144,
    intra_node=IntraNodeFabric(kind=IntraNodeKind.ICI_TORUS, link=ICI_V5P, torus_dims=(16, 16, 24)),
    inter_node=dcn(6144),
)

CLUSTERS: dict[str, ClusterSpec] = {c.name: c for c in (DGX_A100, DGX_H100, A100_PCIE_SERVER, TPU_V4_POD, TPU_V5P_POD)}
HARDWARE: dict[str, ClusterSpec] = {**CATALOG, **CLUSTERS}

"""Cluster presets named after vendor reference architectures, each fact cited in its description.

`HARDWARE` holds every built-in profile: the part-named ones of `costmodel.hardware.catalog`
(``h100-sxm``) and these (``dgx-h100``). ``dgx-a100``, ``dgx-h100``, ``dgx-b200`` and
``gb200-nvl72`` give the same numbers as ``a100-80gb``, ``h100-sxm``, ``b200`` and ``gb200``,
which stand for those nodes (a GB200 NVL72 rack is one node of 72 GPUs: its NVLink domain). A site cluster with
several node types, such as C3SE's Alvis, is one preset per node type (``alvis-a100``,
``alvis-t4``, ...): a `ClusterSpec` holds one device, and a job runs on one node type.

>>> HARDWARE["dgx-h100"].inter_tier() == HARDWARE["h100-sxm"].inter_tier()
True
>>> HARDWARE["gb200-nvl72"].devices_per_node
72
"""

from __future__ import annotations

from costmodel.hardware.catalog import (
    A40,
    A100_40GB,
    A100_80GB,
    A100_80GB_PCIE,
    B200,
    CATALOG,
    DGX_A100_640GB_HOST,
    DGX_B200_HOST,
    DGX_B200_NETWORK,
    DGX_H100_HOST,
    GB200,
    GB200_NVL72_HOST,
    GB200_NVL72_NETWORK,
    H100_SXM,
    ICI_V4,
    ICI_V5P,
    NVLINK2,
    NVLINK3,
    NVLINK4,
    NVLINK5,
    PCIE3,
    PCIE4,
    T4,
    TPU_V4,
    TPU_V5P,
    V100,
    dcn,
)
from costmodel.hardware.fabric import InterNodeFabric, IntraNodeFabric, IntraNodeKind, LinkSpec
from costmodel.hardware.profile import ClusterSpec, DeviceSpec
from costmodel.hardware.storage import SUPERPOD_H100_STANDARD

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

DGX_B200 = ClusterSpec(
    name="dgx-b200",
    description="NVIDIA DGX B200: 8× B200 (1,440 GB HBM3e in all) on two 5th-generation NVLink switches, 14.4 TB/s aggregate "
                "(1.8 TB/s bidirectional per GPU); 4 OSFP ports serving 8× single-port ConnectX-7 at up to 400 Gb/s "
                "InfiniBand, one per GPU; 2× Xeon Platinum 8570, 2 TB memory (NVIDIA DGX B200 User Guide, 'Introduction to "
                "NVIDIA DGX B200 Systems', docs.nvidia.com/dgx/dgxb200-user-guide). The compute fabric taken as the DGX "
                "SuperPOD's: rail-optimised, non-blocking (assumed from the H100 reference architecture).",
    device=B200, devices_per_node=8,
    intra_node=IntraNodeFabric(kind=IntraNodeKind.NVSWITCH, link=NVLINK5),
    inter_node=DGX_B200_NETWORK,
    host=DGX_B200_HOST,
)

GB200_NVL72 = ClusterSpec(
    name="gb200-nvl72",
    description="NVIDIA GB200 NVL72: one rack of 36 GB200 superchips (36 Grace CPUs, 72 Blackwell GPUs) on one NVLink "
                "domain, NVLink switch trays giving every GPU 1.8 TB/s bidirectional to any other, 130 TB/s in all (GB200 "
                "NVL72 datasheet, nvidia.com/en-us/data-center/gb200-nvl72): modelled as one node of 72 devices on NVSwitch, "
                "so tensor and expert axes of up to 72 stay on NVLink. Racks joined by one ConnectX-7 400 Gb/s InfiniBand "
                "NIC per GPU (DGX GB200: 72 single-port ConnectX-7 per rack), rail-optimised and non-blocking (assumed, as "
                "the DGX SuperPOD reference architectures).",
    device=GB200, devices_per_node=72,
    intra_node=IntraNodeFabric(kind=IntraNodeKind.NVSWITCH, link=NVLINK5),
    inter_node=GB200_NVL72_NETWORK,
    host=GB200_NVL72_HOST,
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

# --- C3SE Alvis (Chalmers), one preset per node type ------------------------------------------
# Sources: the issue's summary ("4x A100 nodes on 100 Gb/s InfiniBand; A40, V100 and T4 nodes on
# 25 Gb/s Ethernet"); NAISS training material's table of Alvis node types (RAM per node, GPUs
# per node, "A40 (4, no IB)"; cores: 16/32 Skylake for V100/T4, 64 Ice Lake for A40/A100);
# users' `sinfo`/`nvidia-smi` output (alvis3 nodes: gpu:A100:4 with 256/512 GB, gpu:A100fat:4
# with 1024 GB, "NVIDIA A100-SXM4-80GB"); c3se/alvis-intro benchmark files named
# "Tesla V100-SXM2-32GB". C3SE's own hardware page was not among the stored documents, so the
# NIC counts, the A40/T4 PCIe generation and the A100 baseboard are assumptions, said so below.
_ALVIS = "C3SE Alvis (Chalmers, NAISS)"
_ALVIS_IB100 = InterNodeFabric(
    name="ib-100g", nics_per_node=1, nic_gbit_per_s=100, rail_optimized=False, latency_s=5e-6, efficiency=0.9,
    source=f"{_ALVIS}: A100 nodes on 100 Gb/s InfiniBand (issue 21); one HCA per node and a non-blocking fabric assumed")
_ALVIS_ETH25 = InterNodeFabric(
    name="eth-25g", nics_per_node=1, nic_gbit_per_s=25, rail_optimized=False, latency_s=20e-6, efficiency=0.8,
    source=f"{_ALVIS}: A40, V100 and T4 nodes on 25 Gb/s Ethernet, no InfiniBand (issue 21; NAISS table: 'A40 (4, no IB)'); "
           "one port per node and a non-blocking network assumed")
_HGX4_NVLINK = ("NVLink3 on a 4-GPU HGX A100 baseboard (assumed from the SXM4 part: no NVSwitch, every pair joined by "
                "4 links, 100 GB/s per direction; modelled as switched at 300 GB/s per direction, which a group of all 4 "
                "reaches over NCCL's rings through the three peers and a 2-GPU group does not)")


def _alvis(name: str, device: DeviceSpec, *, per_node: int, node: str, intra: IntraNodeFabric,
           inter: InterNodeFabric) -> ClusterSpec:
    return ClusterSpec(name=name, description=f"{_ALVIS}, {node}", device=device, devices_per_node=per_node,
                       intra_node=intra, inter_node=inter)


ALVIS_A100 = _alvis(
    "alvis-a100", A100_40GB, per_node=4, intra=IntraNodeFabric(kind=IntraNodeKind.NVSWITCH, link=NVLINK3), inter=_ALVIS_IB100,
    node="A100 nodes (Slurm gres 'A100'): 4× A100 40 GB per node (the 80 GB ones are 'A100fat', alvis-a100fat), 64 Ice "
         f"Lake cores, 256 or 512 GB host memory (NAISS table; sinfo); {_HGX4_NVLINK}; one 100 Gb/s InfiniBand HCA per "
         "node (the issue's 100 Gb/s; the count assumed).")
ALVIS_A100FAT = _alvis(
    "alvis-a100fat", A100_80GB, per_node=4, intra=IntraNodeFabric(kind=IntraNodeKind.NVSWITCH, link=NVLINK3),
    inter=_ALVIS_IB100,
    node="A100fat nodes: 4× A100-SXM4-80GB per node (nvidia-smi on alvis3 nodes), 64 Ice Lake cores, 1024 GB host memory "
         f"(NAISS table: mem1024; sinfo); {_HGX4_NVLINK}; one 100 Gb/s InfiniBand HCA per node (count assumed).")
ALVIS_A40 = _alvis(
    "alvis-a40", A40, per_node=4, intra=IntraNodeFabric(kind=IntraNodeKind.PCIE, link=PCIE4), inter=_ALVIS_ETH25,
    node="A40 nodes: 4× A40 48 GB per node, 64 Ice Lake cores, 256 GB host memory, no InfiniBand (NAISS table); GPUs "
         "joined over PCIe Gen4 x16 (the A40's host interface; no NVLink bridges assumed); 25 Gb/s Ethernet (issue 21).")
ALVIS_V100 = _alvis(
    "alvis-v100", V100, per_node=4, intra=IntraNodeFabric(kind=IntraNodeKind.NVSWITCH, link=NVLINK2), inter=_ALVIS_ETH25,
    node="V100 nodes: 4× Tesla V100-SXM2-32GB per node (c3se/alvis-intro result files; some nodes have 2, NAISS table), "
         "32 Skylake cores, 768 GB host memory (NAISS table); NVLink2 between the SXM2 GPUs, modelled as switched at "
         "150 GB/s per direction as the v100 profile does (the 4-GPU SXM2 topology assumed all-to-all); 25 Gb/s "
         "Ethernet (issue 21).")
ALVIS_T4 = _alvis(
    "alvis-t4", T4, per_node=8, intra=IntraNodeFabric(kind=IntraNodeKind.PCIE, link=PCIE3), inter=_ALVIS_ETH25,
    node="T4 nodes: 8× T4 16 GB per node, 32 Skylake cores, 576 GB host memory (NAISS table); PCIe Gen3 x16 (the T4's "
         "host interface); 25 Gb/s Ethernet (issue 21).")
ALVIS = (ALVIS_A100, ALVIS_A100FAT, ALVIS_A40, ALVIS_V100, ALVIS_T4)

CLUSTERS: dict[str, ClusterSpec] = {c.name: c for c in (DGX_A100, DGX_H100, DGX_B200, GB200_NVL72, A100_PCIE_SERVER, TPU_V4_POD,
                                                         TPU_V5P_POD, *ALVIS)}
HARDWARE: dict[str, ClusterSpec] = {**CATALOG, **CLUSTERS}

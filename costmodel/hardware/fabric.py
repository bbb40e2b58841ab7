"""What connects devices: the fabric inside a node, the network between nodes, and the
link tiers the collective model derives from them.

Inside a node devices meet over NVSwitch (every pair at full NVLink bandwidth), NVLink
bridges between pairs (other pairs over PCIe), PCIe alone, a TPU slice's ICI torus, AMD's
xGMI mesh (Infinity Fabric links joining every pair of an 8-GPU platform directly), or
host memory for emulated devices. Between nodes each node has NICs; a device gets its
share of them, ``nics_per_node × nic_gbit_per_s / devices_per_node``, since every device
of a node runs its collectives at once.

Rail-optimised networks (NVIDIA's DGX SuperPOD) cable NIC *i* of every node to the same
leaf switch, rail *i*: traffic between same-rank devices of different nodes is one hop
away, and the collective model's inter-node phase (member *j* of one node to member *j*
of the next) is such traffic when the group is rail-aligned. Traffic between rails, and
all inter-node traffic of a network that is not rail-optimised (a node's NICs on one
top-of-rack leaf), crosses the spine: it gets ``1 / spine_oversubscription`` of the NIC
rate, where the oversubscription is the leaves' downlink over uplink bandwidth (1 for a
non-blocking fat tree, which then costs nothing more in this model).

>>> ib = InterNodeFabric(name="ib-ndr400", nics_per_node=8, nic_gbit_per_s=400, rail_optimized=True,
...                      latency_s=5e-6, efficiency=0.9, source="DGX H100")
>>> ib.bytes_per_s_per_device(devices_per_node=8)  # 8 × 400 Gb/s shared by 8 GPUs
50000000000.0
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, PositiveInt, model_validator

from costmodel.step.collectives import Tier
from costmodel.step.roofline import MIN_EFFICIENCY

# A floor no link or memory comes near (a CPU core does GB/s), so that seconds computed from a
# profile stay finite: a fuzzed profile of 1e-300 rates divided by zero.
ByteRate = Annotated[float, Field(ge=1e3)]
# More devices (or NICs) than any cluster this project plans for; also keeps the count a float can hold.
MAX_PER_NODE = 2**24
_BYTES_PER_GBIT = 1e9 / 8


class LinkSpec(BaseModel):
    """One link as one device sees it: bandwidth per direction, latency, NCCL/XLA efficiency."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)  # a profile is finite numbers

    name: str = Field(description="e.g. 'nvlink3', 'pcie4-x16', 'ici-v5p'.")
    bytes_per_s: ByteRate = Field(description="Peak bandwidth per device, per direction.")
    latency_s: NonNegativeFloat = Field(description="Per-hop latency of a collective step (alpha).")
    efficiency: float = Field(0.8, ge=MIN_EFFICIENCY, le=1, description="Fraction of bytes_per_s collectives reach on large messages.")
    source: str = Field(description="Where the numbers come from.")


class IntraNodeKind(StrEnum):
    """How the devices of one node reach each other."""

    NVSWITCH = "nvswitch"
    NVLINK_PAIRS = "nvlink-pairs"
    PCIE = "pcie"
    ICI_TORUS = "ici-torus"
    SHARED_MEMORY = "shared-memory"
    # One Infinity Fabric link between every pair of GPUs (AMD Instinct platforms). Its `link` is the
    # device's links together, what a group of all the node's devices reaches over RCCL's rings; a
    # smaller group crosses fewer links, which this kind does not model (the link's source says so).
    XGMI_MESH = "xgmi-mesh"


# How each kind's `IntraNodeFabric.link` reads (for nvlink-pairs that link is PCIe; the bridge is pair_link).
_KIND_WORDS = {IntraNodeKind.NVSWITCH: "NVSwitch", IntraNodeKind.NVLINK_PAIRS: "PCIe", IntraNodeKind.PCIE: "PCIe",
               IntraNodeKind.ICI_TORUS: "ICI torus", IntraNodeKind.SHARED_MEMORY: "host memory",
               IntraNodeKind.XGMI_MESH: "xGMI mesh"}


class IntraNodeFabric(BaseModel):
    """The fabric inside a node (a TPU slice): its kind and the link each device uses on it."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    kind: IntraNodeKind = Field(description="nvswitch, nvlink-pairs, pcie, ici-torus, shared-memory or xgmi-mesh.")
    link: LinkSpec = Field(description="What a device uses to reach any other in the node: an NVSwitch port, PCIe, one "
                                       "ICI torus link, host memory (for nvlink-pairs: the PCIe path between unbridged GPUs).")
    pair_link: LinkSpec | None = Field(None, description="nvlink-pairs only: the NVLink bridge between devices 2k and 2k+1.")
    torus_dims: tuple[PositiveInt, ...] = Field((), description="ici-torus only: the slice's torus shape (its rings wrap around).")

    @model_validator(mode="after")
    def _kind_has_its_parts(self) -> IntraNodeFabric:
        if (self.pair_link is not None) != (self.kind is IntraNodeKind.NVLINK_PAIRS):
            raise ValueError("pair_link is given exactly when kind is nvlink-pairs")
        if bool(self.torus_dims) != (self.kind is IntraNodeKind.ICI_TORUS):
            raise ValueError("torus_dims is given exactly when kind is ici-torus")
        return self

    @property
    def wraparound(self) -> bool:
        return self.kind is IntraNodeKind.ICI_TORUS

    def link_for(self, *, pair: bool = False) -> LinkSpec:
        """The link a group uses: the bridge for a bridged pair (devices 2k, 2k+1), else `link`."""
        return self.pair_link if pair and self.pair_link is not None else self.link

    def tier(self, *, pair: bool = False) -> Tier:
        """The collective model's view of `link_for` (torus rings run both ways)."""
        link = self.link_for(pair=pair)
        return Tier(bytes_per_s=link.bytes_per_s * link.efficiency, latency_s=link.latency_s, bidirectional_ring=self.wraparound,
                    torus_dims=self.torus_dims)

    @property
    def unit(self) -> str:
        """What a node is called: a TPU slice or a node."""
        return "slice" if self.wraparound else "node"

    def describe(self, *, pair: bool = False) -> str:
        """``NVSwitch (nvlink4)``, ``NVLink bridge (nvlink3-bridge)``, ``ICI torus 16x16x24 (ici-v5p)``, ..."""
        words = "NVLink bridge" if pair and self.pair_link is not None else _KIND_WORDS[self.kind]
        shape = f" {'x'.join(map(str, self.torus_dims))}" if self.torus_dims else ""
        return f"{words}{shape} ({self.link_for(pair=pair).name})"

    def summary(self) -> str:
        """The fabric and its links' peak bandwidth per direction, e.g. ``NVSwitch (nvlink4) at 450 GB/s``."""
        text = f"{self.describe()} at {self.link.bytes_per_s / 1e9:g} GB/s"
        if self.pair_link is not None:
            text += f", pairs over {self.describe(pair=True)} at {self.pair_link.bytes_per_s / 1e9:g} GB/s"
        return text


class InterNodeFabric(BaseModel):
    """The network between nodes: how many NICs a node has, their speed, and how they are cabled."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str = Field(description="e.g. 'ib-hdr200', 'ib-ndr400', 'roce-400g', 'dcn'.")
    nics_per_node: PositiveInt = Field(le=MAX_PER_NODE, description="NICs of the compute network per node (for a TPU slice: "
                                                                    "its hosts' DCN NICs); storage and management NICs not counted.")
    nic_gbit_per_s: float = Field(ge=1e-5, le=1e9, description="Line rate of one NIC per direction in Gb/s (1e9 bit/s), as "
                                                              "vendors quote it: 200 for HDR InfiniBand, 400 for NDR.")
    rail_optimized: bool = Field(description="NIC i of every node on the same leaf switch (rail i), so same-rank devices of "
                                             "different nodes are one hop apart; false for a node's NICs on one top-of-rack leaf.")
    spine_oversubscription: float = Field(1.0, ge=1, le=1000, description="Leaf switches' downlink over uplink bandwidth: "
                                                                          "traffic through the spine gets 1/this of the NIC rate; "
                                                                          "1 for a non-blocking fat tree.")
    latency_s: NonNegativeFloat = Field(description="Per-message latency of a collective step across nodes (alpha).")
    efficiency: float = Field(0.8, ge=MIN_EFFICIENCY, le=1, description="Fraction of the NIC rate collectives reach on large messages.")
    source: str = Field(description="Where the numbers come from.")

    def through_spine(self, *, rail_aligned: bool) -> bool:
        """Whether traffic between members of different nodes crosses the spine."""
        return not (self.rail_optimized and rail_aligned)

    def bytes_per_s_per_device(self, devices_per_node: int, *, rail_aligned: bool = True) -> float:
        """Peak bytes/s one device gets across nodes, per direction: its share of the node's NICs,
        divided by the spine's oversubscription where its traffic crosses the spine."""
        share = self.nics_per_node * self.nic_gbit_per_s * _BYTES_PER_GBIT / devices_per_node
        return share / self.spine_oversubscription if self.through_spine(rail_aligned=rail_aligned) else share

    def tier(self, devices_per_node: int, *, rail_aligned: bool = True) -> Tier:
        """The collective model's view of the network for one device.

        >>> net = InterNodeFabric(name="roce", nics_per_node=4, nic_gbit_per_s=400, rail_optimized=False,
        ...                       spine_oversubscription=2, latency_s=1e-5, efficiency=1.0, source="example")
        >>> net.tier(8).bytes_per_s / 1e9  # 4 × 400 Gb/s over 8 GPUs, halved by a 2:1 spine
        12.5
        """
        per_device = self.bytes_per_s_per_device(devices_per_node, rail_aligned=rail_aligned)
        return Tier(bytes_per_s=per_device * self.efficiency, latency_s=self.latency_s)

    def describe(self, *, rail_aligned: bool = True) -> str:
        """``8× 400 Gb/s NICs each, rail-aligned``, or where the traffic crosses the spine."""
        if not self.through_spine(rail_aligned=rail_aligned):
            return f"{self._nics()} each, rail-aligned"
        why = "across rails" if self.rail_optimized else "not rail-optimised"
        return f"{self._nics()} each, through the spine ({why}{self._oversubscribed()})"

    def summary(self, devices_per_node: int) -> str:
        """The NICs, their cabling and one device's share, e.g. ``8× 400 Gb/s NICs (ib-ndr400), rail-optimised, 50 GB/s per device``."""
        cabling = "rail-optimised" if self.rail_optimized else "not rail-optimised"
        return (f"{self._nics()} ({self.name}), {cabling}{self._oversubscribed()}, "
                f"{self.bytes_per_s_per_device(devices_per_node) / 1e9:g} GB/s per device")

    def _nics(self) -> str:
        return f"{self.nics_per_node}× {self.nic_gbit_per_s:g} Gb/s NIC{'s' if self.nics_per_node > 1 else ''}"

    def _oversubscribed(self) -> str:
        return f", spine {self.spine_oversubscription:g}:1 oversubscribed" if self.spine_oversubscription > 1 else ""


def host_network(link: LinkSpec, devices_per_node: int) -> InterNodeFabric:
    """A stand-in network for emulated devices of one host, each as fast as ``link`` (one "NIC" per device).

    >>> loop = LinkSpec(name="shared-memory", bytes_per_s=5e9, latency_s=2e-5, source="placeholder")
    >>> host_network(loop, 4).bytes_per_s_per_device(4)
    5000000000.0
    """
    return InterNodeFabric(name=link.name, nics_per_node=devices_per_node, nic_gbit_per_s=link.bytes_per_s / _BYTES_PER_GBIT,
                           rail_optimized=True, latency_s=link.latency_s, efficiency=link.efficiency, source=link.source)

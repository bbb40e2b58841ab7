"""Device meshes: parse ``8x4`` / ``data=8,tensor=4``, and tell what each axis crosses.

Devices are numbered row-major (the last axis varies fastest) and packed node by node,
as ``jax.make_mesh`` lays out a host's devices. So on 8-GPU nodes the last axis of a
``4x8`` mesh stays inside a node (NVLink) and the first crosses nodes (InfiniBand).

>>> mesh = parse_mesh("data=4,tensor=8")
>>> mesh.n_devices, mesh.shape
(32, {'data': 4, 'tensor': 8})
"""

from __future__ import annotations

import math
import re

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

from costmodel.errors import InvalidConfigError
from costmodel.hardware.profile import ClusterSpec
from costmodel.hardware.topology import placement

_EXAMPLE = "e.g. --mesh 8x4 or --mesh data=8,tensor=4"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class MeshSpec(BaseModel):
    """A device mesh by shape only (names and sizes), like ``jax.sharding.AbstractMesh``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    axis_names: tuple[str, ...] = Field(description="Axis names, major first.")
    axis_sizes: tuple[PositiveInt, ...] = Field(description="Devices along each axis.")

    @model_validator(mode="after")
    def _names_match_sizes(self) -> MeshSpec:
        if len(self.axis_names) != len(self.axis_sizes) or len(set(self.axis_names)) != len(self.axis_names):
            raise InvalidConfigError(f"mesh axes {self.axis_names} do not match sizes {self.axis_sizes} one to one",
                                     fix="give each axis a unique name and one size")
        return self

    @property
    def n_devices(self) -> int:
        return math.prod(self.axis_sizes)

    @property
    def shape(self) -> dict[str, int]:
        return dict(zip(self.axis_names, self.axis_sizes))


def parse_mesh(text: str) -> MeshSpec:
    """``"8x4"`` (axes named axis0, axis1, ...), ``"32"``, or ``"data=8,tensor=4"``.

    Raises:
      InvalidConfigError: anything else, with an example of a valid mesh.
    """
    text = text.strip()
    if "=" in text:
        names, sizes = [], []
        for part in text.split(","):
            name, _, size = part.partition("=")
            name = name.strip()
            if not _NAME.match(name):
                raise InvalidConfigError(f"mesh axis name {name!r} in {text!r} is not an identifier", fix=_EXAMPLE)
            names.append(name)
            sizes.append(_size(size, text))
        if len(set(names)) != len(names):
            raise InvalidConfigError(f"mesh {text!r} repeats an axis name", fix="name each axis once, " + _EXAMPLE)
        return MeshSpec(axis_names=tuple(names), axis_sizes=tuple(sizes))
    sizes = [_size(part, text) for part in text.lower().split("x")]
    return MeshSpec(axis_names=tuple(f"axis{i}" for i in range(len(sizes))), axis_sizes=tuple(sizes))


def _size(part: str, text: str) -> int:
    part = part.strip()
    if not (part.isascii() and part.isdigit()) or int(part) < 1:
        raise InvalidConfigError(f"mesh {text!r}: {part!r} is not a positive axis size", fix=_EXAMPLE)
    return int(part)


class AxisLink(BaseModel):
    """How one mesh axis's groups are wired, and the bandwidth the collective model gives them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tiers: tuple[str, ...] = Field(description="Link tiers its neighbours cross, fastest first.")
    crosses: str = Field(description="What its groups cross, in words: the fabric inside a node, then the NICs between nodes.")
    bottleneck_bytes_per_s: PositiveFloat = Field(description="Slowest crossed link's peak bandwidth per device, per direction.")
    latency_s: float = Field(description="Latency of the slowest crossed link.")
    devices_per_group: PositiveInt = Field(description="Devices in one group along this axis.")
    members_per_node: PositiveInt = Field(description="Members of one group that share a node.")
    nodes_per_group: PositiveInt = Field(description="Nodes (TPU slices) one group spans.")
    rail_aligned: bool | None = Field(description="Across nodes: whether members that exchange data have the same local rank "
                                                  "(one rail); None within a node.")
    intra_bytes_per_s: float | None = Field(description="Bandwidth per device per direction the collective model uses inside a "
                                                        "node (peak × efficiency); None if no two members share a node.")
    inter_bytes_per_s: float | None = Field(description="Bandwidth per device per direction the collective model uses across "
                                                        "nodes (NIC share × efficiency, ÷ spine oversubscription where it "
                                                        "crosses the spine); None within a node.")
    wraparound: bool = Field(description="A TPU torus ring with wrap-around links.")


def axis_links(mesh: MeshSpec, cluster: ClusterSpec) -> dict[str, AxisLink]:
    """For each axis of ``mesh`` on ``cluster``, the links its groups cross (as `costmodel.hardware.topology` places them).

    >>> from costmodel.hardware.registry import load_hardware
    >>> links = axis_links(parse_mesh("4x8"), load_hardware("h100-sxm"))
    >>> links["axis1"].tiers, links["axis0"].tiers
    (('nvlink4',), ('ib-ndr400',))
    >>> links["axis0"].crosses
    'across 4 nodes over 8× 400 Gb/s NICs each, rail-aligned'
    """
    per_node, intra, inter = cluster.devices_per_node, cluster.intra_node, cluster.inter_node
    links, stride = {}, 1
    for name, size in reversed(list(zip(mesh.axis_names, mesh.axis_sizes))):
        where = placement(size, stride, per_node)
        in_node, across = where.per_node > 1, where.n_nodes > 1
        link = intra.link_for(pair=where.pair)
        parts, tiers = [], []
        if in_node:
            tiers.append(link.name)
            parts.append(f"{where.per_node} per {intra.unit} over {intra.describe(pair=where.pair)}" if across
                         else f"within a {intra.unit} over {intra.describe(pair=where.pair)}")
        if across:
            tiers.append(inter.name)
            parts.append(f"across {where.n_nodes} {intra.unit}s over {inter.describe(rail_aligned=where.rail_aligned)}")
        peak, latency_s = ((inter.bytes_per_s_per_device(per_node, rail_aligned=where.rail_aligned), inter.latency_s) if across
                           else (link.bytes_per_s, link.latency_s))
        links[name] = AxisLink(
            tiers=tuple(tiers), crosses=", then ".join(parts) or "nothing (one device)", bottleneck_bytes_per_s=peak,
            latency_s=latency_s, devices_per_group=size, members_per_node=where.per_node, nodes_per_group=where.n_nodes,
            rail_aligned=where.rail_aligned if across else None,
            intra_bytes_per_s=cluster.intra_tier(pair=where.pair).bytes_per_s if in_node else None,
            inter_bytes_per_s=cluster.inter_tier(rail_aligned=where.rail_aligned).bytes_per_s if across else None,
            wraparound=cluster.wraparound and not across and size > 1,
        )
        stride *= size
    return {name: links[name] for name in mesh.axis_names}


def mesh_shapes_for(n_devices: int, n_axes: int) -> list[tuple[int, ...]]:
    """Every ordered factorisation of ``n_devices`` into ``n_axes`` sizes, sorted.

    >>> mesh_shapes_for(8, 2)
    [(1, 8), (2, 4), (4, 2), (8, 1)]
    """
    if n_axes == 1:
        return [(n_devices,)]
    shapes = []
    for first in range(1, n_devices + 1):
        if n_devices % first == 0:
            shapes += [(first, *rest) for rest in mesh_shapes_for(n_devices // first, n_axes - 1)]
    return sorted(shapes)

"""Which devices talk to which: a layout's parallel groups on a cluster's nodes.

Devices are numbered row-major over the mesh ``(pp, dp, cp, tp)`` (tensor fastest, as
Megatron-LM and torchtitan order them) and packed node by node. A group of one parallel
dimension has stride = product of the faster dimensions; it keeps
``devices_per_node // stride`` members per node (at least one), so a tensor-parallel
group of 8 fills an 8-GPU node and its data-parallel groups have one member per node.

>>> from costmodel.collectives import Tier
>>> nv, ib = Tier(bytes_per_s=3e11, latency_s=0), Tier(bytes_per_s=2.5e10, latency_s=0)
>>> g = layout_groups(Layout(dp=4, tp=8), devices_per_node=8, intra=nv, inter=ib)
>>> (g["tp"].n, g["tp"].n_nodes), (g["dp"].n, g["dp"].n_nodes)
((8, 1), (4, 4))
"""

from __future__ import annotations

from costmodel.collectives import Group, Tier
from costmodel.layout import Layout

# Mesh axes from fastest to slowest varying.
AXIS_ORDER = ("tp", "cp", "dp", "pp")


def _group(size: int, stride: int, devices_per_node: int, intra: Tier, inter: Tier) -> Group:
    per_node = max(1, min(size, devices_per_node // stride)) if stride < devices_per_node else 1
    return Group(n=size, n_nodes=max(1, -(-size // per_node)), intra=intra, inter=inter)


def layout_groups(layout: Layout, *, devices_per_node: int, intra: Tier, inter: Tier) -> dict[str, Group]:
    """The communicating group of each parallel dimension (tp, cp, dp, pp, ep)."""
    sizes = {"tp": layout.tp, "cp": layout.cp, "dp": layout.dp, "pp": layout.pp}
    groups, stride = {}, 1
    for axis in AXIS_ORDER:
        groups[axis] = _group(sizes[axis], stride, devices_per_node, intra, inter)
        stride *= sizes[axis]
    # Experts are spread over the fastest ep devices of the data(·context) group.
    groups["ep"] = _group(layout.ep, layout.tp, devices_per_node, intra, inter)
    return groups


def mesh_groups(axes: list[tuple[str, int]], *, devices_per_node: int, intra: Tier, inter: Tier) -> dict[str, Group]:
    """The group along each named axis of a device mesh, major axis first (the last varies fastest).

    >>> from costmodel.collectives import Tier
    >>> nv, ib = Tier(bytes_per_s=3e11, latency_s=0), Tier(bytes_per_s=2.5e10, latency_s=0)
    >>> g = mesh_groups([("data", 4), ("tensor", 8)], devices_per_node=8, intra=nv, inter=ib)
    >>> (g["tensor"].n_nodes, g["data"].n_nodes)
    (1, 4)
    """
    groups, stride = {}, 1
    for name, size in reversed(axes):
        groups[name] = _group(size, stride, devices_per_node, intra, inter)
        stride *= size
    return {name: groups[name] for name, _ in axes}


def link_between_stages(layout: Layout, *, devices_per_node: int, intra: Tier, inter: Tier) -> Tier:
    """The tier a pipeline send crosses: stages are tp·cp·dp devices apart."""
    return intra if layout.tp * layout.cp * layout.dp < devices_per_node else inter

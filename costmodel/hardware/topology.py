"""Which devices talk to which: a layout's parallel groups on a cluster's nodes.

Devices are numbered row-major over the mesh ``(pp, dp, cp, tp)`` (tensor fastest, as
Megatron-LM and torchtitan order them) and packed node by node. A group of one parallel
dimension has stride = product of the faster dimensions; it keeps
``devices_per_node // stride`` members per node (at least one), so a tensor-parallel
group of 8 fills an 8-GPU node and its data-parallel groups have one member per node.

Two optional tiers refine the picture (`costmodel.hardware.fabric` says where they come from):
``intra_pair``, an NVLink bridge that a group of two neighbours (devices 2k, 2k+1) uses
instead of PCIe, and ``inter_cross_rail``, the spine path that a group's inter-node
phase takes when its members in different nodes have different local ranks.

>>> from costmodel.step.collectives import Tier
>>> nv, ib = Tier(bytes_per_s=3e11, latency_s=0), Tier(bytes_per_s=2.5e10, latency_s=0)
>>> g = layout_groups(Layout(dp=4, tp=8), devices_per_node=8, intra=nv, inter=ib)
>>> (g["tp"].n, g["tp"].n_nodes), (g["dp"].n, g["dp"].n_nodes)
((8, 1), (4, 4))
"""

from __future__ import annotations

from typing import NamedTuple

from costmodel.inputs.layout import Layout
from costmodel.step.collectives import Group, Tier, torus_ring_steps

# Mesh axes from fastest to slowest varying.
AXIS_ORDER = ("tp", "cp", "dp", "pp")


class Placement(NamedTuple):
    """How one group of devices ``stride`` apart sits on the nodes."""

    per_node: int  # members sharing a node
    n_nodes: int  # nodes the group spans
    rail_aligned: bool  # members in different nodes that exchange data have the same local rank
    pair: bool  # the members in a node are neighbours 2k, 2k+1


def placement(size: int, stride: int, devices_per_node: int) -> Placement:
    """Where a group of ``size`` devices, ``stride`` apart, lands on nodes of ``devices_per_node``.

    >>> placement(8, 4, 8)  # a data-parallel group beside tensor parallelism of 4
    Placement(per_node=2, n_nodes=4, rail_aligned=True, pair=False)
    >>> placement(4, 3, 8).rail_aligned  # ranks 0, 3 | 6, 9 = rank 1 of the next node
    False
    >>> placement(9, 16, 72).n_nodes  # ranks 0-64 | 80-128: a stride that does not divide the node
    2
    """
    per_node = max(1, min(size, devices_per_node // stride)) if stride < devices_per_node else 1
    # The inter-node phase pairs member j of one node with member j of the next, per_node·stride
    # devices on: the same local rank exactly when that distance is whole nodes.
    rail_aligned = per_node * stride % devices_per_node == 0
    # A stride shorter than a node leaves no node of the span without a member.
    n_nodes = (size - 1) * stride // devices_per_node + 1 if stride < devices_per_node else size
    return Placement(per_node, n_nodes, rail_aligned, pair=per_node == 2 and stride == 1)


class _Tiers(NamedTuple):
    devices_per_node: int
    intra: Tier
    inter: Tier
    intra_pair: Tier | None
    inter_cross_rail: Tier | None

    def group(self, size: int, stride: int) -> Group:
        where = placement(size, stride, self.devices_per_node)
        intra = self.intra_pair if where.pair and self.intra_pair else self.intra
        inter = self.inter if where.rail_aligned or self.inter_cross_rail is None else self.inter_cross_rail
        steps = torus_ring_steps(size, stride, intra.torus_dims) if intra.torus_dims and where.n_nodes == 1 else None
        return Group(n=size, n_nodes=where.n_nodes, intra=intra, inter=inter, ring_steps=steps)


def layout_groups(layout: Layout, *, devices_per_node: int, intra: Tier, inter: Tier, intra_pair: Tier | None = None,
                  inter_cross_rail: Tier | None = None) -> dict[str, Group]:
    """The communicating group of each parallel dimension (tp, cp, dp, pp, ep); ``dp_cp``, the data and
    context ranks together, over which the gradients are summed (each context rank holds every weight,
    its gradient from its own tokens); ``zero``, those ZeRO shards over (`Layout.zero_shards`)."""
    tiers = _Tiers(devices_per_node, intra, inter, intra_pair, inter_cross_rail)
    sizes = {"tp": layout.tp, "cp": layout.cp, "dp": layout.dp, "pp": layout.pp}
    groups, stride = {}, 1
    for axis in AXIS_ORDER:
        groups[axis] = tiers.group(sizes[axis], stride)
        stride *= sizes[axis]
    # The context ranks sit inside the data ranks' stride: both together are one contiguous group.
    groups["dp_cp"] = tiers.group(layout.dp * layout.cp, layout.tp)
    groups["zero"] = groups["dp_cp"] if layout.zero_shards > layout.dp else groups["dp"]
    # Experts are spread over the fastest ep devices of the data(·context) group.
    groups["ep"] = tiers.group(layout.ep, layout.tp)
    # 2D weight-stationary (`Layout.tp_embed`): the head/MLP-width split innermost, the model-dimension split around it.
    heads = layout.tp // layout.tp_embed
    groups["tp_heads"], groups["tp_embed"] = tiers.group(heads, 1), tiers.group(layout.tp_embed, heads)
    return groups


def mesh_groups(axes: list[tuple[str, int]], *, devices_per_node: int, intra: Tier, inter: Tier, intra_pair: Tier | None = None,
                inter_cross_rail: Tier | None = None) -> dict[str, Group]:
    """The group along each named axis of a device mesh, major axis first (the last varies fastest).

    >>> from costmodel.step.collectives import Tier
    >>> nv, ib = Tier(bytes_per_s=3e11, latency_s=0), Tier(bytes_per_s=2.5e10, latency_s=0)
    >>> g = mesh_groups([("data", 4), ("tensor", 8)], devices_per_node=8, intra=nv, inter=ib)
    >>> (g["tensor"].n_nodes, g["data"].n_nodes)
    (1, 4)
    """
    tiers = _Tiers(devices_per_node, intra, inter, intra_pair, inter_cross_rail)
    groups, stride = {}, 1
    for name, size in reversed(axes):
        groups[name] = tiers.group(size, stride)
        stride *= size
    return {name: groups[name] for name, _ in axes}


def link_between_stages(layout: Layout, *, devices_per_node: int, intra: Tier, inter: Tier,
                        inter_cross_rail: Tier | None = None) -> Tier:
    """The tier a pipeline send crosses: stages are tp·cp·dp devices apart (a chain of stages
    also crosses unbridged neighbours, so an NVLink bridge does not set its pace)."""
    distance = layout.tp * layout.cp * layout.dp
    if distance < devices_per_node:
        return intra
    return inter if distance % devices_per_node == 0 or inter_cross_rail is None else inter_cross_rail

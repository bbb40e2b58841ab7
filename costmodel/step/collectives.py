"""Alpha-beta cost of collectives over one group of devices.

A group of ``n`` devices spans ``n_nodes`` nodes with ``n / n_nodes`` members in each.
Inside a node members talk over the intra-node link (NVLink/NVSwitch, or a TPU torus
dimension); across nodes every member uses its own NIC, so the hierarchical algorithms
(intra-node reduce-scatter, inter-node exchange of 1/g-sized shards in parallel over g
NICs, intra-node all-gather) are what NCCL and XLA run on such groups. A flat ring is
used when the whole group is in one tier.

Sizes are the bytes of the full (unsharded) buffer: for all-gather the gathered result,
for reduce-scatter the input, for all-reduce the buffer reduced.

>>> tier = Tier(bytes_per_s=100e9, latency_s=0.0)
>>> all_reduce_s(1e9, Group(n=4, n_nodes=1, intra=tier, inter=tier))  # 2·(3/4)·1 GB / 100 GB/s
0.015
"""

from __future__ import annotations

import functools
import math
from enum import StrEnum
from typing import Sequence

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
)


class Collective(StrEnum):
    """Collective kinds, named as in XLA's HLO."""

    ALL_REDUCE = "all-reduce"
    ALL_GATHER = "all-gather"
    REDUCE_SCATTER = "reduce-scatter"
    ALL_TO_ALL = "all-to-all"
    P2P = "collective-permute"


class Tier(BaseModel):
    """One link tier as one device sees it: achievable bandwidth per direction and latency."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bytes_per_s: PositiveFloat = Field(description="Bandwidth one device gets on this tier, per direction.")
    latency_s: NonNegativeFloat = Field(description="Per-message latency (alpha).")
    bidirectional_ring: bool = Field(False, description="A torus dimension with wrap-around: rings run both ways.")
    torus_dims: tuple[PositiveInt, ...] = Field((), description="A TPU slice's ICI torus shape, the fastest-varying device "
                                                "coordinate first: a group's collective runs one ring per torus dimension it "
                                                "spans (`torus_ring_steps`); empty: one ring over the whole group.")


class Group(BaseModel):
    """A communicating group of devices and the tiers it crosses."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n: PositiveInt = Field(description="Devices in the group.")
    n_nodes: PositiveInt = Field(description="Nodes (or slices) the group spans.")
    intra: Tier = Field(description="Link between members in the same node.")
    inter: Tier = Field(description="Link between members in different nodes.")
    ring_steps: PositiveInt | None = Field(None, description="Latency steps of one pass over the members in a node: "
                                           "members − 1 on one ring (None), fewer on a torus (`torus_ring_steps`).")

    @property
    def per_node(self) -> int:
        return max(1, self.n // self.n_nodes)


def combined(groups: Sequence[Group]) -> Group:
    """The group that groups along different mesh axes form together (one collective over
    several axes at once runs on it, hierarchically across its nodes, as the simulator's
    data-parallel group spanning several mesh axes does).

    >>> tier = Tier(bytes_per_s=1e11, latency_s=0)
    >>> both = combined([Group(n=8, n_nodes=4, intra=tier, inter=tier), Group(n=4, n_nodes=1, intra=tier, inter=tier)])
    >>> both.n, both.n_nodes, both.per_node
    (32, 4, 8)
    """
    n = math.prod(g.n for g in groups)
    steps = sum(g.ring_steps or g.per_node - 1 for g in groups) if any(g.ring_steps for g in groups) else None
    return Group(n=n, n_nodes=min(n, math.prod(g.n_nodes for g in groups)), intra=groups[0].intra, inter=groups[0].inter,
                 ring_steps=steps or None)


@functools.lru_cache(maxsize=4096)
def torus_ring_steps(size: int, stride: int, dims: tuple[int, ...]) -> int:
    """Latency steps of one collective pass over ``size`` devices ``stride`` apart on a torus of
    ``dims`` (devices numbered with the first dimension fastest): a ring along each dimension the
    group spans, one after another (XLA's collectives on a TPU torus), so the extents' sum less one
    each, not ``size − 1`` as on one ring through every member.

    >>> torus_ring_steps(64, 1, (4, 4, 4)), torus_ring_steps(8, 1, (4, 4, 4)), torus_ring_steps(8, 8, (4, 4, 4))
    (9, 4, 4)
    """
    steps, block = 0, 1
    for d in dims:
        coordinates = {(j * stride // block) % d for j in range(size)}
        steps += len(coordinates) - 1
        block *= d
    return max(1, steps)


def _ring_s(size_bytes: float, n: int, tier: Tier, *, passes: int, steps: int | None = None) -> float:
    """``passes`` ring phases (1 for gather/scatter, 2 for all-reduce) of ``size_bytes`` over n, each
    ``steps`` latencies (default n − 1)."""
    if n <= 1 or size_bytes <= 0:
        return 0.0
    bandwidth = tier.bytes_per_s * (2 if tier.bidirectional_ring else 1)
    return passes * ((n - 1) / n * size_bytes / bandwidth + (n - 1 if steps is None else steps) * tier.latency_s)


def _hierarchical_s(size_bytes: float, group: Group, *, passes: int) -> float:
    g = group.per_node
    intra = _ring_s(size_bytes, g, group.intra, passes=passes, steps=group.ring_steps if g == group.n else None)
    # After the intra-node phase each member owns 1/g of the buffer and uses its own NIC.
    inter = _ring_s(size_bytes / g, group.n_nodes, group.inter, passes=passes)
    return intra + inter


def all_reduce_s(size_bytes: float, group: Group) -> float:
    """All-reduce time: reduce-scatter plus all-gather, hierarchical across nodes."""
    return _hierarchical_s(size_bytes, group, passes=2)


def all_gather_s(size_bytes: float, group: Group) -> float:
    """All-gather time for a gathered result of ``size_bytes``."""
    return _hierarchical_s(size_bytes, group, passes=1)


def reduce_scatter_s(size_bytes: float, group: Group) -> float:
    """Reduce-scatter time for an input of ``size_bytes``."""
    return _hierarchical_s(size_bytes, group, passes=1)


def all_to_all_s(size_bytes: float, group: Group) -> float:
    """All-to-all time: each device sends (n-1)/n of its ``size_bytes`` buffer.

    The share bound for other nodes leaves through the NIC; the rest over the intra tier.
    """
    n = group.n
    if n <= 1 or size_bytes <= 0:
        return 0.0
    off_node = (n - group.per_node) / n * size_bytes
    on_node = (group.per_node - 1) / n * size_bytes
    return max(off_node / group.inter.bytes_per_s, on_node / group.intra.bytes_per_s) + (n - 1) * group.inter.latency_s


def p2p_s(size_bytes: float, tier: Tier) -> float:
    """One point-to-point transfer of ``size_bytes`` over ``tier``."""
    return size_bytes / tier.bytes_per_s + tier.latency_s if size_bytes > 0 else 0.0


def exposed_s(comm_s: float, compute_s: float, slowdown: float) -> float:
    """Seconds a collective of ``comm_s`` adds to ``compute_s`` of work it overlaps: what
    outlasts the work, plus the work slowed by ``slowdown`` while both run.

    >>> exposed_s(3.0, 2.0, 0.1), exposed_s(1.0, 2.0, 0.1)
    (1.2, 0.1)
    """
    return max(0.0, comm_s - compute_s) + slowdown * min(comm_s, compute_s)


def collective_s(kind: Collective, size_bytes: float, group: Group) -> float:
    """Time of ``kind`` on ``group`` (a P2P is a transfer over the slowest tier crossed)."""
    if kind is Collective.P2P:
        return p2p_s(size_bytes, group.inter if group.n_nodes > 1 else group.intra)
    return {
        Collective.ALL_REDUCE: all_reduce_s,
        Collective.ALL_GATHER: all_gather_s,
        Collective.REDUCE_SCATTER: reduce_scatter_s,
        Collective.ALL_TO_ALL: all_to_all_s,
    }[kind](size_bytes, group)

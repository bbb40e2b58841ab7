"""NCCL's own cost model of its collectives: an alpha-beta time per algorithm and protocol, the least chosen.

NCCL picks, for each collective call, the (algorithm, protocol) pair its tuning model predicts
fastest: ``latency + bytes / bandwidth``. The latencies are NCCL's constants (NVIDIA/nccl @b647562
src/graph/tuning.cc: ``baseLat`` per algorithm and protocol, ``hwLat`` per hop on NVLink and on the
network), summed over the algorithm's steps: a ring takes ``2(n−1)`` steps for an all-reduce
(``n − 1`` for all-gather and reduce-scatter), its inter-node ones at the network's latency; a tree
``2((n/nodes − 1)`` NVLink hops ``+ log2(nodes)`` network hops); NVLS one in-switch reduction. The
bandwidths start from the link a step crosses, the device's NVLink tier on one node and across
nodes its node's NICs together (every channel leaves through its own; NCCL measures its channels'
speeds instead), refined as the same file does: LL
moves a quarter of the ring's data per flag (at most ``LL_MAX_BUS_BYTES_PER_S``), LL128 0.92 of
it, a tree 0.92 (LL 1/3.8, LL128 7/9 on one node), and each algorithm's bus bandwidth becomes its
algorithm bandwidth by its data ratio (ring ``n / steps``, tree ½, NVLS 5/6). NVLS runs where
NVSwitch can reduce in the switch (Hopper and Blackwell NVSwitch parts) on one node, NVLS-tree
across nodes. NCCL's channel counts and per-channel caps, its tree correction factors and the
network post overhead are not modelled.

>>> from costmodel.step.collectives import Group, Tier
>>> nvlink, ib = Tier(bytes_per_s=360e9, latency_s=1e-6), Tier(bytes_per_s=45e9, latency_s=5e-6)
>>> node = Group(n=8, n_nodes=1, intra=nvlink, inter=ib)
>>> [c.algorithm for c in (nccl_choice("all_reduce", 8, node, nvls=True), nccl_choice("all_reduce", 2**30, node, nvls=True))]
['ring', 'nvls']
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import NamedTuple

from costmodel.step.collectives import Group


class Algorithm(StrEnum):
    RING = "ring"
    TREE = "tree"
    NVLS = "nvls"
    NVLS_TREE = "nvlstree"


class Protocol(StrEnum):
    LL = "LL"
    LL128 = "LL128"
    SIMPLE = "Simple"


A, P = Algorithm, Protocol
# tuning.cc baseLat (µs): per algorithm and protocol.
BASE_LATENCY_US = {(A.TREE, P.LL): 6.8, (A.TREE, P.LL128): 14.0, (A.TREE, P.SIMPLE): 0.0,
                   (A.RING, P.LL): 6.6, (A.RING, P.LL128): 14.0, (A.RING, P.SIMPLE): 8.4,
                   (A.NVLS, P.SIMPLE): 0.0, (A.NVLS_TREE, P.SIMPLE): 0.0}
# tuning.cc hwLat (µs) per hop: NVLink, and the network.
NVLINK_HOP_US = {(A.TREE, P.LL): 0.6, (A.TREE, P.LL128): 1.25, (A.TREE, P.SIMPLE): 28.0,
                 (A.RING, P.LL): 0.6, (A.RING, P.LL128): 1.9, (A.RING, P.SIMPLE): 3.4,
                 (A.NVLS, P.SIMPLE): 23.0, (A.NVLS_TREE, P.SIMPLE): 23.0}
NET_HOP_US = {(A.TREE, P.LL): 5.0, (A.TREE, P.LL128): 8.5, (A.TREE, P.SIMPLE): 28.0,
              (A.RING, P.LL): 2.7, (A.RING, P.LL128): 4.0, (A.RING, P.SIMPLE): 14.0,
              (A.NVLS, P.SIMPLE): 18.0, (A.NVLS_TREE, P.SIMPLE): 14.0}
# tuning.cc llMaxBws, Hopper row (GB/s): one node, two nodes, more.
LL_MAX_BUS_BYTES_PER_S = (87.7e9, 22.5e9, 19.0e9)


class Choice(NamedTuple):
    algorithm: str
    protocol: str
    seconds: float


def _steps(collective: str, n: int) -> int:
    return 2 * (n - 1) if collective == "all_reduce" else n - 1


def _latency_s(collective: str, algo: Algorithm, proto: Protocol, group: Group) -> float:
    n, nodes, key = group.n, group.n_nodes, (algo, proto)
    intra, inter = NVLINK_HOP_US[key], NET_HOP_US[key]
    if algo is A.RING:
        inter_steps = (2 * nodes if collective == "all_reduce" else nodes - 1) if nodes > 1 else 0
        hops = (_steps(collective, n) - inter_steps) * intra + inter_steps * inter
    elif algo is A.TREE:
        hops = 2 * ((n // nodes - 1) * intra + math.log2(nodes) * inter)
    elif algo is A.NVLS:
        hops = intra + (inter if nodes > 1 else 0.0)
    else:
        hops = intra + 2 * math.log2(nodes) * inter
    return (BASE_LATENCY_US[key] + hops) * 1e-6


def _algorithm_bytes_per_s(collective: str, algo: Algorithm, proto: Protocol, group: Group) -> float:
    nodes = group.n_nodes
    # Across nodes NCCL's channels leave a node through every NIC at once: a node's network bandwidth.
    bus = group.intra.bytes_per_s if nodes == 1 else min(group.intra.bytes_per_s, group.inter.bytes_per_s * group.per_node)
    ll_max = LL_MAX_BUS_BYTES_PER_S[min(nodes, 3) - 1]
    if algo is A.RING and proto is P.LL:
        bus = min(ll_max, bus / 4 if (nodes > 1 or collective == "all_reduce") else bus / 3)
    elif algo is A.RING and proto is P.LL128:
        bus *= 0.92
    elif algo is A.TREE:
        bus *= 0.92
        if proto is P.LL:
            bus = min(bus / 3.8, ll_max)
        elif proto is P.LL128:
            bus *= 7 / 9 if nodes == 1 else 120 / 128
    ratio = group.n / _steps(collective, group.n) if algo is A.RING else 5 / 6 if algo in (A.NVLS, A.NVLS_TREE) else 0.5
    return bus * ratio


def candidates(collective: str, group: Group, *, nvls: bool) -> list[tuple[Algorithm, Protocol]]:
    """The (algorithm, protocol) pairs NCCL weighs for ``collective`` on ``group``: trees for
    all-reduce only; NVLS where the switch reduces (``nvls``), on one node, NVLS-tree across nodes."""
    algos = [A.RING] + ([A.TREE] if collective == "all_reduce" else [])
    if nvls and group.n_nodes == 1:
        algos.append(A.NVLS)
    if nvls and group.n_nodes > 1 and collective == "all_reduce":
        algos.append(A.NVLS_TREE)
    return [(a, p) for a in algos for p in (P.LL, P.LL128, P.SIMPLE) if (a, p) in BASE_LATENCY_US]


def nccl_choice(collective: str, size_bytes: float, group: Group, *, nvls: bool, algorithm: str | None = None) -> Choice:
    """The pair NCCL's model predicts fastest for ``size_bytes`` (the full buffer, as nccl-tests
    sizes it), and its seconds; ``algorithm`` forces one (``NCCL_ALGO``), the protocol still chosen."""
    pairs = [(a, p) for a, p in candidates(collective, group, nvls=nvls) if algorithm is None or a.value == algorithm]
    if not pairs:
        raise ValueError(f"NCCL runs no {algorithm} {collective} on {group.n} ranks over {group.n_nodes} nodes here")
    times = [(_latency_s(collective, a, p, group) + size_bytes / _algorithm_bytes_per_s(collective, a, p, group), a, p)
             for a, p in pairs]
    seconds, algo, proto = min(times)
    return Choice(algo.value, proto.value, seconds)

"""The costed strategy space of a whole OpGraph: the problem every intra-op planner solves.

Choose one strategy per *free* node so that the sum of node costs and edge (resharding)
costs is least, with per-device memory within budget. As in Alpa, an op that simply
follows its producer (elementwise, transpose, reshape of an operand that covers all its
loops) is merged into it: its strategy is the one its producer's result sharding induces,
so it adds cost to its producer's choices but no decision. Repeated layers are already
one copy in the graph (``repeat`` = trip count), so the space does not grow with depth.

>>> import networkx as nx
>>> from costmodel.step.collectives import Group, Tier
>>> from costmodel.hardware.machine import load_machine
>>> from costmodel.oplevel.opgraph import LoopNest, OpNode, TensorSpec, add_input, add_op, new_op_graph
>>> t = lambda *s: TensorSpec(shape=s, dtype="bfloat16")
>>> g = new_op_graph("mlp")
>>> x, w = add_input(g, t(64, 512), label="x"), add_input(g, t(512, 256), label="w")
>>> nest = LoopNest(sizes=(64, 256, 512), reduced=(False, False, True), operands=((0, 2), (2, 1)), results=((0, 1),))
>>> y = add_op(g, OpNode(primitive="dot_general", inputs=(t(64, 512), t(512, 256)), outputs=(t(64, 256),),
...                      flops=2 * 64 * 512 * 256, loops=nest), [(x, 0), (w, 0)])
>>> z = add_op(g, OpNode(primitive="tanh", inputs=(t(64, 256),), outputs=(t(64, 256),),
...                      loops=LoopNest(sizes=(64, 256), reduced=(False, False), operands=((0, 1),), results=((0, 1),))), [(y, 0)])
>>> tier = Tier(bytes_per_s=1e11, latency_s=1e-6)
>>> space = build_space(g, {"data": Group(n=2, n_nodes=1, intra=tier, inter=tier)}, load_machine("a100-80gb"))
>>> space.free_nodes, space.followers[z][0]
((0, 1, 2), 2)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import networkx as nx
import numpy as np

from costmodel.errors import InfeasibleError
from costmodel.hardware.machine import Machine
from costmodel.oplevel.fusion import OWN_KERNEL, HbmTraffic, fused_traffic
from costmodel.oplevel.opgraph import OP_ATTR, USES_ATTR, OpNode, TensorSpec
from costmodel.oplevel.strategies import MeshGroups, Sharding, Strategy, loop_divisible, op_strategies, reshard_s, strategy_for
from costmodel.step.collectives import exposed_s

_GIB = 2**30
# Ops that make a big tensor from a small one: they follow their reader, not their producer.
_CONSUMER_LED = frozenset({"broadcast_in_dim", "iota"})


@dataclass(frozen=True)
class EdgeCost:
    """Resharding seconds of the tensors one free node passes another.

    Strategy i of ``src`` gives the tensors the sharding class ``src_class[i]``, strategy
    j of ``dst`` asks for class ``dst_class[j]``; the cost is ``matrix[src_class[i], dst_class[j]]``.
    Classes keep the problem small: many strategies shard a given tensor alike.
    """

    src: int
    dst: int
    src_class: np.ndarray
    dst_class: np.ndarray
    matrix: np.ndarray

    def cost_s(self, i: int, j: int) -> float:
        return float(self.matrix[self.src_class[i], self.dst_class[j]])


@dataclass(frozen=True)
class StrategySpace:
    """Free nodes with their strategies and costs, follower links, and edge costs."""

    groups: MeshGroups
    strategies: dict[int, tuple[Strategy, ...]]
    followers: dict[int, tuple[int, tuple[Strategy, ...]]]
    node_time_s: dict[int, np.ndarray]
    node_memory_bytes: dict[int, np.ndarray]
    edges: tuple[EdgeCost, ...]
    labels: dict[int, str] = field(default_factory=dict)

    @property
    def free_nodes(self) -> tuple[int, ...]:
        return tuple(sorted(self.strategies))

    def chosen(self, node: int, choice: dict[int, int]) -> Strategy:
        """The strategy of any graph node (free or follower) under ``choice`` (free node → index)."""
        if node in self.strategies:
            return self.strategies[node][choice[node]]
        root, induced = self.followers[node]
        return induced[choice[root]]

    def total_time_s(self, choice: dict[int, int]) -> float:
        """Objective of a full choice: node costs plus edge costs."""
        nodes = sum(float(self.node_time_s[n][i]) for n, i in choice.items())
        return nodes + sum(e.cost_s(choice[e.src], choice[e.dst]) for e in self.edges)

    def memory_bytes(self, choice: dict[int, int]) -> float:
        return sum(float(self.node_memory_bytes[n][i]) for n, i in choice.items())

    def least_memory_choice(self) -> dict[int, int]:
        """Each free node's least-memory strategy (the faster on ties): it fits whenever any choice does."""
        return {n: int(np.lexsort((self.node_time_s[n], self.node_memory_bytes[n]))[0]) for n in self.strategies}

    def check_fits(self, memory_budget_bytes: float) -> None:
        """Raise InfeasibleError when even the least-memory choice exceeds ``memory_budget_bytes``."""
        least = self.memory_bytes(self.least_memory_choice())
        if least > memory_budget_bytes:
            raise InfeasibleError(
                f"even the least-memory sharding needs {format_bytes(least)} per device, the budget is "
                f"{format_bytes(memory_budget_bytes)}", fix="use more devices, a smaller batch, or activation recompute")


def format_bytes(nbytes: float) -> str:
    """Bytes for a message: GiB, or MiB below one GiB.

    >>> format_bytes(3 * 2**29), format_bytes(2**20)
    ('1.5 GiB', '1.0 MiB')
    """
    return f"{nbytes / _GIB:.1f} GiB" if nbytes >= _GIB else f"{nbytes / 2**20:.1f} MiB"


def build_space(g: nx.DiGraph, groups: MeshGroups, machine: Machine, *,
                memory_factor: Callable[[OpNode], float] = lambda op: 1.0) -> StrategySpace:
    """Enumerate, cost and merge the strategies of every node of ``g`` on the mesh ``groups``.

    ``memory_factor(op)``: for a graph input, bytes held per byte of it (a parameter with its
    gradient and Adam moments holds several). Forward results read by the backward pass
    count as live activations. Ops are costed inside their fusions (`costmodel.oplevel.fusion`), as
    the step simulator costs fused kernels; collectives off the critical path (gradient
    reductions, parameter gathers) hide behind compute as the simulator's data-parallel
    ones do.
    """
    ops = {n: d[OP_ATTR] for n, d in g.nodes(data=True)}
    traffic = fused_traffic(g)
    induce = _InducedCache(groups, machine)
    gradients = _update_only(g, ops)
    saved = {n for n, op in ops.items() if not op.is_input and not op.is_backward
             and any(ops[s].is_backward for s in g.successors(n))}
    strategies: dict[int, tuple[Strategy, ...]] = {}
    followers: dict[int, tuple[int, tuple[Strategy, ...]]] = {}
    consumer_led = {n for n, op in ops.items() if op.primitive in _CONSUMER_LED and op.loops is not None and g.out_degree(n)}
    for n in sorted(ops):
        if n in consumer_led:
            continue
        op = ops[n]
        leader = _leader(g, n, op, strategies, followers)
        if leader is None:
            strategies[n] = op_strategies(induce.costed(op), groups, machine, saved=n in saved, memory_factor=memory_factor(op),
                                          traffic=traffic.get(n), gradient=n in gradients)
            continue
        producer, out_index, operand = leader
        root, producer_strategies = (producer, strategies[producer]) if producer in strategies else followers[producer]
        followers[n] = (root, induce(op, op.loops.operands[operand], [s.results[out_index] for s in producer_strategies],
                                     saved=n in saved, traffic=traffic[n]))
    # Broadcasts and iotas take the sharding their first reader wants (readers come later, so go backwards).
    for n in sorted(consumer_led, reverse=True):
        op = ops[n]
        reader = min(g.successors(n))
        _, operand = g.edges[n, reader][USES_ATTR][0]
        root, reader_strategies = (reader, strategies[reader]) if reader in strategies else followers[reader]
        followers[n] = (root, induce(op, op.loops.results[0], [s.operands[operand] for s in reader_strategies],
                                     saved=n in saved, traffic=traffic[n]))
    time_s = {n: np.array([s.time_s for s in ss]) for n, ss in strategies.items()}
    memory = {n: np.array([s.memory_bytes for s in ss]) for n, ss in strategies.items()}
    for n, (root, induced) in followers.items():
        time_s[root] = time_s[root] + np.array([s.time_s for s in induced])
        memory[root] = memory[root] + np.array([s.memory_bytes for s in induced])
    edges = _edge_costs(g, ops, groups, strategies, followers, time_s, machine.efficiency.overlap_slowdown)
    labels = {n: ops[n].label or f"{ops[n].primitive}@{ops[n].scope}" for n in strategies}
    return StrategySpace(groups=groups, strategies=strategies, followers=followers, node_time_s=time_s,
                         node_memory_bytes=memory, edges=edges, labels=labels)


def _update_only(g: nx.DiGraph, ops: dict[int, OpNode]) -> set[int]:
    """Backward ops whose results only feed the update (every path from them reaches the
    outputs through fusible ops): the gradients, reduced behind the rest of the backward."""
    feeds_kernel: dict[int, bool] = {}
    for n in sorted(ops, reverse=True):
        feeds_kernel[n] = any(ops[v].primitive in OWN_KERNEL or feeds_kernel[v] for v in g.successors(n))
    return {n for n, op in ops.items() if op.is_backward and not feeds_kernel[n]}


def _leader(g: nx.DiGraph, n: int, op: OpNode, strategies: dict, followers: dict) -> tuple[int, int, int] | None:
    """(producer, its output index, operand index) that ``op`` follows, or None if it is free.

    It follows its largest operand; among equals, one computed rather than a graph input's
    (a replicated input is sliced for free, so ``p - lr * update`` runs where ``update`` is,
    as ZeRO's sharded update does).
    """
    nest = op.loops
    if op.is_input or nest is None or any(nest.reduced):
        return None
    best = None
    for src in g.predecessors(n):
        if src not in strategies and src not in followers:
            continue
        root = src if src in strategies else followers[src][0]
        for out_index, operand in g.edges[src, n][USES_ATTR]:
            key = (op.inputs[operand].nbytes, not g.nodes[root][OP_ATTR].is_input)
            if best is None or key > best[0]:
                best = (key, src, out_index, operand)
    if best is None:
        return None
    _, src, out_index, operand = best
    covered = {k for k in nest.operands[operand] if k is not None}
    if any(size > 1 and k not in covered for k, size in enumerate(nest.sizes)):
        return None
    return src, out_index, operand


class _InducedCache:
    """`_induced` strategies, each costed once: unrolled layers repeat the same ops, and a
    producer's strategies share few result shardings (they differ in their other loops)."""

    def __init__(self, groups: MeshGroups, machine: Machine) -> None:
        self.groups, self.machine = groups, machine
        self.op_ids: dict[OpNode, int] = {}
        self.strategies: dict[tuple, Strategy] = {}

    def costed(self, op: OpNode) -> OpNode:
        """``op`` without its names (scope, label), which no cost reads: equal ops of different
        layers then share `op_strategies`' cache."""
        return op.model_copy(update={"scope": "", "label": ""})

    def __call__(self, op: OpNode, dim_loops: tuple[int | None, ...], shardings: list[Sharding], *, saved: bool,
                 traffic: HbmTraffic) -> tuple[Strategy, ...]:
        """`_induced` for each of ``shardings``."""
        op = self.costed(op)
        op_id = self.op_ids.setdefault(op, len(self.op_ids))
        out = []
        for sharding in shardings:
            key = (op_id, dim_loops, sharding, saved, traffic)
            if key not in self.strategies:
                self.strategies[key] = _induced(op, dim_loops, sharding, self.groups, self.machine, saved=saved, traffic=traffic)
            out.append(self.strategies[key])
        return tuple(out)


def _induced(op: OpNode, dim_loops: tuple[int | None, ...], sharding: tuple[tuple[str, ...], ...], groups: MeshGroups,
             machine: Machine, *, saved: bool, traffic: HbmTraffic) -> Strategy:
    """``op``'s strategy when the tensor whose dimensions index ``dim_loops`` is sharded as ``sharding``
    (its main operand, or for a broadcast its result as its reader wants it); indivisible splits are dropped."""
    nest = op.loops
    assert nest is not None
    sizes = {name: grp.n for name, grp in groups.items()}
    loop_axes: list[tuple[str, ...]] = [()] * len(nest.sizes)
    # Align on trailing dimensions: a stacked input [L, ...] feeds a loop body one [...] slice at a time.
    offset = len(sharding) - len(dim_loops)
    for dim, k in enumerate(dim_loops):
        if k is not None and 0 <= dim + offset < len(sharding):
            loop_axes[k] = sharding[dim + offset]
    for k, axes in enumerate(loop_axes):
        if not loop_divisible(op, nest, k, math.prod(sizes[a] for a in axes)):
            loop_axes[k] = ()
    return strategy_for(op, tuple(loop_axes), groups, machine, saved=saved, traffic=traffic)


def _edge_costs(g: nx.DiGraph, ops: dict[int, OpNode], groups: MeshGroups, strategies: dict, followers: dict,
                time_s: dict[int, np.ndarray], slowdown: float) -> tuple[EdgeCost, ...]:
    """Resharding costs between free nodes; edges inside one merged group go to the group's node cost.

    A graph input's resharding (a parameter's gather) is prefetched behind the op that
    reads it: it costs what `exposed_s` leaves of it beside that op's least compute among
    the strategies asking for that sharding.
    """
    def owner(n: int) -> tuple[int, tuple[Strategy, ...]]:
        return (n, strategies[n]) if n in strategies else followers[n]

    tables: dict[tuple, np.ndarray] = {}

    def reshard_table(tensor: TensorSpec, src_keys: list, dst_keys: list) -> np.ndarray:
        # Repeated layers pass equal tensors between equal strategy sets: cost each table once.
        key = (tensor.shape, tensor.dtype, tuple(src_keys), tuple(dst_keys))
        if key not in tables:
            tables[key] = np.array([[reshard_s(tensor, a, b, groups) for b in dst_keys] for a in src_keys])
        return tables[key]

    merged: dict[tuple, np.ndarray] = {}
    for src, dst, data in g.edges(data=True):
        (ru, su), (rv, sv) = owner(src), owner(dst)
        consumer = ops[dst]
        for out_index, operand in data[USES_ATTR]:
            tensor = consumer.inputs[operand]
            src_keys, src_class = _classes([s.results[out_index] for s in su])
            dst_keys, dst_class = _classes([s.operands[operand] for s in sv])
            table = consumer.repeat * reshard_table(tensor, src_keys, dst_keys)
            if ops[ru].is_input:
                window_s = [min(s.compute_s for s, c in zip(sv, dst_class) if c == b) for b in range(len(dst_keys))]
                table = np.array([[exposed_s(t, w, slowdown) for t, w in zip(row, window_s)] for row in table])
            if ru == rv:
                time_s[ru] = time_s[ru] + table[src_class, dst_class]
                continue
            if ru > rv:
                ru, rv, src_class, dst_class, table = rv, ru, dst_class, src_class, table.T
            key = (ru, rv, src_class.tobytes(), dst_class.tobytes())
            merged[key] = merged[key] + table if key in merged else table
    edges = []
    for key in sorted(merged):
        u, v, src_bytes, dst_bytes = key
        table = merged[key]
        if np.all(table == table.min()):
            time_s[u] = time_s[u] + table.min()
            continue
        edges.append(EdgeCost(src=u, dst=v, src_class=np.frombuffer(src_bytes, dtype=np.int64),
                              dst_class=np.frombuffer(dst_bytes, dtype=np.int64), matrix=table))
    return tuple(edges)


def _classes(shardings: list) -> tuple[list, np.ndarray]:
    """Distinct shardings in first-seen order, and each entry's index among them."""
    index = {s: i for i, s in enumerate(dict.fromkeys(shardings))}
    return list(index), np.array([index[s] for s in shardings], dtype=np.int64)


def prune_dominated(space: StrategySpace) -> StrategySpace:
    """Drop strategies another strategy of the same node beats whatever the neighbours choose.

    t dominates s when t needs no more memory and t's node cost plus its worst-case extra
    edge cost (over every neighbour class) is still no more than s's node cost. Replacing
    s by t never makes a solution worse, so the optimum survives; the model shrinks.
    """
    incident: dict[int, list[tuple[EdgeCost, bool]]] = {n: [] for n in space.strategies}
    for edge in space.edges:
        incident[edge.src].append((edge, True))
        incident[edge.dst].append((edge, False))
    keep: dict[int, np.ndarray] = {}
    for n, options in space.strategies.items():
        cost, memory = space.node_time_s[n], space.node_memory_bytes[n]
        worst_extra = np.zeros((len(options), len(options)))
        for edge, is_src in incident[n]:
            # Per sharding class first (strategies share few), then spread to the strategies.
            rows, classes = (edge.matrix, edge.src_class) if is_src else (edge.matrix.T, edge.dst_class)
            worst_extra += (rows[:, None, :] - rows[None, :, :]).max(axis=2)[np.ix_(classes, classes)]
        # beats[t, s]: t is at least as good as s in every neighbourhood.
        beats = (cost[:, None] + worst_extra <= cost[None, :] + 1e-12) & (memory[:, None] <= memory[None, :])
        np.fill_diagonal(beats, False)
        order = np.arange(len(options))
        # Among mutual dominators keep the lower index.
        strictly = beats & ~(beats.T & (order[:, None] > order[None, :]))
        keep[n] = np.flatnonzero(~strictly.any(axis=0))
    return restrict(space, keep)


def restrict(space: StrategySpace, keep: dict[int, np.ndarray]) -> StrategySpace:
    """The space with only the strategies ``keep[n]`` (indices, ascending) of each free node ``n`` in ``keep``.

    Pinning a node to one strategy is ``keep={n: np.array([i])}``; edges and followers follow.
    """
    keep = {n: np.asarray(keep[n]) if n in keep else np.arange(len(ss)) for n, ss in space.strategies.items()}
    strategies = {n: tuple(space.strategies[n][i] for i in idx) for n, idx in keep.items()}
    followers = {f: (root, tuple(induced[i] for i in keep[root])) for f, (root, induced) in space.followers.items()}
    edges = []
    for e in space.edges:
        src_class, dst_class = e.src_class[keep[e.src]], e.dst_class[keep[e.dst]]
        used_src, src_class = np.unique(src_class, return_inverse=True)
        used_dst, dst_class = np.unique(dst_class, return_inverse=True)
        edges.append(EdgeCost(src=e.src, dst=e.dst, src_class=src_class, dst_class=dst_class,
                              matrix=e.matrix[np.ix_(used_src, used_dst)]))
    return StrategySpace(groups=space.groups, strategies=strategies, followers=followers,
                         node_time_s={n: space.node_time_s[n][idx] for n, idx in keep.items()},
                         node_memory_bytes={n: space.node_memory_bytes[n][idx] for n, idx in keep.items()},
                         edges=tuple(edges), labels=space.labels)

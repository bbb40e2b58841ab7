"""Which tensors of an OpGraph reach HBM once its elementwise ops are fused, as XLA fuses them.

The step simulator costs fused kernels (`costmodel.step.kernels`): a norm reads its input and
writes its output once, however many primitives compute it, and launches once. An
OpGraph has a node per primitive; costing each as a kernel of its own would count every
intermediate's HBM round trip and a launch per primitive. So the op-level cost model
groups fusible ops into fusions and charges each op only for the tensors its fusion reads
from or writes to HBM, and one launch per fusion.

A fusion is a connected set of fusible ops of one loop body and one pass (forward, or
backward with its recompute) that reach one another through no kernel of their own (a
matmul, a gather). Ops are placed as late as their readers allow (producers sink into
consumers, as in XLA's producer-consumer fusion) and a fusion's ops share one place, so
the graph of fusions stays acyclic. Reshapes and other renamings (`ALIASES`) move no
data; broadcasts, iotas, widening converts and what is computed from them alone are
recomputed inside every fusion that reads them (`recomputed`), as XLA duplicates them.

>>> from costmodel.oplevel.opgraph import OpNode, TensorSpec, add_input, add_op, new_op_graph
>>> t = TensorSpec(shape=(64, 256), dtype="float32")
>>> g = new_op_graph("chain")
>>> x = add_input(g, t, label="x")
>>> y = add_op(g, OpNode(primitive="exp", inputs=(t,), outputs=(t,)), [(x, 0)])
>>> z = add_op(g, OpNode(primitive="tanh", inputs=(t,), outputs=(t,)), [(y, 0)])
>>> traffic = fused_traffic(g)
>>> traffic[y], traffic[z]  # one kernel: reads x, writes tanh's result, launched once
(HbmTraffic(reads=(True,), writes=(False,), launches=True), HbmTraffic(reads=(False,), writes=(True,), launches=False))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import networkx as nx

from costmodel.oplevel.opgraph import OP_ATTR, USES_ATTR, OpNode

# Ops that run as kernels of their own (library calls, data-dependent addressing): their
# operands and results always pass through HBM.
OWN_KERNEL = frozenset({
    "dot_general", "conv_general_dilated", "gather", "scatter", "scatter-add", "scatter_add", "sort", "cumsum",
    "cumprod", "cummax", "cumlogsumexp", "custom_call", "fft", "psum", "all_gather", "reduce_scatter", "all_to_all",
    "ppermute",
})
# Ops that only rename their operand's buffer: they move no data.
# `reduce_precision` to the dtype's own width is the mark JAX's remat leaves; XLA drops it.
ALIASES = frozenset({"reshape", "squeeze", "expand_dims", "name", "stop_gradient", "optimization_barrier", "reduce_precision"})
# Ops that make a large tensor from a small one or none.
_EXPANDING = frozenset({"broadcast_in_dim", "iota"})


@dataclass(frozen=True)
class HbmTraffic:
    """Which operands an op reads from HBM, which results it writes there, and whether it launches the kernel."""

    reads: tuple[bool, ...]
    writes: tuple[bool, ...]
    launches: bool

    @classmethod
    def unfused(cls, op: OpNode) -> HbmTraffic:
        """An op run as a kernel of its own: every operand read, every result written.

        >>> from costmodel.oplevel.opgraph import TensorSpec
        >>> t = TensorSpec(shape=(4,), dtype="float32")
        >>> HbmTraffic.unfused(OpNode(primitive="add", inputs=(t, t), outputs=(t,))).reads
        (True, True)
        """
        return cls(reads=(True,) * len(op.inputs), writes=(True,) * len(op.outputs), launches=True)


def fused_traffic(g: nx.DiGraph) -> dict[int, HbmTraffic]:
    """Each op node's HBM traffic once ``g``'s fusible ops are fused (graph inputs are left out).

    Graph outputs (``g.graph["outputs"]``; without it, every result nothing reads) are
    written. A recomputed op is charged (once) the reads of its operands the fusions it is
    recomputed in do not hold, and written only where a kernel of its own reads it.
    """
    ops = {n: d[OP_ATTR] for n, d in g.nodes(data=True)}
    again = recomputed(g)
    fusion = _fusions(g, ops, again)
    buffer = _buffers(g, ops)
    listed = g.graph.get("outputs")
    outputs = {tuple(o) for o in listed if o is not None} if listed is not None else {
        (n, i) for n, op in ops.items() if not g.out_degree(n) for i in range(len(op.outputs))}

    def readers(n: int, out_index: int) -> list[int]:
        return [dst for dst in g.successors(n) if any(o == out_index for o, _ in g.edges[n, dst][USES_ATTR])]

    # The fusions each recomputed op is recomputed in.
    homes: dict[int, set[int]] = {}
    for n in sorted(again, reverse=True):
        homes[n] = set().union(*(homes[v] if v in again else {fusion[v]} for v in g.successors(n) if v in again or v in fusion))

    def kept(dst: int, group: int) -> bool:
        """Whether ``dst`` reads a tensor of fusion ``group`` on chip."""
        return fusion.get(dst) == group or (dst in again and homes[dst] == {group})

    traffic: dict[int, HbmTraffic] = {}
    for n, op in ops.items():
        if op.is_input or n in fusion:
            continue
        if n not in again:
            traffic[n] = HbmTraffic.unfused(op)
            continue
        # Written only for a kernel of its own; read by the fusions it is recomputed in, once.
        writes = tuple((n, i) in outputs or any(v not in fusion and v not in again for v in readers(n, i))
                       for i in range(len(op.outputs)))
        reads = _operands_read(g, n, lambda src, _: src not in again and (
            any(writes) or bool(homes[n]) and homes[n] != {fusion.get(src)}))
        traffic[n] = HbmTraffic(reads=reads, writes=writes, launches=any(writes))
    members: dict[int, list[int]] = {}
    for n in sorted(fusion):
        members.setdefault(fusion[n], []).append(n)
    for group, nodes in members.items():
        if all(ops[n].primitive in ALIASES for n in nodes):
            for n in nodes:
                traffic[n] = HbmTraffic(reads=(False,) * len(ops[n].inputs), writes=(False,) * len(ops[n].outputs), launches=False)
            continue
        seen: set[tuple[int, int]] = set()  # a fusion reads each outside buffer once, under whatever name

        def counts(src: int, out_index: int) -> bool:
            origin = buffer.get((src, out_index), (src, out_index))
            if src in again or fusion.get(src) == group or fusion.get(origin[0]) == group or origin in seen:
                return False
            seen.add(origin)
            return True

        # A buffer is written once, by the member computing it, if it or any name of it leaves the fusion;
        # a renaming of a buffer computed elsewhere writes nothing.
        leaving = {buffer.get((n, i), (n, i)) for n in nodes for i in range(len(ops[n].outputs))
                   if (n, i) in outputs or not all(kept(v, group) for v in readers(n, i))}
        launcher = next(n for n in nodes if ops[n].primitive not in ALIASES)
        for n in nodes:
            if ops[n].primitive in ALIASES:
                names = [buffer.get((n, i), (n, i)) for i in range(len(ops[n].outputs))]
                writes = tuple(origin[0] in again and origin in leaving for origin in names)
            else:
                writes = tuple((n, i) in leaving for i in range(len(ops[n].outputs)))
            traffic[n] = HbmTraffic(reads=_operands_read(g, n, counts), writes=writes, launches=n == launcher)
    return traffic


def _buffers(g: nx.DiGraph, ops: dict[int, OpNode]) -> dict[tuple[int, int], tuple[int, int]]:
    """Each result of a renaming op → the (op, result index) that computed the buffer it names."""
    buffer: dict[tuple[int, int], tuple[int, int]] = {}
    for n in nx.topological_sort(g):
        if ops[n].primitive not in ALIASES:
            continue
        operand_of = {operand: (src, out_index) for src in g.predecessors(n) for out_index, operand in g.edges[src, n][USES_ATTR]}
        for i in range(len(ops[n].outputs)):
            # optimization_barrier renames each operand to the result at its position; the rest have one operand.
            source = operand_of.get(i if ops[n].primitive == "optimization_barrier" else 0)
            if source is not None:
                buffer[n, i] = buffer.get(source, source)
    return buffer


def recomputed(g: nx.DiGraph) -> frozenset[int]:
    """Fusible ops every fusion reading them recomputes rather than reads: broadcasts, iotas,
    widening converts, and what is computed from them alone (a causal mask from iotas).

    >>> from costmodel.oplevel.opgraph import TensorSpec, add_op, new_op_graph
    >>> t = TensorSpec(shape=(8, 8), dtype="int32")
    >>> g = new_op_graph("mask")
    >>> i = add_op(g, OpNode(primitive="iota", outputs=(t,)), [])
    >>> j = add_op(g, OpNode(primitive="iota", outputs=(t,)), [])
    >>> m = add_op(g, OpNode(primitive="ge", inputs=(t, t), outputs=(TensorSpec(shape=(8, 8), dtype="bool"),)), [(i, 0), (j, 0)])
    >>> sorted(recomputed(g))
    [0, 1, 2]
    """
    constant: set[int] = set()  # computed from no tensor at all
    out: set[int] = set()
    for n in sorted(g.nodes):
        op = g.nodes[n][OP_ATTR]
        if not _fusible(op):
            continue
        if all(p in constant for p in g.predecessors(n)):
            constant.add(n)
        widening = op.primitive == "convert_element_type" and op.outputs[0].nbytes > op.inputs[0].nbytes
        if n in constant or op.primitive in _EXPANDING or widening:
            out.add(n)
    return frozenset(out)


def _operands_read(g: nx.DiGraph, n: int, counts: Callable[[int, int], bool]) -> tuple[bool, ...]:
    """Per operand of ``n``: whether it is read from HBM, ``counts(producer, its output index)`` deciding."""
    reads = [False] * len(g.nodes[n][OP_ATTR].inputs)
    for src in sorted(g.predecessors(n)):
        for out_index, operand in g.edges[src, n][USES_ATTR]:
            reads[operand] = counts(src, out_index) or reads[operand]
    return tuple(reads)


def _fusible(op: OpNode) -> bool:
    return not op.is_input and op.primitive not in OWN_KERNEL


def _boundary(u: OpNode, v: OpNode, recomputed_u: bool) -> bool:
    """Whether the tensor ``u`` passes ``v`` must be in HBM whatever is fused: a kernel of its
    own on either side, or (unless ``v`` recomputes ``u``) a pass or loop boundary."""
    if not (_fusible(u) and _fusible(v)):
        return True
    return not recomputed_u and (u.is_backward != v.is_backward or u.repeat != v.repeat)


def _fusions(g: nx.DiGraph, ops: dict[int, OpNode], again: frozenset[int]) -> dict[int, int]:
    """Fusible, not recomputed op → its fusion's id (its least member).

    Each node gets the latest place its readers allow (a step before a reader across a
    boundary); fusible neighbours not across a boundary with the same place are one
    fusion, also where they meet through ops recomputed between them. Places never
    decrease along an edge and rise across every boundary, so a path leaving a fusion
    can never come back into it.
    """
    place: dict[int, int] = {}
    for n in reversed(list(nx.topological_sort(g))):
        place[n] = min((place[v] - _boundary(ops[n], ops[v], n in again) for v in g.successors(n)), default=0)
    joined = nx.Graph()
    joined.add_nodes_from(n for n, op in ops.items() if _fusible(op) and n not in again)
    # Members each recomputed op reaches through recomputed ops alone, without a boundary.
    sources: dict[int, set[int]] = {}
    for n in sorted(again):
        sources[n] = set()
        for u in g.predecessors(n):
            if u in again:
                sources[n] |= sources[u]
            elif u in joined and not _boundary(ops[u], ops[n], False):
                sources[n].add(u)
    for u, v in g.edges:
        if v not in joined:
            continue
        near = sources[u] if u in again else {u} if u in joined and not _boundary(ops[u], ops[v], False) else set()
        joined.add_edges_from((s, v) for s in near if place[s] == place[v])
    return {n: min(component) for component in nx.connected_components(joined) for n in component}

"""Sharding strategies of one op on a device mesh, and the cost of resharding a tensor.

A strategy assigns each mesh axis to one loop of the op's `LoopNest` (or to none: the op
is replicated along that axis). That fixes how every operand and result is sharded, the
per-device FLOPs and bytes (costed by the simulator's roofline; an op inside a fusion moves
only what its fusion reads and writes, `costmodel.oplevel.fusion`), and the collectives the op
needs inside: an axis on a summed loop leaves partial results, completed by an all-reduce
(result replicated on that axis) or a reduce-scatter (result sharded on it), over several
axes at once on the group they form. As in Alpa, several axes may shard one loop, so 32
devices of an 8x4 mesh can all split the batch.

A sharding is, per tensor dimension, the tuple of mesh axes splitting it (major first).

>>> from costmodel.step.collectives import Group, Tier
>>> from costmodel.hardware.machine import load_machine
>>> from costmodel.oplevel.opgraph import LoopNest, OpNode, TensorSpec
>>> t = lambda *s: TensorSpec(shape=s, dtype="bfloat16")
>>> matmul = OpNode(primitive="dot_general", inputs=(t(64, 512), t(512, 256)), outputs=(t(64, 256),),
...                 flops=2 * 64 * 512 * 256, loops=LoopNest(sizes=(64, 256, 512), reduced=(False, False, True),
...                                                          operands=((0, 2), (2, 1)), results=((0, 1),)))
>>> tier = Tier(bytes_per_s=1e11, latency_s=1e-6)
>>> axes = {"data": Group(n=2, n_nodes=1, intra=tier, inter=tier)}
>>> names = [s.name for s in op_strategies(matmul, axes, load_machine("a100-80gb"))]
>>> names[:2]
['[-,-]×[-,-] → [-,-]', '[data,-]×[-,-] → [data,-]']
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache

from costmodel.hardware.machine import Machine
from costmodel.oplevel.fusion import HbmTraffic
from costmodel.oplevel.opgraph import LoopNest, OpNode, TensorSpec, dtype_bytes
from costmodel.step.collectives import Group, all_gather_s, all_reduce_s, all_to_all_s, combined, exposed_s, reduce_scatter_s
from costmodel.step.kernels import Kernel, KernelKind
from costmodel.step.roofline import kernel_time_s

Sharding = tuple[tuple[str, ...], ...]
MeshGroups = dict[str, Group]


@dataclass(frozen=True)
class Strategy:
    """One way to shard an op: its tensors' shardings and its per-step cost on one device
    (``communication_s``: what its collectives add to the step, hidden ones' remainder only)."""

    name: str
    operands: tuple[Sharding, ...]
    results: tuple[Sharding, ...]
    compute_s: float
    communication_s: float
    memory_bytes: float

    @property
    def time_s(self) -> float:
        return self.compute_s + self.communication_s


def format_sharding(sharding: Sharding) -> str:
    """``(("data",), ())`` → ``"[data,-]"``.

    >>> format_sharding((("data", "tensor"), ()))
    '[data·tensor,-]'
    """
    return "[" + ",".join("·".join(axes) or "-" for axes in sharding) + "]"


def shard_factor(sharding: Sharding, sizes: dict[str, int]) -> int:
    """How many pieces a sharding cuts a tensor into."""
    return math.prod(sizes[a] for axes in sharding for a in axes)


def input_nest(tensor: TensorSpec) -> LoopNest | None:
    """A graph input as a loop nest over its own dimensions (any dimension may be split)."""
    if not tensor.shape or all(s <= 1 for s in tensor.shape):
        return None
    dims = tuple(range(len(tensor.shape)))
    return LoopNest(sizes=tuple(max(1, s) for s in tensor.shape), reduced=(False,) * len(dims), operands=(), results=(dims,))


def op_strategies(op: OpNode, groups: MeshGroups, machine: Machine, *, saved: bool = False,
                  memory_factor: float = 1.0, traffic: HbmTraffic | None = None, gradient: bool = False) -> tuple[Strategy, ...]:
    """Every strategy of ``op`` on the mesh whose axes are ``groups``, replicated first.

    ``saved``: its results stay live until the backward pass (they count as memory);
    ``memory_factor``: for a graph input, bytes held per byte of the input (e.g. 2 for a
    parameter and its gradient); ``traffic``: what of its operands and results it moves
    through HBM inside its fusion (default: all, a kernel of its own); ``gradient``: its
    results only feed the update, so their partial sums are reduced behind compute. Only
    divisible splits are kept.
    """
    return _cached_strategies(op, tuple(groups.items()), machine, saved, memory_factor, traffic, gradient)


@lru_cache(maxsize=65536)
def _cached_strategies(op: OpNode, groups: tuple[tuple[str, Group], ...], machine: Machine, saved: bool,
                       memory_factor: float, traffic: HbmTraffic | None, gradient: bool) -> tuple[Strategy, ...]:
    nest = input_nest(op.outputs[0]) if op.is_input else op.loops
    if nest is None:
        return (strategy_for(op, (), dict(groups), machine, saved=saved, memory_factor=memory_factor, traffic=traffic,
                             gradient=gradient),)
    names = [name for name, _ in groups]
    sizes = {name: g.n for name, g in groups}
    out = []
    for choice in itertools.product([None, *range(len(nest.sizes))], repeat=len(names)):
        loop_axes = tuple(tuple(a for a, k in zip(names, choice) if k == loop and sizes[a] > 1) for loop in range(len(nest.sizes)))
        if _divisible(op, nest, loop_axes, sizes):
            for scatter in _scatter_choices(nest, loop_axes, op, sizes):
                out.append(strategy_for(op, loop_axes, dict(groups), machine, saved=saved, memory_factor=memory_factor,
                                        scatter=scatter, traffic=traffic, gradient=gradient))
    unique = {(s.operands, s.results): s for s in out}
    return tuple(unique.values())


def strategy_for(op: OpNode, loop_axes: tuple[tuple[str, ...], ...], groups: MeshGroups, machine: Machine, *,
                 saved: bool = False, memory_factor: float = 1.0, scatter: tuple[tuple[str, int], ...] = (),
                 traffic: HbmTraffic | None = None, gradient: bool = False) -> Strategy:
    """The strategy that shards loop ``k`` of ``op`` on the axes ``loop_axes[k]`` (empty: replicated).

    ``scatter`` lists (axis, result dimension) pairs: partial sums over that axis are
    reduce-scattered onto that dimension instead of all-reduced. Its kernel moves the
    operands and results ``traffic`` says through HBM (default: all of them). A
    ``gradient``'s reduction runs behind compute as the simulator's data-parallel
    reduction does (`costmodel.step.collectives.exposed_s`), with its own kernel as the compute
    it hides behind: the window of the backward it overlaps, per op.
    """
    nest = input_nest(op.outputs[0]) if op.is_input else op.loops
    sizes = {name: g.n for name, g in groups.items()}
    if nest is None or not loop_axes:
        operands = tuple(((),) * len(t.shape) for t in op.inputs)
        results = tuple(((),) * len(t.shape) for t in op.outputs)
        loop_axes = ()
    else:
        operands = tuple(_tensor_sharding(dims, loop_axes) for dims in nest.operands)
        results = tuple(_tensor_sharding(dims, loop_axes) for dims in nest.results)
    scattered = dict(scatter)
    results = tuple(tuple(axes + tuple(a for a, d in scatter if d == dim) for dim, axes in enumerate(r)) for r in results)
    split = math.prod(sizes[a] for axes in loop_axes for a in axes)
    result_bytes = sum(t.nbytes / shard_factor(s, sizes) for t, s in zip(op.outputs, results))
    compute_s = 0.0
    if not op.is_input:
        traffic = traffic or HbmTraffic.unfused(op)
        hbm_bytes = (sum(t.nbytes / shard_factor(s, sizes) for t, s, r in zip(op.inputs, operands, traffic.reads) if r)
                     + sum(t.nbytes / shard_factor(s, sizes) for t, s, w in zip(op.outputs, results, traffic.writes) if w))
        kind = KernelKind.MATMUL if op.primitive == "dot_general" else KernelKind.MEMORY
        kernel = Kernel(name=op.primitive, kind=kind, flops=op.flops / split, bytes=hbm_bytes, count=op.repeat,
                        fused=not traffic.launches)
        compute_s = kernel_time_s(kernel, peak_flops_per_s=machine.peak_flops_per_s, hbm_bytes_per_s=machine.hbm_bytes_per_s,
                                  efficiency=machine.efficiency)
    partial = [a for k, axes in enumerate(loop_axes) if nest is not None and nest.reduced[k] for a in axes]
    unscattered_bytes = sum(t.nbytes / shard_factor(tuple(tuple(a for a in axes if a not in scattered) for axes in s), sizes)
                            for t, s in zip(op.outputs, results))
    communication_s = op.repeat * partial_sums_s(unscattered_bytes, [groups[a] for a in partial if a in scattered],
                                                 [groups[a] for a in partial if a not in scattered])
    if gradient:
        communication_s = exposed_s(communication_s, compute_s, machine.efficiency.overlap_slowdown)
    if op.is_input:
        memory = memory_factor * result_bytes
    else:
        memory = result_bytes * op.repeat if saved else 0.0
    described = ",".join(format_sharding(s) for s in results)
    if not op.is_input:
        described = "×".join(format_sharding(s) for s in operands) + " → " + described
    reductions = [f"{'reduce-scatter' if a in scattered else 'all-reduce'}({a})" for a in partial]
    name = " ".join([described, *reductions])
    return Strategy(name=name, operands=operands, results=results, compute_s=compute_s, communication_s=communication_s,
                    memory_bytes=memory)


def partial_sums_s(size_bytes: float, scattered: list[Group], reduced: list[Group]) -> float:
    """Seconds to complete partial sums of a ``size_bytes`` result over several mesh axes:
    one reduce-scatter over the ``scattered`` axes together, then one all-reduce of the
    scattered piece over the ``reduced`` axes together (each a `combined` group).

    >>> from costmodel.step.collectives import Tier
    >>> tier = Tier(bytes_per_s=1e9, latency_s=0)
    >>> partial_sums_s(8e9, [], [Group(n=2, n_nodes=1, intra=tier, inter=tier), Group(n=4, n_nodes=1, intra=tier, inter=tier)])
    14.0
    """
    scatter_s = reduce_scatter_s(size_bytes, combined(scattered)) if scattered else 0.0
    piece_bytes = size_bytes / math.prod(g.n for g in scattered)
    return scatter_s + (all_reduce_s(piece_bytes, combined(reduced)) if reduced else 0.0)


def _tensor_sharding(dims: tuple[int | None, ...], loop_axes: tuple[tuple[str, ...], ...]) -> Sharding:
    return tuple(loop_axes[k] if k is not None else () for k in dims)


def _divisible(op: OpNode, nest: LoopNest, loop_axes: tuple[tuple[str, ...], ...], sizes: dict[str, int]) -> bool:
    return all(loop_divisible(op, nest, k, math.prod(sizes[a] for a in axes)) for k, axes in enumerate(loop_axes))


def loop_divisible(op: OpNode, nest: LoopNest, loop: int, parts: int) -> bool:
    """Whether ``parts`` divides loop ``loop`` and every operand and result dimension it indexes."""
    tensors = list(zip(op.inputs, nest.operands)) + list(zip(op.outputs, nest.results))
    return nest.sizes[loop] % parts == 0 and all(s % parts == 0 for t, dims in tensors for s, k in zip(t.shape, dims) if k == loop)


def _scatter_choices(nest: LoopNest, loop_axes: tuple[tuple[str, ...], ...], op: OpNode,
                     sizes: dict[str, int]) -> list[tuple[tuple[str, int], ...]]:
    """For each axis on a summed loop: all-reduce, or reduce-scatter onto the first or last
    free result dimension; or all of them at once onto one of those (ZeRO over several axes).

    Two scatter targets keep the space small: the first free dimension is the batch (or
    sequence) dimension of an activation, and the first or last is the model-width
    dimension of a weight gradient, where Megatron's sequence parallelism and ZeRO put them.
    """
    partial = [a for k, axes in enumerate(loop_axes) if nest.reduced[k] for a in axes]
    if not partial or not nest.results:
        return [()]
    result = op.outputs[0].shape
    taken = {d for d, k in enumerate(nest.results[0]) if k is not None and loop_axes[k]}

    def ends(parts: int) -> list[int]:
        free = [d for d in range(len(result)) if d not in taken and result[d] > 1 and result[d] % parts == 0]
        return list(dict.fromkeys(free[:1] + free[-1:]))

    out = []
    for pick in itertools.product(*([None, *ends(sizes[axis])] for axis in partial)):
        dims = [d for d in pick if d is not None]
        if len(dims) == len(set(dims)):
            out.append(tuple((a, d) for a, d in zip(partial, pick) if d is not None))
    if len(partial) > 1:
        out += [tuple((a, d) for a in partial) for d in ends(math.prod(sizes[a] for a in partial))]
    return out


def reshard_s(tensor: TensorSpec, src: Sharding, dst: Sharding, groups: MeshGroups) -> float:
    """Seconds to turn ``tensor`` sharded as ``src`` into ``dst`` (per axis: all-gather, all-to-all or a free slice).

    Shardings of a different rank than ``tensor`` are aligned on their trailing dimensions
    (a stacked layer parameter read one layer at a time); axes on extra leading
    dimensions must be gathered.

    >>> from costmodel.step.collectives import Group, Tier
    >>> g = {"data": Group(n=4, n_nodes=1, intra=Tier(bytes_per_s=1e11, latency_s=0), inter=Tier(bytes_per_s=1e10, latency_s=0))}
    >>> reshard_s(TensorSpec(shape=(1024, 1024), dtype="float32"), (("data",), ()), ((), ()), g)  # all-gather 4 MiB
    3.145728e-05
    """
    return _reshard_s(tensor.shape, tensor.dtype, src, dst, tuple(groups.items()))


@lru_cache(maxsize=262144)
def _reshard_s(shape: tuple[int, ...], dtype: str, src: Sharding, dst: Sharding, groups: tuple[tuple[str, Group], ...]) -> float:
    rank = len(shape)
    src_dims = axis_dims(src, rank)
    dst_dims = axis_dims(dst, rank)
    sizes = {name: g.n for name, g in groups}
    nbytes = math.prod(shape) * dtype_bytes(dtype)
    total = 0.0
    gathered = []
    for name, group in groups:
        s, d = src_dims.get(name), dst_dims.get(name)
        if s == d or s is None:
            continue
        # A slice of a stacked tensor lives on one member (s == -1): every member must receive it.
        if d is None or s == -1:
            gathered.append(name)
            continue
        others = math.prod(sizes[a] for a, dim in dst_dims.items() if a != name and dim is not None)
        total += all_to_all_s(nbytes / others / sizes[name], group)
    if gathered:
        # One all-gather over the gathered axes together.
        others = math.prod(sizes[a] for a, dim in dst_dims.items() if a not in gathered and dim is not None)
        total += all_gather_s(nbytes / others, combined([dict(groups)[a] for a in gathered]))
    return total


def axis_dims(sharding: Sharding, rank: int) -> dict[str, int]:
    """Axis → the dimension (of a rank-``rank`` tensor, trailing-aligned) it splits; -1 for a dropped leading one.

    >>> axis_dims((("pipe",), (), ("tensor",)), 2)  # a stacked [layers, d, f] parameter read one layer at a time
    {'pipe': -1, 'tensor': 1}
    """
    offset = len(sharding) - rank
    return {a: (d - offset if d >= offset else -1) for d, axes in enumerate(sharding) for a in axes}

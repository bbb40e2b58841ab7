"""The layouts a user writes by hand, as input specs: plain data parallelism, FSDP, FSDP × tensor parallelism.

``planner.intraop.shard`` scores each with the same cost model as its own choice and never returns
a choice predicted worse than any of them. Leaves of the batch arguments split their
leading (batch) dimension; every other leaf (parameters, optimizer state) is replicated
(DP), split on its largest evenly divisible dimension over every mesh axis (FSDP), or split
on that dimension over all but the last axis and on its next largest over the last
("model") axis (FSDP × TP, for meshes of two or more axes and graphs with matrices).

>>> import jax, jax.numpy as jnp
>>> w, x = jax.ShapeDtypeStruct((512, 256), jnp.float32), jax.ShapeDtypeStruct((16, 512), jnp.int32)
>>> specs = baseline_specs((w, x), [("data", 4), ("model", 2)], batch_argnums=(1,))
>>> specs["dp"], specs["fsdp"], specs["fsdp_tp"]
((P(), P(('data', 'model'), None)), (P(('data', 'model'), None), P(('data', 'model'), None)), (P('data', 'model'), P('data', None)))
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import jax
from jax.sharding import PartitionSpec

BASELINES = ("dp", "fsdp", "fsdp_tp")


def baseline_specs(abstract_args: Sequence[Any], axes: Sequence[tuple[str, int]], *,
                   batch_argnums: Sequence[int]) -> dict[str, tuple[Any, ...]]:
    """Baseline name → input specs (one pytree per argument) on the mesh ``axes`` ((name, size), major first)."""
    names = [a for a, n in axes if n > 1]
    sizes = dict(axes)
    out = {}
    for name in BASELINES:
        if name == "fsdp_tp" and (len(names) < 2 or not _has_matrix(abstract_args, batch_argnums)):
            continue
        data = names[:-1] if name == "fsdp_tp" else names
        specs = []
        for i, arg in enumerate(abstract_args):
            if i in batch_argnums:
                specs.append(jax.tree.map(lambda leaf: _batch_spec(leaf, data, sizes), arg))
            elif name == "dp":
                specs.append(jax.tree.map(lambda leaf: PartitionSpec(), arg))
            elif name == "fsdp":
                specs.append(jax.tree.map(lambda leaf: _split_spec(leaf, [names], sizes), arg))
            else:
                specs.append(jax.tree.map(lambda leaf: _split_spec(leaf, [data, names[-1:]], sizes), arg))
        out[name] = tuple(specs)
    return out


def _has_matrix(abstract_args: Sequence[Any], batch_argnums: Sequence[int]) -> bool:
    return any(len(getattr(leaf, "shape", ())) >= 2 for i, arg in enumerate(abstract_args) if i not in batch_argnums
               for leaf in jax.tree.leaves(arg))


def _batch_spec(leaf: Any, axes: list[str], sizes: dict[str, int]) -> PartitionSpec:
    shape = tuple(getattr(leaf, "shape", ()))
    if not shape:
        return PartitionSpec()
    fit = _fitting(axes, shape[0], sizes)
    return PartitionSpec(_entry(fit), *[None] * (len(shape) - 1))


def _split_spec(leaf: Any, groups: list[list[str]], sizes: dict[str, int]) -> PartitionSpec:
    """Each group of axes on the largest dimension not yet split that it divides (largest group first)."""
    shape = tuple(getattr(leaf, "shape", ()))
    entries: list[Any] = [None] * len(shape)
    for group in groups:
        parts = math.prod(sizes[a] for a in group)
        free = [d for d in sorted(range(len(shape)), key=lambda d: -shape[d]) if entries[d] is None and parts > 1
                and shape[d] % parts == 0]
        if free:
            entries[free[0]] = _entry(group)
    return PartitionSpec(*entries)


def _fitting(axes: list[str], dim: int, sizes: dict[str, int]) -> list[str]:
    """The longest prefix of ``axes`` whose product divides ``dim``."""
    fit: list[str] = []
    for a in axes:
        if dim % math.prod(sizes[b] for b in [*fit, a]) == 0:
            fit.append(a)
        else:
            break
    return fit


def _entry(axes: list[str]) -> Any:
    return None if not axes else axes[0] if len(axes) == 1 else tuple(axes)

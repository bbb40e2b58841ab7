"""Which parallelism rides each axis of a user's device mesh.

Each mesh axis carries one kind of parallelism (data, tensor, pipeline, context, expert); several
axes may carry the same kind (its degree is their product). Axis names the user pinned
(``--mesh data=8,tensor=4``) fix their kind. Kinds are ordered from the fastest mesh axis
(last, inside a node) to the slowest as Megatron-LM orders devices — tensor, expert, context,
data, pipeline — which is the device order the step simulator assumes. An expert axis also
splits the batch (expert parallelism is a sub-group of data parallelism): only an axis named
``expert`` (or ``ep``) carries it.

>>> from costmodel.hardware.mesh import parse_mesh
>>> [a for a in assignments(parse_mesh("8x4")) if a == ("dp", "tp")]
[('dp', 'tp')]
"""

from __future__ import annotations

import itertools
import math

from costmodel.errors import InvalidConfigError
from costmodel.hardware.mesh import MeshSpec

KINDS = ("tp", "ep", "cp", "dp", "pp")  # fastest mesh axis first
PINNED_NAMES = {
    "data": "dp", "dp": "dp", "fsdp": "dp", "tensor": "tp", "tp": "tp", "model": "tp",
    "pipeline": "pp", "pp": "pp", "stage": "pp", "context": "cp", "cp": "cp", "sequence": "cp",
    "expert": "ep", "ep": "ep",
}
AXIS_NAMES = {"dp": "data", "tp": "tensor", "pp": "pipeline", "cp": "context", "ep": "expert", "tpe": "embed"}
TENSOR_EMBED = "tpe"
"""The kind of a mesh axis splitting the weights' model dimension in a 2D weight-stationary decode layout
(`Layout.tp_embed`): never assigned to a given mesh's axes, only on the mesh a serving plan derives."""
MAX_MESH_AXES = 16


def assignments(mesh: MeshSpec, *, max_cp: int = 1) -> list[tuple[str, ...]]:
    """Every kind-per-axis assignment consistent with pinned names and the device order.

    Raises:
      InvalidConfigError: more than `MAX_MESH_AXES` axes, or pinned names out of device order.
    """
    if len(mesh.axis_sizes) > MAX_MESH_AXES:
        raise InvalidConfigError(f"mesh has {len(mesh.axis_sizes)} axes, more than the {MAX_MESH_AXES} this planner supports",
                                 fix="merge axes (an axis of size 1 carries nothing)")
    options = []
    for name, size in zip(mesh.axis_names, mesh.axis_sizes):
        pinned = PINNED_NAMES.get(name.lower())
        options.append((pinned,) if pinned else tuple(k for k in KINDS if k != "ep" and (k != "cp" or size <= max_cp)))
    # Device order makes the kinds, fastest axis first, non-decreasing in KINDS: enumerate only
    # those (C(axes + 3, 3) of them) instead of every product of options.
    valid = []
    for order in itertools.combinations_with_replacement(range(len(KINDS)), len(options)):
        kinds = tuple(KINDS[i] for i in reversed(order))
        if all(k in opts for k, opts in zip(kinds, options)):
            valid.append(kinds)
    if not valid:
        raise InvalidConfigError(
            f"mesh axes {mesh.axis_names} cannot carry parallelism in device order (tensor innermost, pipeline outermost)",
            fix="order named axes as pipeline, data, context, expert, tensor (outer to inner)",
        )
    return sorted(valid)


def degrees(mesh: MeshSpec, kinds: tuple[str, ...]) -> tuple[int, int, int, int]:
    """(dp, tp, pp, cp) that ``kinds`` gives ``mesh``; dp counts the expert axes too, which split the batch.

    >>> from costmodel.hardware.mesh import parse_mesh
    >>> degrees(parse_mesh("data=2,expert=8,tensor=4"), ("dp", "ep", "tp")), expert_degree(("dp", "ep", "tp"), (2, 8, 4))
    ((16, 4, 1, 1), 8)
    """
    by_kind = {k: math.prod(size for size, kind in zip(mesh.axis_sizes, kinds) if kind == k) for k in KINDS}
    return by_kind["dp"] * by_kind["ep"], by_kind["tp"], by_kind["pp"], by_kind["cp"]


def carrying(kind: str) -> tuple[str, ...]:
    """The kinds whose mesh axes split what ``kind`` splits, in the order a spec names them: the
    batch's data split takes the expert axes first (they split the batch too; expert-major, the
    experts' region takes its expert-axis share without moving rows), then the data axes.

    >>> carrying("dp"), carrying("tp")
    (('ep', 'dp'), ('tp',))
    """
    return ("ep", "dp") if kind == "dp" else (kind,)


def expert_degree(kinds: tuple[str, ...], sizes: tuple[int, ...]) -> int:
    """The expert-parallel degree: the product of the axes carrying ep."""
    return math.prod(size for size, kind in zip(sizes, kinds) if kind == "ep")

"""Which parallelism rides each axis of a user's device mesh.

Each mesh axis carries one kind of parallelism (data, tensor, pipeline, context); several
axes may carry the same kind (its degree is their product). Axis names the user pinned
(``--mesh data=8,tensor=4``) fix their kind. Kinds are ordered from the fastest mesh axis
(last, inside a node) to the slowest as Megatron-LM orders devices — tensor, context,
data, pipeline — which is the device order the step simulator assumes.

>>> from costmodel.mesh import parse_mesh
>>> [a for a in assignments(parse_mesh("8x4")) if a == ("dp", "tp")]
[('dp', 'tp')]
"""

from __future__ import annotations

import itertools
import math

from costmodel.errors import InvalidConfigError
from costmodel.mesh import MeshSpec

KINDS = ("tp", "cp", "dp", "pp")  # fastest mesh axis first
PINNED_NAMES = {
    "data": "dp", "dp": "dp", "fsdp": "dp", "tensor": "tp", "tp": "tp", "model": "tp",
    "pipeline": "pp", "pp": "pp", "stage": "pp", "context": "cp", "cp": "cp", "sequence": "cp",
}
AXIS_NAMES = {"dp": "data", "tp": "tensor", "pp": "pipeline", "cp": "context"}


def assignments(mesh: MeshSpec, *, max_cp: int = 1) -> list[tuple[str, ...]]:
    """Every kind-per-axis assignment consistent with pinned names and the device order."""
    options = []
    for name, size in zip(mesh.axis_names, mesh.axis_sizes):
        pinned = PINNED_NAMES.get(name.lower())
        options.append((pinned,) if pinned else tuple(k for k in KINDS if k != "cp" or size <= max_cp))
    valid = []
    for kinds in itertools.product(*options):
        order = [KINDS.index(k) for k in reversed(kinds)]  # fastest axis first
        if order == sorted(order):
            valid.append(kinds)
    if not valid:
        raise InvalidConfigError(
            f"mesh axes {mesh.axis_names} cannot carry parallelism in device order (tensor innermost, pipeline outermost)",
            fix="order named axes as pipeline, data, context, tensor (outer to inner)",
        )
    return sorted(valid)


def degrees(mesh: MeshSpec, kinds: tuple[str, ...]) -> tuple[int, int, int, int]:
    """(dp, tp, pp, cp) that ``kinds`` gives ``mesh``."""
    by_kind = {k: math.prod(size for size, kind in zip(mesh.axis_sizes, kinds) if kind == k) for k in KINDS}
    return by_kind["dp"], by_kind["tp"], by_kind["pp"], by_kind["cp"]

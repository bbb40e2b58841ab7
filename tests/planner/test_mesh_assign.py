"""Tests `planner/mesh_assign.py`: assignments in device order, without enumerating every product."""

import itertools
import time

import pytest

from costmodel.errors import InvalidConfigError
from costmodel.hardware.mesh import parse_mesh
from planner.mesh_assign import KINDS, MAX_MESH_AXES, PINNED_NAMES, assignments


def _brute_force(mesh):
    options = [(PINNED_NAMES[n],) if n in PINNED_NAMES else tuple(k for k in KINDS if k != "ep" and (k != "cp" or s <= 1))
               for n, s in zip(mesh.axis_names, mesh.axis_sizes)]
    return sorted(k for k in itertools.product(*options)
                  if [KINDS.index(x) for x in reversed(k)] == sorted(KINDS.index(x) for x in k))


@pytest.mark.parametrize("text", ["8", "8x4", "2x1x2x1x2", "data=2,x=4,tensor=2", "pipeline=2,a=1,b=4", "1x1x1x1x1x1",
                                  "data=2,expert=4,tensor=2", "x=2,ep=4,y=2"])
def test_same_assignments_as_the_full_product(text):
    mesh = parse_mesh(text)
    assert assignments(mesh) == _brute_force(mesh)


def test_sixteen_axes_are_quick_and_seventeen_are_refused():
    start = time.perf_counter()
    assert len(assignments(parse_mesh("x".join(["2"] * MAX_MESH_AXES)))) == 153  # C(16 + 2, 2): tp, dp, pp per axis, in order
    assert time.perf_counter() - start < 1.0
    with pytest.raises(InvalidConfigError, match="17 axes"):
        assignments(parse_mesh("x".join(["1"] * 17)))


def test_only_an_axis_named_expert_carries_expert_parallelism_between_tensor_and_data():
    assert all("ep" not in kinds for kinds in assignments(parse_mesh("2x4x2")))
    assert assignments(parse_mesh("data=2,expert=4,tensor=2")) == [("dp", "ep", "tp")]
    with pytest.raises(InvalidConfigError, match="device order"):
        assignments(parse_mesh("expert=4,data=2"))

"""Tests `costmodel/hardware/mesh.py`: mesh strings and the links each axis crosses."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.errors import InvalidConfigError
from costmodel.hardware.mesh import axis_links, mesh_shapes_for, parse_mesh
from costmodel.hardware.registry import load_hardware

DETERMINISTIC = settings(derandomize=True, database=None, deadline=None)


@pytest.mark.parametrize(
    ("text", "names", "sizes"),
    [("8x4", ("axis0", "axis1"), (8, 4)), ("32", ("axis0",), (32,)), ("2x2x2", ("axis0", "axis1", "axis2"), (2, 2, 2)),
     ("data=8,tensor=4", ("data", "tensor"), (8, 4)), (" data = 2 , model = 1 ", ("data", "model"), (2, 1))],
)
def test_valid_meshes(text, names, sizes):
    mesh = parse_mesh(text)
    assert (mesh.axis_names, mesh.axis_sizes) == (names, sizes)


@pytest.mark.parametrize("text", ["8x", "0x4", "x4", "8x-1", "8 x 4 x", "data=8,data=4", "", "abc", "8x4.5", "1=2", "d=0"])
def test_invalid_meshes_say_why_with_an_example(text):
    with pytest.raises(InvalidConfigError, match="--mesh"):
        parse_mesh(text)


@DETERMINISTIC
@given(st.lists(st.integers(1, 64), min_size=1, max_size=4))
def test_device_count_is_the_product(sizes):
    assert parse_mesh("x".join(map(str, sizes))).n_devices == math.prod(sizes)


@DETERMINISTIC
@given(st.text(max_size=20))
def test_garbage_raises_only_invalid_config(text):
    try:
        parse_mesh(text)
    except InvalidConfigError:
        pass


@pytest.mark.parametrize(
    ("mesh", "expected"),
    [("8x4", {"axis0": ("nvlink3", "ib-hdr200"), "axis1": ("nvlink3",)}),
     ("4x8", {"axis0": ("ib-hdr200",), "axis1": ("nvlink3",)}),
     ("2x16", {"axis0": ("ib-hdr200",), "axis1": ("nvlink3", "ib-hdr200")}),
     ("32", {"axis0": ("nvlink3", "ib-hdr200")})],
)
def test_axis_links_on_8_gpu_nodes(mesh, expected):
    links = axis_links(parse_mesh(mesh), load_hardware("a100-80gb"))
    assert {name: link.tiers for name, link in links.items()} == expected


def test_tpu_axes_inside_a_slice_are_torus_rings():
    links = axis_links(parse_mesh("2x256"), load_hardware("tpu-v5e"))
    assert links["axis1"].wraparound and links["axis1"].tiers == ("ici-v5e",)
    assert links["axis0"].tiers == ("dcn",) and not links["axis0"].wraparound


def test_mesh_shapes_enumerate_every_factorisation():
    shapes = mesh_shapes_for(12, 3)
    assert all(math.prod(s) == 12 for s in shapes) and len(shapes) == len(set(shapes)) == 18
    assert shapes == sorted(shapes)

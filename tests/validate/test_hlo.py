"""Tests `validate/hlo.py`: replica-group forms, mesh axes, trip counts, promoted bytes, dot FLOPs."""

import pytest

from validate.hlo import collectives, dot_flops, loop_trip_counts

MESH = (("data", 2), ("tensor", 4))


def _one(line: str, mesh=MESH):
    text = f"ENTRY %main (a: f32[4]) -> f32[4] {{\n  {line}\n}}"
    (c,) = collectives(text, mesh_shape=mesh)
    return c


@pytest.mark.parametrize("groups, axes", [
    ("{{0,1,2,3},{4,5,6,7}}", ("tensor",)),
    ("{{0,4},{1,5},{2,6},{3,7}}", ("data",)),
    ("[2,4]<=[8]", ("tensor",)),
    ("[4,2]<=[2,4]T(1,0)", ("data",)),
    ("[1,8]<=[8]", ("data", "tensor")),
    ("mesh['x'=2,'y'=4] {'y'}", ("tensor",)),
    ("mesh['x'=2,'y'=4] {'x'}", ("data",)),
    ("mesh['x'=4,'y'=2], device_ids=([2,4]T(1,0)) {'x'}", ("tensor",)),
    ("{}", ("data", "tensor")),
])
def test_replica_groups_map_to_mesh_axes(groups, axes):
    c = _one(f"%ar = bf16[16]{{0}} all-reduce(%x), replica_groups={groups}, to_apply=%add")
    assert c.axes == axes and c.kind == "all-reduce" and c.bytes_per_call == 32 and not c.promoted


@pytest.mark.parametrize("groups, size", [("mesh['x'=2,'y'=4] {'y':(2)2}", 2), ("mesh['x'=2,'y'=4] {'y':(1)2}", 2),
                                          ("mesh['x'=2,'y'=4], device_ids=([2,2,2]T(1,0,2)) {'y':(2)2}", 2)])
def test_sub_axis_groups_are_part_of_their_axis(groups, size):
    c = _one(f"%ar = f32[16]{{0}} all-reduce(%x), replica_groups={groups}, to_apply=%add")
    assert c.axes == ("tensor",) and c.group_size == size


def test_buffer_bytes_per_kind_and_promotion():
    rs = _one("%rs = f32[4]{0} reduce-scatter(%x), replica_groups=[2,4]<=[8], dimensions={0}, to_apply=%add.clone_promoted")
    assert rs.kind == "reduce-scatter" and rs.promoted and rs.bytes_per_call == 4 * 4 * 4 / 2  # input = 4 × result, back to bf16
    tup = _one("%ag = (f32[8]{0}, bf16[8]{0}) all-gather(%x, %y), replica_groups=[2,4]<=[8], dimensions={0}")
    assert tup.bytes_per_call == 8 * 4 + 8 * 2
    cp = _one("%cp = bf16[10]{0} collective-permute(%x), source_target_pairs={{0,4},{4,0},{1,1}}")
    assert cp.kind == "collective-permute" and cp.axes == ("data",) and cp.bytes_per_call == 20


def test_only_elements_converted_from_bf16_count_at_bf16_bytes():
    text = """
%up (p: bf16[8]) -> f32[8] {
  %p = bf16[8]{0} parameter(0)
  %c = f32[8]{0} convert(%p)
  ROOT %b = f32[8]{0} bitcast(%c)
}
ENTRY %main (a: bf16[8], g: f32[4]) -> f32[8] {
  %a = bf16[8]{0} parameter(0)
  %g = f32[4]{0} parameter(1)
  %u = f32[8]{0} fusion(%a), kind=kLoop, calls=%up
  %v = f32[8]{0} convert(%a)
  %ar = (f32[8]{0}, f32[4]{0}) all-reduce(%u, %g), replica_groups=[2,4]<=[8], to_apply=%add.clone_promoted
  %cp = f32[8]{0} collective-permute(%v), source_target_pairs={{0,4},{4,0}}
  %kept = f32[8]{0} collective-permute(%u.2), source_target_pairs={{0,4},{4,0}}
}"""
    ar, cp, kept = collectives(text, mesh_shape=MESH)
    assert ar.promoted and ar.bytes_per_call == 8 * 2 + 4 * 4  # the genuine f32 element stays f32
    assert cp.promoted and cp.bytes_per_call == 8 * 2
    assert not kept.promoted and kept.bytes_per_call == 8 * 4


def test_an_upcast_stays_one_through_gathers_and_copy_fusions():
    text = """
%copied (q: f32[2,8]) -> f32[2,8] {
  %q = f32[2,8]{1,0} parameter(0)
  ROOT %c = f32[2,8]{0,1} copy(%q)
}
ENTRY %main (a: bf16[8]) -> f32[8,8] {
  %a = bf16[8]{0} parameter(0)
  %v = f32[8]{0} convert(%a)
  %g1 = f32[2,8]{1,0} all-gather(%v), replica_groups=[4,2]<=[8], dimensions={0}
  %w = f32[2,8]{0,1} fusion(%g1), kind=kLoop, calls=%copied
  %g2 = f32[8,8]{1,0} all-gather(%w), replica_groups=[2,4]<=[8], dimensions={0}
}"""
    first, second = collectives(text, mesh_shape=MESH)
    assert first.promoted and first.bytes_per_call == 2 * 8 * 2
    assert second.promoted and second.bytes_per_call == 8 * 8 * 2  # gathered again: still bf16 data widened


def test_a_fused_upcast_stays_one_through_its_transpose():
    # XLA:CPU fuses the convert it moves ahead of a gather with the transpose before it.
    text = """
%convert_transpose (p: bf16[4,2]) -> f32[2,4] {
  %p = bf16[4,2]{1,0} parameter(0)
  %c = f32[4,2]{1,0} convert(%p)
  ROOT %t = f32[2,4]{1,0} transpose(%c), dimensions={1,0}
}
ENTRY %main (a: bf16[4,2], b: f32[2,4]) -> f32[4,4] {
  %a = bf16[4,2]{1,0} parameter(0)
  %b = f32[2,4]{1,0} parameter(1)
  %u = f32[2,4]{1,0} fusion(%a), kind=kLoop, calls=%convert_transpose
  %g = f32[4,4]{1,0} all-gather(%u), replica_groups=[4,2]<=[8], dimensions={0}
  %t = f32[4,2]{1,0} transpose(%b), dimensions={1,0}
  %h = f32[8,2]{1,0} all-gather(%t), replica_groups=[4,2]<=[8], dimensions={0}
  %rs = f32[1,4]{1,0} reduce-scatter(%u), replica_groups=[4,2]<=[8], dimensions={0}, to_apply=%add
}"""
    upcast, genuine, summed = collectives(text, mesh_shape=MESH)
    assert upcast.promoted and upcast.bytes_per_call == 4 * 4 * 2
    assert not genuine.promoted and genuine.bytes_per_call == 8 * 2 * 4
    # A reduction's transposed upcast is the program's own cast (fp32 gradients summed): fp32 bytes.
    assert not summed.promoted and summed.bytes_per_call == 2 * 4 * 4


def test_nested_loops_multiply_trip_counts():
    text = """
%inner (p: f32[]) -> f32[] {
  %ar = f32[2]{0} all-reduce(%x), replica_groups=[2,4]<=[8], to_apply=%add
}
%outer (p: f32[]) -> f32[] {
  %w = (s32[]) while(%t), condition=%c, body=%inner, backend_config={"known_trip_count":{"n":"32"}}
}
ENTRY %main (a: f32[4]) -> f32[4] {
  %w2 = (s32[]) while(%t), condition=%c2, body=%outer, backend_config={"known_trip_count":{"n":"4"}}
}"""
    (c,) = collectives(text, mesh_shape=MESH)
    assert c.calls == 128 and c.total_bytes == 128 * 8
    assert loop_trip_counts(text) == {"inner": 128, "outer": 4, "main": 1}


def test_a_conditional_branch_runs_its_given_share_of_the_conditional():
    text = """
%forward (p: f32[]) -> f32[] {
  %ar = f32[2]{0} all-reduce(%x), replica_groups=[2,4]<=[8], to_apply=%add
}
%backward (p: f32[]) -> f32[] {
  %ar2 = f32[4]{0} all-reduce(%x), replica_groups=[2,4]<=[8], to_apply=%add
}
%body (p: f32[]) -> f32[] {
  %c = (f32[]) conditional(%i, %a, %b), branch_computations={%forward, %backward}
}
ENTRY %main (a: f32[4]) -> f32[4] {
  %w = (s32[]) while(%t), condition=%c2, body=%body, backend_config={"known_trip_count":{"n":"12"}}
}"""
    shared = {c.name: c.calls for c in collectives(text, mesh_shape=MESH, branch_shares=(0.25, 0.75))}
    assert shared == {"ar": 3, "ar2": 9}
    assert {c.name: c.calls for c in collectives(text, mesh_shape=MESH)} == {"ar": 12, "ar2": 12}  # unknown: every time


def test_dots_inside_a_looped_fusion_count_per_iteration():
    text = """
%fused (param_0: bf16[8,16], param_1: bf16[16,4]) -> f32[8,4] {
  %param_0 = bf16[8,16]{1,0} parameter(0)
  %param_1 = bf16[16,4]{1,0} parameter(1)
  ROOT %dot.1 = f32[8,4]{1,0} dot(%param_0, %param_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
%body (p: f32[]) -> f32[] {
  %f = f32[8,4]{1,0} fusion(%a, %b), kind=kCustom, calls=%fused
}
ENTRY %main (a: f32[4]) -> f32[4] {
  %w = (s32[]) while(%t), condition=%c, body=%body, backend_config={"known_trip_count":{"n":"3"}}
}"""
    assert dot_flops(text) == 3 * 2 * 8 * 4 * 16

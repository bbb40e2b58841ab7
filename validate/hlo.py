"""Read a compiled (post-SPMD-partitioning) HLO module: its collectives, per mesh axis, with loop trip counts.

What ``compiled.as_text()`` says, and the four facts of XLA this module handles:

- A collective inside a ``while`` body (a scanned layer, a micro-batch loop) runs once per
  iteration: its bytes are multiplied by the loop's ``known_trip_count``, nested loops
  multiplying.
- A collective inside a ``conditional``'s branch runs when that branch is taken, which the
  program's data decides: the caller gives each branch's share of the conditional's executions
  (`validate.split_backward.branch_shares`); without it every branch counts every time.
- ``replica_groups`` come as explicit lists (``{{0,1},{2,3}}``), as iota
  (``[8,4]<=[32]``, ``[16,2]<=[2,4,4]T(2,1,0)``) or in mesh form
  (``mesh['axis_0'=4,'axis_1'=8], device_ids=([8,4]T(1,0)) {'axis_0'}``). Each group is
  mapped to the plan's mesh axes by the device coordinates that vary within it.
- The CPU backend promotes bf16 reductions to f32 (their reducer is named
  ``*.clone_promoted``), moves bf16 → f32 converts ahead of data movement, and combines
  collectives into tuples, promoted bf16 ones with genuine f32 ones. An element of a
  promoted reduction or of a ``collective-permute`` whose operand was just converted from
  bf16 counts at bf16 bytes (half); a promoted reduction in which no such operand is
  recognised is halved whole. A moved convert may be fused with the transpose before it; a
  gather (or permute, all-to-all) of such a fusion counts at bf16 bytes too. Tuple elements
  are summed.

Bytes are per device and count the full buffer of the collective: an all-reduce's array,
an all-gather's gathered result, a reduce-scatter's input (its result × the group size),
an all-to-all's or a collective-permute's array.

>>> text = '''
... %body (p: (s32[], f32[4])) -> (s32[], f32[4]) {
...   %ar = f32[4]{0} all-reduce(%x), replica_groups=[2,2]<=[4], to_apply=%add.clone_promoted
... }
... ENTRY %main (a: f32[4]) -> f32[4] {
...   %while.1 = (s32[], f32[4]) while(%t), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
...   %ag = bf16[8]{0} all-gather(%y), replica_groups={{0,2},{1,3}}, dimensions={0}
... }'''
>>> for c in collectives(text, mesh_shape=(("data", 2), ("tensor", 2))):
...     print(c.kind, c.axes, c.bytes_per_call, c.calls)
all-reduce ('tensor',) 8.0 3.0
all-gather ('data',) 16.0 1.0
"""

from __future__ import annotations

import math
import re
from collections import defaultdict

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
                "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_COMPUTATION = re.compile(r"^(?:ENTRY )?%(\S+) .*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(\S+) = (.+?) ([a-z][a-z0-9-]*)\((.*)$")
_ARRAY = re.compile(r"\b([a-z]+[0-9]*)\[([0-9,]*)\]")
_CALLED = re.compile(r"\b(body|calls|to_apply|condition)=%?([^,}\s]+)")
_BRANCHES = re.compile(r"\bbranch_computations=\{([^}]*)\}")
_REPLICA_GROUPS = re.compile(r"replica_groups=(mesh\[[^\]]*\](?:, device_ids=\((?:[^()]|\([^)]*\))*\))? \{[^}]*\}"  # mesh form
                             r"|\{\{[^=]*?\}\}|\{\}"  # explicit lists, or one group of all devices
                             r"|\[[\d,]+\]<=\[[\d,]+\](?:T\([\d,]+\))?)")  # iota
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_OPERAND = re.compile(r"^%?([^,)\s]+)")
_PASS_THROUGH = ("bitcast", "reshape", "copy")
# Collectives that move values without combining them: an upcast value stays one through them.
_MOVES = ("all-gather", "all-to-all", "collective-permute")


class Collective(BaseModel):
    """One collective instruction of the compiled module."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Instruction name in the module.")
    kind: str = Field(description="all-reduce, all-gather, reduce-scatter, all-to-all or collective-permute.")
    axes: tuple[str, ...] = Field(description="Mesh axes its groups span (empty: a no-op group of one).")
    group_size: int = Field(description="Devices per replica group.")
    bytes_per_call: float = Field(description="Per-device buffer bytes of one execution, in the program's dtype.")
    promoted: bool = Field(description="A bf16 reduction the CPU backend runs in f32 (bytes halved back).")
    calls: float = Field(description="Executions per step: the product of the trip counts of the loops around it (inside a "
                         "conditional, times its branch's share of the conditional's executions).")

    @property
    def total_bytes(self) -> float:
        return self.bytes_per_call * self.calls


def _shape_bytes(result_type: str) -> float:
    return float(sum(_DTYPE_BYTES[d] * math.prod(int(n) for n in dims.split(",") if n) for d, dims in _ARRAY.findall(result_type)))


def _iota_groups(spec: str) -> np.ndarray:
    """``[16,2]<=[2,4,4]T(2,1,0)`` → a (groups, size) array of device ids."""
    m = re.match(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", spec)
    out_shape = [int(n) for n in m.group(1).split(",")]
    dims = [int(n) for n in m.group(2).split(",")]
    ids = np.arange(math.prod(dims)).reshape(dims)
    if m.group(3):
        ids = ids.transpose([int(n) for n in m.group(3).split(",")])
    return ids.reshape(out_shape[0], -1) if len(out_shape) > 1 else ids.reshape(1, -1)


def _mesh_form_groups(spec: str) -> np.ndarray:
    """``mesh['a'=4,'b'=8], device_ids=([8,4]T(1,0)) {'a'}`` → groups along the named axes."""
    axes = [(n, int(s)) for n, s in re.findall(r"'([^']+)'=(\d+)", spec.split("]")[0])]
    ids_match = re.search(r"device_ids=\((\[[\d,]*\](?:<=\[[\d,]*\])?(?:T\([\d,]+\))?)\)", spec)
    n = math.prod(s for _, s in axes)
    if ids_match:
        text = ids_match.group(1)
        ids = _iota_groups(text if "<=" in text else re.sub(r"\[([\d,]+)\]", rf"[{n}]<=[\1]", text, count=1)).reshape(-1)
    else:
        ids = np.arange(n)
    grouped = re.search(r"\}?\s*\{([^}]*)\}\s*$", spec)
    # Each grouped entry names an axis, or a sub-axis 'a':(p)s: the s-sized factor after the first p of axis a.
    along = {m.group(1): (int(m.group(2)), int(m.group(3))) if m.group(2) else None
             for m in re.finditer(r"'([^']+)'(?::\((\d+)\)(\d+))?", grouped.group(1) if grouped else "")}
    factors: list[int] = []
    moved: list[int] = []
    for name, size in axes:
        sub = along.get(name)
        if name in along and sub is None:
            moved.append(len(factors))
        parts = [size] if sub is None else [sub[0], sub[1], size // (sub[0] * sub[1])]
        if sub is not None:
            moved.append(len(factors) + 1)
        factors += parts
    grid = ids.reshape(factors)
    rest = [i for i in range(len(factors)) if i not in moved]
    return grid.transpose(rest + moved).reshape(-1, math.prod(factors[i] for i in moved) if moved else 1)


def _groups(attrs: str) -> np.ndarray | None:
    if "source_target_pairs=" in attrs:
        pairs = re.search(r"source_target_pairs=\{(.*?)\}\}", attrs).group(1)
        return np.array([[int(a), int(b)] for a, b in re.findall(r"\{?(\d+),(\d+)\}?", pairs)])
    m = _REPLICA_GROUPS.search(attrs)
    if m is None and "replica_groups=" in attrs:
        raise ValueError(f"unrecognised replica_groups in: {attrs[:200]}")
    if m is None or m.group(1) == "{}":
        return None
    spec = m.group(1)
    if spec.startswith("mesh"):
        return _mesh_form_groups(spec)
    if spec.startswith("["):
        return _iota_groups(spec)
    return np.array([[int(d) for d in g.split(",")] for g in re.findall(r"\{([\d,]+)\}", spec)])


def _axes_of(groups: np.ndarray | None, coords: np.ndarray, names: tuple[str, ...]) -> tuple[str, ...]:
    """Mesh axes along which the devices of any group differ."""
    if groups is None:
        return names  # all devices in one group
    varying = np.zeros(len(names), bool)
    for g in groups:
        c = coords[g]
        varying |= (c != c[0]).any(axis=0)
    return tuple(n for n, v in zip(names, varying) if v)


def _computations(text: str) -> dict[str, list[str]]:
    comps: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        m = _COMPUTATION.match(line)
        if m:
            current = m.group(1)
            comps[current] = []
        elif line.startswith("}"):
            current = None
        elif current is not None:
            comps[current].append(line)
    return comps


def _multipliers(comps: dict[str, list[str]], branch_shares: tuple[float, ...] | None = None) -> dict[str, float]:
    """Executions per step of each computation: while bodies by their trip count, nested loops multiplying;
    branch ``i`` of a conditional with ``len(branch_shares)`` branches by ``branch_shares[i]`` of the
    conditional's (which branch runs is data, so the caller says how often; otherwise every branch counts
    as running every time, an upper bound)."""
    callers: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for comp, lines in comps.items():
        for line in lines:
            trip = _TRIP.search(line)
            for role, callee in _CALLED.findall(line):
                callers[callee].append((comp, int(trip.group(1)) if role == "body" and trip else 1))
            for listed in _BRANCHES.findall(line):
                branches = [b.strip().lstrip("%") for b in listed.split(",")]
                shares = branch_shares if branch_shares and len(branch_shares) == len(branches) else (1.0,) * len(branches)
                for branch, share in zip(branches, shares):
                    callers[branch].append((comp, share))
    memo: dict[str, float] = {}

    def times(comp: str, seen: frozenset[str] = frozenset()) -> float:
        if comp not in memo:
            calls = [(c, k) for c, k in callers.get(comp, []) if c not in seen]
            memo[comp] = max((k * times(c, seen | {comp}) for c, k in calls), default=1)
        return memo[comp]

    return {c: times(c) for c in comps}


def collectives(text: str, *, mesh_shape: tuple[tuple[str, int], ...], branch_shares: tuple[float, ...] | None = None
                ) -> list[Collective]:
    """Every collective of the module ``text`` with its mesh axes, bytes and executions per step
    (``branch_shares``: how often each branch of the program's conditionals runs, `_multipliers`).

    ``mesh_shape`` is ((axis name, size), ...) major first. Replica groups name devices by
    their position in the executable's device assignment (``use_global_device_ids``), which
    for ``jit`` over a mesh is the mesh's devices in row-major order, whatever their
    ``Device.id`` (under ``jax.distributed`` those are not 0..n-1).
    """
    names = tuple(n for n, _ in mesh_shape)
    sizes = tuple(s for _, s in mesh_shape)
    n_devices = math.prod(sizes)
    coords = np.array(np.unravel_index(np.arange(n_devices), sizes)).T
    comps = _computations(text)
    times = _multipliers(comps, branch_shares)
    instructions = {comp: {m.group(1): m for m in map(_INSTRUCTION.match, lines) if m} for comp, lines in comps.items()}
    copies = {comp for comp, defined in instructions.items()
              if all(m.group(3) in (*_PASS_THROUGH, "parameter") for m in defined.values())}
    upcasts = _upcast_computations(comps, instructions)
    # XLA:CPU fuses a convert it moves ahead of a gather with the transpose before it; a reduction's
    # transposed upcast is the program's own (gradients cast to fp32 before they are summed).
    moved_upcasts = _upcast_computations(comps, instructions, (*_PASS_THROUGH, "transpose"))
    found = []
    for comp, defined in instructions.items():
        for m in defined.values():
            if m.group(3).removesuffix("-start") not in KINDS:
                continue
            name, result_type, op, attrs = m.groups()
            kind = op.removesuffix("-start")
            groups = _groups(attrs)
            size = groups.shape[1] if groups is not None and kind != "collective-permute" else n_devices
            if kind == "collective-permute":
                groups = groups[groups[:, 0] != groups[:, 1]] if groups is not None else None
                size = 2
            elements = [_shape_bytes(f"{d}[{dims}]") for d, dims in _ARRAY.findall(result_type.split("->")[0])]
            if op.endswith("-start"):  # async pairs: (operands, results) tuples; keep the results
                elements = elements[len(elements) // 2:]
            operands = re.findall(r"%([^,\s)]+)", attrs.split(")")[0])
            widened = moved_upcasts if kind in _MOVES else upcasts
            halved = [len(operands) == len(elements) and _from_bf16(o, defined, widened, copies) for o in operands] or [False]
            if "clone_promoted" in attrs and not any(halved):
                halved = [True] * len(elements)
            buffer = sum(b / 2 if h else b for b, h in zip(elements, halved)) * (size if kind == "reduce-scatter" else 1)
            found.append(Collective(
                name=name, kind=kind, axes=_axes_of(groups, coords, names) if groups is None or len(groups) else (),
                group_size=size, bytes_per_call=buffer, promoted=any(halved), calls=times[comp],
            ))
    return found


def _from_bf16(name: str, defined: dict[str, re.Match[str]], upcasts: set[str], copies: set[str] = frozenset(),
               through: tuple[str, ...] = _PASS_THROUGH) -> bool:
    """Whether instruction ``name`` is an f32 value just converted from bf16: a ``convert``,
    or a fusion whose result is one (looking through ``through`` (bitcasts, reshapes and copies),
    fusions of ``copies`` computations, and collectives that only move the value: a gather of a
    gathered upcast moves an upcast too)."""
    m = defined.get(name)
    while m is not None and (m.group(3) in through or m.group(3).removesuffix("-done").removesuffix("-start") in _MOVES
                             or (m.group(3) == "fusion" and (c := _CALLED.search(m.group(4))) is not None and c.group(2) in copies)):
        m = defined.get(_OPERAND.match(m.group(4)).group(1))
    if m is None or not m.group(2).startswith("f32["):
        return False
    if m.group(3) == "convert":
        source = defined.get(_OPERAND.match(m.group(4)).group(1))
        return source is not None and source.group(2).startswith("bf16[")
    called = _CALLED.search(m.group(4))
    return m.group(3) == "fusion" and called is not None and called.group(2) in upcasts


def _upcast_computations(comps: dict[str, list[str]], instructions: dict[str, dict[str, re.Match[str]]],
                         through: tuple[str, ...] = _PASS_THROUGH) -> set[str]:
    """Fused computations whose result is an f32 conversion of a bf16 value, looking through
    ``through`` (``instructions``: each computation's parsed instructions by name)."""
    out = set()
    for comp, lines in comps.items():
        root = next((line.split("=")[0].strip().removeprefix("ROOT ").lstrip("%") for line in lines
                     if line.lstrip().startswith("ROOT ")), None)
        if root is not None and _from_bf16(root, instructions[comp], set(), through=through):
            out.add(comp)
    return out


def dot_flops(text: str, branch_shares: tuple[float, ...] | None = None) -> float:
    """Matmul FLOPs per device per step: 2 × result elements × contracted size of every ``dot``,
    times the executions of its computation (loop bodies by their trip counts), which is what
    ``cost_analysis()`` leaves out: it counts a while body once.

    >>> dot_flops('''
    ... %f (a: f32[8,4], b: f32[4,2]) -> f32[8,2] {
    ...   %a = f32[8,4]{1,0} parameter(0)
    ...   ROOT %d = f32[8,2]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
    ... }''')
    128.0
    """
    comps = _computations(text)
    times = _multipliers(comps, branch_shares)
    total = 0.0
    for comp, lines in comps.items():
        shapes: dict[str, list[int]] = {}
        for line in lines:
            m = _INSTRUCTION.match(line)
            if not m:
                continue
            name, result_type, op, rest = m.groups()
            arrays = _ARRAY.findall(result_type)
            dims = [int(n) for n in arrays[0][1].split(",") if n] if len(arrays) == 1 else []
            shapes[name] = dims
            if op != "dot":
                continue
            lhs = rest.split(",")[0].strip().lstrip("%").rstrip(")")
            contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", rest).group(1)
            contracted = math.prod(shapes[lhs][int(i)] for i in contracting.split(",") if i) if lhs in shapes else 0
            total += 2.0 * math.prod(dims) * contracted * times[comp]
    return total


def loop_trip_counts(text: str) -> dict[str, float]:
    """Executions per step of each computation of the module (1 outside loops)."""
    return _multipliers(_computations(text))

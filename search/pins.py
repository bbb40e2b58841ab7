"""`LayoutPins`: the parts of a layout the user fixes (``plan --zero 1 --micro-batch 2``); the search chooses the rest.

A pin narrows the layout search's space (`pinned_space`): a pinned degree keeps the (dp, tp, pp, cp)
splits that have it, a pinned knob is the one value tried. Pins the devices, the mesh or the model
cannot carry are refused before any layout is costed, each naming its flag and the values that would
do (`InvalidPlanError`). When nothing fits in memory under the pins, `pinned_failure` says which pin to
drop and what the best layout without pins needs.

>>> from costmodel.inputs.model_config import ModelConfig
>>> m = ModelConfig(name="m", hidden_size=1024, num_layers=8, num_heads=16, ffn_size=4096, vocab_size=32000)
>>> pins = LayoutPins(zero_stage=1, micro_batch=2)
>>> pins.flags
'--micro-batch 2 --zero 1'
>>> space = pinned_space(m, TrainConfig(global_batch=64), SearchSpace(), pins, n_devices=8, where="8 devices", devices_per_node=8)
>>> space.zero_stages, space.micro_batches, len(space.splits)
((1,), (2,), 10)
>>> pinned_space(m, TrainConfig(global_batch=64), SearchSpace(), LayoutPins(tp=3), n_devices=8, where="8 devices",
...              devices_per_node=8)  # doctest: +ELLIPSIS
Traceback (most recent call last):
costmodel.errors.InvalidPlanError: --tp 3: 8 devices can carry tp 1, 2, 4 or 8 only; fix: use --tp 1, 2, 4 or 8, or a device ...
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from costmodel.errors import InfeasibleError, InvalidPlanError, PlannerError, TimeLimitError, UnsupportedError
from costmodel.hardware.machine import Machine
from costmodel.inputs.layout import Offload, Recompute
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import TrainConfig
from costmodel.step.estimate import StepEstimate
from search.layouts import NothingFitsError, SearchSpace, degree_splits, divisors, grid_search, over_budget

_GIB = 2**30
DEGREES = ("dp", "tp", "pp", "cp")  # the order of a split's degrees
# What an intra-op planner (ILP, search) honours: the stage program it shards is traced at this
# micro-batch and recompute. It shards each op over the mesh axes itself: no degree, ZeRO stage or
# sequence parallelism to pin, and no pipeline stages (`search.layouts.INTRA_OP_PIPELINE_RULE`).
INTRA_OP_PINS = ("micro_batch", "recompute")
SERVING_PINS = ("dp", "tp", "pp")  # what a serving layout search chooses (`search.serving_layouts`)
_FLAGS = {"zero_stage": "--zero"}  # a flag not spelled as its field


class LayoutPins(BaseModel):
    """Layout parts fixed by hand; None: the planner chooses it.

    >>> LayoutPins(tp=8, sequence_parallel=False, recompute="full").flags
    '--tp 8 --recompute full --sequence-parallel no'
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    dp: PositiveInt | None = Field(None, description="Data-parallel degree (--dp).")
    tp: PositiveInt | None = Field(None, description="Tensor-parallel degree (--tp); it divides the heads and stays in a node.")
    pp: PositiveInt | None = Field(None, description="Pipeline stages (--pp).")
    cp: PositiveInt | None = Field(None, description="Context-parallel degree (--cp).")
    ep: PositiveInt | None = Field(None, description="Expert-parallel degree (--ep), MoE models: it divides the experts and "
                                   "the data-parallel degree, whose devices it splits the experts over.")
    interleave: PositiveInt | None = Field(None, description="Model chunks per pipeline device, virtual stages (--interleave); "
                                           "above 1 needs pp > 1.")
    micro_batch: PositiveInt | None = Field(None, description="Sequences per micro-batch on one data-parallel replica "
                                            "(--micro-batch); it divides the replica's share of the global batch.")
    recompute: Recompute | None = Field(None, description="Activation recompute policy (--recompute).")
    sequence_parallel: bool | None = Field(None, description="Megatron sequence parallelism (--sequence-parallel yes|no); "
                                           "yes needs tp > 1.")
    zero_stage: int | None = Field(None, ge=0, le=3, description="ZeRO stage (--zero): 1 shards the optimizer state over "
                                   "the data-parallel replicas, 2 also the gradients, 3 also the parameters (FSDP).")

    @property
    def given(self) -> dict[str, Any]:
        """The pinned fields and their values, in field order."""
        return {name: value for name in type(self).model_fields if (value := getattr(self, name)) is not None}

    @property
    def flags(self) -> str:
        """The pins as the ``plan`` flags that give them; '' without pins."""
        return " ".join(pin_flag(name, value) for name, value in self.given.items())

    def without(self, name: str) -> LayoutPins:
        """These pins less ``name`` (the planner then chooses it)."""
        return self.model_copy(update={name: None})

    def unhonoured_by_intra_op(self) -> dict[str, Any]:
        """The pins an intra-op planner cannot honour (all but `INTRA_OP_PINS`, pp and interleave of 1)."""
        return {n: v for n, v in self.given.items() if n not in INTRA_OP_PINS and not (n in ("pp", "interleave") and v == 1)}


def flag_of(name: str) -> str:
    """The ``plan`` flag of pin ``name``: ``--zero`` for zero_stage, the field's name in dashes otherwise."""
    return _FLAGS.get(name, "--" + name.replace("_", "-"))


def pin_flag(name: str, value: Any) -> str:
    """``--zero 1``, ``--sequence-parallel yes``: a pin as its flag and value."""
    shown = ("yes" if value else "no") if isinstance(value, bool) else getattr(value, "value", value)
    return f"{flag_of(name)} {shown}"


def _or(values: list[int]) -> str:
    return str(values[0]) if len(values) == 1 else f"{', '.join(map(str, values[:-1]))} or {values[-1]}"


def pinned_splits(splits: tuple[tuple[int, int, int, int], ...], pins: LayoutPins, *, where: str,
                  mesh: bool) -> tuple[tuple[int, int, int, int], ...]:
    """The (dp, tp, pp, cp) ``splits`` with the pinned degrees; a degree none of them has is refused, naming those they have."""
    kept, named = splits, []
    for i, name in enumerate(DEGREES):
        value = getattr(pins, name)
        if value is None:
            continue
        narrowed = tuple(s for s in kept if s[i] == value)
        if not narrowed:
            can = sorted({s[i] for s in kept})
            other = f", or a --mesh whose axes can carry {name}={value}" if mesh else \
                f", or a device count that {math.prod(getattr(pins, d) or 1 for d in DEGREES)} divides"
            with_pins = f" with {' '.join(named)}" if named else ""
            raise InvalidPlanError(f"{pin_flag(name, value)}: {where}{with_pins} can carry {name} {_or(can)} only",
                                   fix=f"use {flag_of(name)} {_or(can)}{other}")
        named.append(pin_flag(name, value))
        kept = narrowed
    return kept


def pinned_space(model: ModelConfig, train: TrainConfig, space: SearchSpace, pins: LayoutPins, *, n_devices: int, where: str,
                 devices_per_node: int) -> SearchSpace:
    """``space`` narrowed to ``pins`` (``space`` itself without pins).

    Raises:
      InvalidPlanError: a pin the devices (``where``: the mesh or the device count, in words), the
        model, the global batch or the other pins leave no layout for; the message names its flag
        and the values that would do.
    """
    if not pins.given:
        return space
    all_splits = space.splits if space.splits is not None else tuple(degree_splits(n_devices, max_cp=max(space.max_cp, pins.cp or 1)))
    splits = pinned_splits(all_splits, pins, where=where, mesh=space.splits is not None)
    _check_model(model, pins, devices_per_node=devices_per_node)
    degrees = [pin_flag(d, getattr(pins, d)) for d in DEGREES if getattr(pins, d) is not None]
    where += f" with {' '.join(degrees)}" if degrees else ""
    _check_knobs(train, splits, pins, where=where)
    update: dict[str, Any] = {"splits": splits}
    for field, name in (("micro_batches", "micro_batch"), ("recompute", "recompute"), ("zero_stages", "zero_stage"),
                        ("interleaves", "interleave")):
        if getattr(pins, name) is not None:
            update[field] = (getattr(pins, name),)
    if pins.sequence_parallel is not None:
        update["sequence_parallel"] = pins.sequence_parallel
    if pins.ep is not None:
        if space.expert_degrees is not None and pins.ep not in space.expert_degrees:
            raise InvalidPlanError(f"--ep {pins.ep}: {where} has expert axes of {_or(list(space.expert_degrees))} devices",
                                   fix=f"name a mesh axis expert={pins.ep} (e.g. --mesh data=N,expert={pins.ep}), or use --ep "
                                       f"{_or(list(space.expert_degrees))}")
        update["expert_degrees"] = (pins.ep,)
    return space.model_copy(update=update)


def _check_model(model: ModelConfig, pins: LayoutPins, *, devices_per_node: int) -> None:
    """Refuse a tensor-parallel degree the heads or a node cannot take, and more stages than layers."""
    if pins.tp is not None and (model.num_heads % pins.tp or (model.num_kv_heads % pins.tp and pins.tp % model.num_kv_heads)):
        raise InvalidPlanError(f"--tp {pins.tp} does not split {model.name}'s {model.num_heads} heads "
                               f"({model.num_kv_heads} key/value heads)",
                               fix=f"use a --tp that divides {model.num_heads} and divides or is a multiple of {model.num_kv_heads}")
    if pins.tp is not None and pins.tp > devices_per_node:
        raise InvalidPlanError(f"--tp {pins.tp} spans nodes: tensor parallelism stays inside a node of {devices_per_node} devices",
                               fix=f"use --tp {devices_per_node} or less (--devices-per-node overrides the profile)")
    if pins.ep is not None and pins.ep > 1 and (not model.is_moe or model.num_experts % pins.ep):
        raise InvalidPlanError(f"--ep {pins.ep}: {model.name} has no experts" if not model.is_moe else
                               f"--ep {pins.ep} does not split {model.name}'s {model.num_experts} experts",
                               fix="drop --ep (dense models have no experts)" if not model.is_moe else
                                   f"use an --ep that divides {model.num_experts}")
    chunks = (pins.pp or 1) * (pins.interleave or 1)
    if chunks > model.num_layers:
        raise InvalidPlanError(f"--pp {pins.pp or 1} --interleave {pins.interleave or 1}: {model.name} has {model.num_layers} "
                               f"layers, fewer than the {chunks} pipeline chunks", fix="use fewer --pp stages or --interleave chunks")


def _check_knobs(train: TrainConfig, splits: tuple[tuple[int, int, int, int], ...], pins: LayoutPins, *, where: str) -> None:
    """Refuse a micro-batch no replica's batch divides, and ZeRO, sequence parallelism or interleaving without their degree."""
    gb, mb = train.global_batch, pins.micro_batch
    if mb is not None and not any(gb % (s[0] * mb) == 0 for s in splits):
        dps = sorted({s[0] for s in splits})
        dp = max((d for d in dps if gb % d == 0), default=None)
        if dp is None:
            raise InvalidPlanError(f"global batch {gb} does not split over dp {_or(dps)} of {where}",
                                   fix=f"use a --global-batch that is a multiple of {dps[0] * mb}")
        per = gb // dp
        batch = f"of {per} sequences (global batch {gb} over dp={dp})" if len(dps) == 1 else \
            f"of global batch {gb} over any dp of {where} ({_or(dps)})"
        raise InvalidPlanError(f"--micro-batch {mb} does not divide the per-replica batch {batch}",
                               fix=f"use --micro-batch {_or(divisors(per)[:6])}, or a --global-batch that is a multiple of {dp * mb}")
    needs = (("zero_stage", (pins.zero_stage or 0) > 0, 0, "shards state over data-parallel replicas", "--dp > 1"),
             ("sequence_parallel", pins.sequence_parallel is True, 1, "shards activations over tensor parallelism", "--tp > 1"),
             ("interleave", (pins.interleave or 1) > 1, 2, "cuts pipeline stages into chunks", "--pp > 1"))
    for name, pinned, i, what, degree in needs:
        if pinned and all(s[i] == 1 for s in splits):
            off = "no" if name == "sequence_parallel" else {"zero_stage": "0", "interleave": "1"}[name]
            raise InvalidPlanError(f"{pin_flag(name, getattr(pins, name))} {what}, but {where} leaves {DEGREES[i]}=1",
                                   fix=f"use {flag_of(name)} {off}, or leave devices for it ({degree})")


def serving_splits(splits: tuple[tuple[int, int, int, int], ...] | None, pins: LayoutPins, *, n_devices: int, where: str,
                   workload: str) -> tuple[tuple[int, int, int, int], ...] | None:
    """The degrees a serving search may use under ``pins`` (``splits`` itself without pins).

    Raises:
      UnsupportedError: a pin of a training knob (a serving search chooses only dp, tp and pp).
      InvalidPlanError: a degree the devices cannot carry.
    """
    knobs = [pin_flag(n, v) for n, v in pins.given.items() if n not in SERVING_PINS]
    if knobs:
        raise UnsupportedError(f"{' '.join(knobs)}: a {workload} plan's layout search chooses only dp, tp and pp",
                               fix=f"drop {' '.join(knobs)} (serving honours --dp, --tp and --pp)")
    if not pins.given:
        return splits
    return pinned_splits(splits or tuple(degree_splits(n_devices)), pins, where=where, mesh=splits is not None)


def pinned_failure(err: InfeasibleError, model: ModelConfig, train: TrainConfig, machine: Machine, *, n_devices: int,
                   unpinned: SearchSpace, pins: LayoutPins, where: str, time_limit_s: float) -> InfeasibleError:
    """The error to raise when the search under ``pins`` found nothing (``unpinned``: its space without them).

    ``err`` itself without pins or on a time limit. With pins, the error names them; when memory was
    the cause, its fix names each pin whose release alone lets a layout fit (and that layout), and the
    best layout without any pin (searched again here, on this failure path only).
    """
    if not pins.given or isinstance(err, TimeLimitError):
        return err
    flags = pins.flags
    if not isinstance(err, NothingFitsError):
        return InfeasibleError(f"{err.cause} (pinned: {flags})", fix=f"relax {flags}, or {err.fix}")

    def best(space_pins: LayoutPins) -> StepEstimate | None:
        try:
            space = pinned_space(model, train, unpinned, space_pins, n_devices=n_devices, where=where,
                                 devices_per_node=machine.devices_per_node)
            return grid_search(model, train, machine, n_devices=n_devices, space=space, time_limit_s=time_limit_s).best
        except PlannerError:
            return None

    freed = [(name, est) for name in pins.given if (est := best(pins.without(name))) is not None]
    free = best(LayoutPins())
    drops = "; ".join(f"drop {pin_flag(name, getattr(pins, name))} ({fitting_text(est)} fits)" for name, est in freed)
    if free is None:
        fix = f"{drops}; {err.fix}" if drops else f"without the pins nothing fits either: {err.fix}"
    else:
        fix = f"{drops or 'relax several pins'}; without pins the best layout is {fitting_text(free)}"
    closest = "; ".join(over_budget(e) for e in err.closest)
    return NothingFitsError(f"{model.name} under {flags} does not fit on {n_devices}× {machine.name}: every pinned layout needs "
                            f"more than the {err.closest[0].memory.limit_text()} per device; closest: {closest}",
                            fix=fix, closest=err.closest)


def fitting_text(e: StepEstimate) -> str:
    """``dp8 tp1 pp1 mb4 none recompute ZeRO 3 at 62.2 GiB, 1.693 s``: a fitting layout in brief."""
    lay = e.layout
    offload = {Offload.OPTIMIZER: " offloaded", Offload.PARAMS: " parameters offloaded"}.get(lay.offload, "")
    return (f"dp{lay.dp} tp{lay.tp} pp{lay.pp}{f' cp{lay.cp}' if lay.cp > 1 else ''} mb{lay.micro_batch} {lay.recompute} "
            f"recompute ZeRO {lay.zero_stage}{offload} at {e.memory.total_bytes / _GIB:.1f} GiB, {e.step_time_s:.3f} s")

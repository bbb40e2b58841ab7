"""The largest model of a family whose training step fits: ``plan largest --devices 8``.

A family is its published sizes (the anchors). Its grid is every shape those sizes' own ratios
allow: ``hidden_size`` in steps of 8 heads of the family's head width (so heads split over
tensor parallelism up to 8 and stay a multiple of the key/value heads), and for each width
every layer count whose aspect ratio ``hidden_size / num_layers`` lies between the anchors'
smallest and largest (Llama 3, Dubey et al. 2024, Table 3: 4096/32 = 128, 8192/80 = 102.4,
16384/126 = 130.0; GPT-2, Radford et al. 2019, Table 2: 768/12 = 64 down to 1600/48 = 33.3).
The MLP width follows ``hidden_size`` log-linearly between the two nearest anchors' ratios, the
key/value heads and head width stay the family's. Memory grows with layers at a fixed width,
and the shallowest shape's with width, so a bisection over widths and then over each width's
layer counts finds the largest model for which the layout search finds a layout that fits.

>>> [(c.hidden_size, c.num_layers, c.ffn_size) for c in (family_model("llama", d) for d in (4096, 8192))]
[(4096, 32, 14336), (8192, 80, 28672)]
>>> family_layers("llama", 8192)
range(63, 81)
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from costmodel.errors import InfeasibleError, InvalidConfigError
from costmodel.hardware.machine import train_machine
from costmodel.hardware.registry import load_hardware
from costmodel.inputs.model_config import ModelConfig
from costmodel.step.estimate import StepEstimate
from costmodel.step.simulator import simulate
from planner.config import default_seq_len, load_model, train_config
from search.layouts import grid_search

FAMILIES = {"llama": ("llama3-8b", "llama3-70b", "llama3-405b"), "gpt2": ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")}
_MAX_SCALE = 4  # search up to 4× the largest published hidden size


class LargestResult(BaseModel):
    """The largest fitting model of a family, its layout, and what bounds it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    params: int = Field(description="Trainable parameters of the largest model found.")
    model: ModelConfig = Field(description="Its configuration.")
    predicted: StepEstimate = Field(description="Its fastest fitting layout (``predicted.layout``), as `plan simulate` costs it.")
    bound: str = Field(description="'parameters + optimizer state' or 'activations': the larger part of its memory.")
    next_model: ModelConfig | None = Field(description="The smallest shape of the grid above it, which no layout fits; "
                                           "None at the top of the grid.")
    probes: int = Field(description="Shapes whose layouts were searched.")

    @property
    def next_params(self) -> int | None:
        """Parameters of ``next_model``."""
        return self.next_model.total_params if self.next_model else None


def _anchors(family: str) -> list[ModelConfig]:
    if family not in FAMILIES:
        raise InvalidConfigError(f"unknown family {family!r}", fix=f"use one of {', '.join(FAMILIES)}")
    return [load_model(name) for name in FAMILIES[family]]


def family_widths(family: str) -> list[int]:
    """The grid's hidden sizes: multiples of 8 heads, up to 4× the largest published one.

    >>> family_widths("llama")[:3]
    [1024, 2048, 3072]
    """
    anchors = _anchors(family)
    step = 8 * anchors[0].head_dim
    return list(range(step, _MAX_SCALE * anchors[-1].hidden_size + 1, step))


def family_layers(family: str, hidden_size: int) -> range:
    """The grid's layer counts at ``hidden_size``: those whose ``hidden_size / num_layers`` is
    within the published sizes' range of that ratio (and the interpolated count, `family_model`'s).

    >>> family_layers("gpt2", 768)
    range(12, 24)
    """
    ratios = [a.hidden_size / a.num_layers for a in _anchors(family)]
    interpolated = family_model(family, hidden_size).num_layers
    return range(min(math.ceil(hidden_size / max(ratios)), interpolated), max(math.floor(hidden_size / min(ratios)), interpolated) + 1)


def family_model(family: str, hidden_size: int, num_layers: int | None = None) -> ModelConfig:
    """A ``family`` model at ``hidden_size``, scaled as the family's published sizes are.

    Args:
      num_layers: its depth; default the anchors' layer count interpolated log-linearly in
        ``hidden_size`` (the published sizes themselves at their widths).
    """
    anchors = _anchors(family)
    lo, hi = next(((a, b) for a, b in zip(anchors, anchors[1:]) if hidden_size <= b.hidden_size), anchors[-2:])
    t = math.log(hidden_size / lo.hidden_size) / math.log(hi.hidden_size / lo.hidden_size)
    interp = lambda a, b: math.exp(math.log(a) + t * (math.log(b) - math.log(a)))  # noqa: E731
    layers = num_layers or max(1, round(interp(lo.num_layers, hi.num_layers)))
    ffn = 256 * max(1, round(hidden_size * interp(lo.ffn_size / lo.hidden_size, hi.ffn_size / hi.hidden_size) / 256))
    heads = hidden_size // lo.head_dim
    kv = lo.num_kv_heads if lo.num_kv_heads != lo.num_heads else heads
    # Validated afresh, so derived fields (the MoE expert width defaults to ffn_size) follow the new size.
    return ModelConfig.model_validate({**lo.model_dump(exclude={"moe_ffn_size"}), "name": f"{family}-d{hidden_size}-l{layers}",
                                       "hidden_size": hidden_size, "num_layers": layers, "num_heads": heads,
                                       "num_kv_heads": kv, "ffn_size": ffn, "head_dim": lo.head_dim})


def next_larger_shapes(family: str, params: int) -> list[ModelConfig]:
    """At each width of the grid, the smallest shape with more than ``params`` parameters, up to
    the first width whose shallowest shape has more: the sizes just above an answer of ``params``.

    >>> [(c.hidden_size, c.num_layers) for c in next_larger_shapes("gpt2", 124_439_808)]
    [(1024, 16)]
    """
    shapes = []
    for width in family_widths(family):
        above = next((cfg for cfg in (family_model(family, width, n) for n in family_layers(family, width)) if cfg.total_params > params),
                     None)
        if above is not None:
            shapes.append(above)
            if above.num_layers == family_layers(family, width)[0]:
                break
    return shapes


def largest_model(*, devices: int, hardware: str = "h100-sxm", family: str = "llama", seq_len: int | None = None,
                  global_batch: int | None = None, time_limit_s: float = 5.0, memory_reserve_gib: float | None = None) -> LargestResult:
    """The largest shape of the family's grid whose training step fits on ``devices``.

    A bisection over widths finds the widest one whose shallowest shape fits; from there down,
    while a width's deepest shape could still beat the best found, a bisection over its layer
    counts finds its deepest fitting one. The answer's layout is costed again by the simulator
    call `plan simulate` makes, and the next larger shape is searched to show it fits no layout.

    Args:
      global_batch: sequences per step; default one per device (the least activation memory
        a data-parallel layout can have).
      time_limit_s: limit of each shape's layout search.
      memory_reserve_gib: the runtime reserve a plan leaves free (`costmodel.hardware.reserve`); None: the part's.

    >>> r = largest_model(devices=1, family="gpt2", hardware="h100-sxm")
    >>> r.predicted.fits, r.next_params > r.params
    (True, True)
    """
    widths = family_widths(family)
    cluster = load_hardware(hardware).with_memory_reserve(None if memory_reserve_gib is None else memory_reserve_gib * 2**30)
    searched: dict[tuple[int, int], StepEstimate | None] = {}

    def train_of(cfg: ModelConfig):
        return train_config(seq_len=seq_len or default_seq_len(cfg), global_batch=global_batch or devices)

    def best(width: int, layers: int) -> StepEstimate | None:
        if (width, layers) not in searched:
            cfg = family_model(family, width, layers)
            train = train_of(cfg)
            try:
                searched[width, layers] = grid_search(cfg, train, train_machine(cluster, train), n_devices=devices,
                                                      time_limit_s=time_limit_s).best
            except InfeasibleError:
                searched[width, layers] = None
        return searched[width, layers]

    def last_fitting(count: int, fits) -> int:
        """The largest index below ``count`` that fits, -1 if none (fitting is monotone)."""
        lo, hi = -1, count
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return lo

    widest = last_fitting(len(widths), lambda i: best(widths[i], family_layers(family, widths[i])[0]) is not None)
    if widest < 0:
        raise InfeasibleError(f"no {family} model of hidden size {widths[0]} or more fits on {devices} × {hardware}",
                              fix="add devices or choose a smaller --seq-len")
    answer: ModelConfig | None = None
    for width in reversed(widths[:widest + 1]):
        layers = family_layers(family, width)
        if answer is not None and family_model(family, width, layers[-1]).total_params <= answer.total_params:
            break  # the deepest shape's size shrinks with width: no narrower one can beat the answer
        deepest = last_fitting(len(layers), lambda i, w=width, ls=layers: best(w, ls[i]) is not None)
        if deepest >= 0 and (answer is None or family_model(family, width, layers[deepest]).total_params > answer.total_params):
            answer = family_model(family, width, layers[deepest])
    assert answer is not None  # the widest width's shallowest shape fits
    found = best(answer.hidden_size, answer.num_layers)
    train = train_of(answer)
    predicted = simulate(answer, train, found.layout, train_machine(cluster, train))
    above = min(next_larger_shapes(family, answer.total_params), key=lambda cfg: cfg.total_params, default=None)
    if above is not None and best(above.hidden_size, above.num_layers) is not None:
        raise AssertionError(f"{above.name} fits although wider shapes do not: fitting is not monotone in this grid")
    mem = predicted.memory
    state = mem.params_bytes + mem.grads_bytes + mem.optimizer_bytes
    return LargestResult(params=answer.total_params, model=answer, predicted=predicted, probes=len(searched), next_model=above,
                         bound="parameters + optimizer state" if state >= mem.activations_bytes + mem.temporary_bytes else "activations")

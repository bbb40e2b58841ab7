"""The largest model of a family whose training step fits: ``plan largest --devices 8``.

A family is its published sizes (the anchors). A size between or beyond them keeps the
family's head width and key/value heads, takes ``hidden_size`` on a grid of 8 heads, and
interpolates layers and MLP width log-linearly in ``hidden_size`` between the two nearest
anchors (the end segments extrapolate). Parameter count grows with ``hidden_size``, so a
bisection over the grid finds the largest size for which the layout search finds a layout
that fits.

>>> [(c.hidden_size, c.num_layers, c.ffn_size) for c in (family_model("llama", d) for d in (4096, 8192))]
[(4096, 32, 14336), (8192, 80, 28672)]
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from costmodel.errors import InfeasibleError, InvalidConfigError
from costmodel.hardware.machine import machine_for
from costmodel.hardware.registry import load_hardware
from costmodel.inputs.model_config import ModelConfig
from costmodel.step.estimate import StepEstimate
from planner.config import default_seq_len, load_model, train_config
from search.layouts import grid_search

FAMILIES = {"llama": ("llama3-8b", "llama3-70b", "llama3-405b"), "gpt2": ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")}
_MAX_SCALE = 4  # search up to 4× the largest published hidden size


class LargestResult(BaseModel):
    """The largest fitting model of a family, its layout, and what bounds it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    params: int = Field(description="Trainable parameters of the largest model found.")
    model: ModelConfig = Field(description="Its configuration.")
    predicted: StepEstimate = Field(description="Its fastest fitting layout (``predicted.layout``), simulated.")
    bound: str = Field(description="'parameters + optimizer state' or 'activations': the larger part of its memory.")
    next_params: int | None = Field(description="Parameters of the next size, which no layout fits; None at the top of the grid.")
    probes: int = Field(description="Sizes tried by the bisection.")


def family_model(family: str, hidden_size: int) -> ModelConfig:
    """A ``family`` model at ``hidden_size``, scaled as the family's published sizes are."""
    if family not in FAMILIES:
        raise InvalidConfigError(f"unknown family {family!r}", fix=f"use one of {', '.join(FAMILIES)}")
    anchors = [load_model(name) for name in FAMILIES[family]]
    lo, hi = next(((a, b) for a, b in zip(anchors, anchors[1:]) if hidden_size <= b.hidden_size), anchors[-2:])
    t = math.log(hidden_size / lo.hidden_size) / math.log(hi.hidden_size / lo.hidden_size)
    interp = lambda a, b: math.exp(math.log(a) + t * (math.log(b) - math.log(a)))  # noqa: E731
    layers = max(1, round(interp(lo.num_layers, hi.num_layers)))
    ffn = 256 * max(1, round(hidden_size * interp(lo.ffn_size / lo.hidden_size, hi.ffn_size / hi.hidden_size) / 256))
    heads = hidden_size // lo.head_dim
    kv = lo.num_kv_heads if lo.num_kv_heads != lo.num_heads else heads
    # Validated afresh, so derived fields (the MoE expert width defaults to ffn_size) follow the new size.
    return ModelConfig.model_validate({**lo.model_dump(exclude={"moe_ffn_size"}), "name": f"{family}-d{hidden_size}-l{layers}",
                                       "hidden_size": hidden_size, "num_layers": layers, "num_heads": heads,
                                       "num_kv_heads": kv, "ffn_size": ffn, "head_dim": lo.head_dim})


def largest_model(*, devices: int, hardware: str = "h100-sxm", family: str = "llama", seq_len: int | None = None,
                  global_batch: int | None = None, time_limit_s: float = 5.0) -> LargestResult:
    """Bisect the family's size grid for the largest model whose training step fits on ``devices``.

    Args:
      global_batch: sequences per step; default one per device (the least activation memory
        a data-parallel layout can have).
      time_limit_s: limit of each size's layout search.
    """
    step = 8 * load_model(FAMILIES.get(family, ("llama3-8b",))[0]).head_dim
    grid = list(range(step, _MAX_SCALE * load_model(FAMILIES.get(family, ("llama3-8b",))[-1]).hidden_size + 1, step))
    machine = machine_for(load_hardware(hardware))
    probes = 0

    def best(d: int) -> StepEstimate | None:
        nonlocal probes
        probes += 1
        cfg = family_model(family, d)
        train = train_config(seq_len=seq_len or default_seq_len(cfg), global_batch=global_batch or devices)
        try:
            return grid_search(cfg, train, machine, n_devices=devices, time_limit_s=time_limit_s).best
        except InfeasibleError:
            return None

    lo, hi, found = -1, len(grid), None  # invariant: grid[lo] fits (or lo = -1), grid[hi] does not (or hi = len)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        est = best(grid[mid])
        if est is None:
            hi = mid
        else:
            lo, found = mid, est
    if found is None:
        raise InfeasibleError(f"no {family} model of hidden size {grid[0]} or more fits on {devices} × {hardware}",
                              fix="add devices or choose a smaller --seq-len")
    cfg, mem = family_model(family, grid[lo]), found.memory
    state = mem.params_bytes + mem.grads_bytes + mem.optimizer_bytes
    return LargestResult(params=cfg.total_params, model=cfg, predicted=found, probes=probes,
                         bound="parameters + optimizer state" if state >= mem.activations_bytes + mem.temporary_bytes else "activations",
                         next_params=family_model(family, grid[hi]).total_params if hi < len(grid) else None)

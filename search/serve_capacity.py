"""``plan serve``'s question: on which layout does a model serve the most requests per second
within its latency targets, and what do users see at the offered rate?

Each candidate is a tensor-parallel degree (dividing the devices of a node and the query heads)
with the rest of the devices as replicas, and a batch limit (most requests running at once on a
replica). For each, continuous batching is simulated (`costmodel.step.continuous_batching`) at the
offered rate, and its capacity is found by bisection on the rate: the most requests per second
at which the p99 time to first token and the p99 time per output token stay within the targets
and the queue does not grow. The chosen option meets the targets at the offered rate with the
most capacity; when none does, the one with the most capacity, and the caller says so.

>>> from costmodel.hardware.machine import load_machine
>>> from costmodel.inputs.model_config import ModelConfig
>>> from costmodel.inputs.train_config import TrainConfig
>>> from costmodel.step.continuous_batching import LengthDistribution, ServeConfig
>>> m = ModelConfig(name="m", hidden_size=1024, num_layers=8, num_heads=16, num_kv_heads=4, ffn_size=4096, vocab_size=1000)
>>> cfg = ServeConfig(rate_per_s=10, input_len=LengthDistribution(fixed=128), output_len=LengthDistribution(fixed=32), requests=100)
>>> options = serve_options(m, TrainConfig(workload="decode"), load_machine("h100-sxm"), n_devices=2, cfg=cfg,
...                         slo=Slo(ttft_s=0.5, tpot_s=0.05), batch_limits=(256,))
>>> [(o.layout.tp, o.layout.dp, o.meets_slo) for o in options]
[(1, 2, True), (2, 1, True)]
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat

from costmodel.errors import InfeasibleError, InvalidPlanError
from costmodel.hardware.machine import Machine
from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import TrainConfig
from costmodel.step.continuous_batching import ServeConfig, ServeResult, simulate_serving
from search.layouts import divisors

BATCH_LIMITS = (64, 256)  # batch limits tried under a time-per-token target (vLLM's max_num_seqs defaults to 256)
_BISECTION_STEPS = 6  # the capacity to within 1/64 of the doubling that failed
SATURATING_BATCHES = 4  # a burst of this many full batches a replica: most of its run has the batch full


class Slo(BaseModel):
    """Latency targets, each on the 99th percentile; None: no target."""

    model_config = ConfigDict(frozen=True)

    ttft_s: PositiveFloat | None = Field(None, description="Most seconds to the first token, p99.")
    tpot_s: PositiveFloat | None = Field(None, description="Most seconds per output token after the first, p99.")

    def met_by(self, result: ServeResult) -> bool:
        """Whether ``result`` keeps both targets and its queue does not grow."""
        return (not result.queue_growing and (self.ttft_s is None or result.ttft_p99_s <= self.ttft_s)
                and (self.tpot_s is None or result.tpot_p99_s <= self.tpot_s))


class ServeOption(BaseModel):
    """One layout and batch limit: what users see at the offered rate, and its capacity."""

    model_config = ConfigDict(frozen=True)

    layout: Layout = Field(description="Tensor-parallel degree and replicas (dp).")
    max_batch: int = Field(description="Most requests running at once on a replica.")
    at_rate: ServeResult = Field(description="Continuous batching at the offered rate.")
    meets_slo: bool = Field(description="Whether the targets hold at the offered rate.")
    capacity_per_s: float = Field(description="The most requests per second within the targets (bisection on the rate).")


def tp_degrees(model: ModelConfig, n_devices: int, devices_per_node: int) -> list[int]:
    """Tensor-parallel degrees a serving layout can take: dividing the devices, a node's devices and the query heads."""
    return [t for t in divisors(n_devices) if t <= devices_per_node and devices_per_node % t == 0 and model.num_heads % t == 0]


def capacity_per_s(model: ModelConfig, train: TrainConfig, layout: Layout, hw: Machine, cfg: ServeConfig, slo: Slo, *,
                   start_per_s: float, met_at_start: bool | None = None) -> float:
    """The most requests per second within ``slo`` (0 when even a trickle misses it), at most the
    `saturated_per_s` throughput: doubling from ``start_per_s`` (whether the targets hold there,
    when the caller has simulated it: ``met_at_start``) until the targets fail, then
    `_BISECTION_STEPS` halvings of the interval. Each probe simulates ``cfg.requests``: past the
    capacity the queue (or, with a large batch limit, the running batch and so the time per token)
    grows with every request, so fewer requests read a higher capacity."""
    def ok(rate: float) -> bool:
        return slo.met_by(simulate_serving(model, train, layout, hw, cfg.model_copy(update={"rate_per_s": rate})))

    most = saturated_per_s(model, train, layout, hw, cfg)
    low, high = 0.0, min(start_per_s, most)
    met = met_at_start if met_at_start is not None and high == start_per_s else ok(high)
    while met:
        if high >= most:
            return most
        low, high = high, min(2 * high, most)
        met = ok(high)
    for _ in range(_BISECTION_STEPS):
        mid = (low + high) / 2
        low, high = (mid, high) if ok(mid) else (low, mid)
    return low


def saturated_per_s(model: ModelConfig, train: TrainConfig, layout: Layout, hw: Machine, cfg: ServeConfig) -> float:
    """Requests per second the layout sustains with every request waiting from the start, its batch
    full (`ServeResult.service_rate_per_s` of a burst of `SATURATING_BATCHES` batch limits a replica,
    or ``cfg.requests`` if more): the most it serves at any rate."""
    requests = max(cfg.requests, SATURATING_BATCHES * cfg.max_batch * layout.dp)
    burst = cfg.model_copy(update={"arrivals_s": (0.0,) * requests, "requests": requests})
    return simulate_serving(model, train, layout, hw, burst).service_rate_per_s


def serve_options(model: ModelConfig, train: TrainConfig, hw: Machine, *, n_devices: int, cfg: ServeConfig, slo: Slo,
                  batch_limits: tuple[int, ...] = BATCH_LIMITS, tp: int | None = None) -> list[ServeOption]:
    """Every layout (``tp`` pinned, or each of `tp_degrees`) and batch limit whose memory holds a
    request, simulated at the offered rate, with its capacity (module docstring); most capacity
    first. Nothing holds a request: one line naming the fix."""
    degrees = tp_degrees(model, n_devices, hw.devices_per_node)
    if tp and tp not in degrees:
        raise InvalidPlanError(f"--tp {tp}: {n_devices} devices ({hw.devices_per_node} a node) serving {model.num_heads} query heads "
                               f"can carry tp {', '.join(map(str, degrees))} only", fix=f"use --tp {degrees[-1]}, or leave it out")
    options = []
    for degree in [tp] if tp else degrees:
        layout = Layout(dp=n_devices // degree, tp=degree)
        for limit in batch_limits:
            limited = cfg.model_copy(update={"max_batch": limit})
            try:
                result = simulate_serving(model, train, layout, hw, limited)
            except InfeasibleError:
                break
            met = slo.met_by(result)
            capacity = capacity_per_s(model, train, layout, hw, limited, slo, start_per_s=cfg.rate_per_s, met_at_start=met)
            # A short run at a rate past what the layout sustains may not show its queue growing yet: the capacity does.
            options.append(ServeOption(layout=layout, max_batch=limit, at_rate=result, meets_slo=met and capacity >= cfg.rate_per_s,
                                       capacity_per_s=capacity))
    if not options:
        raise InfeasibleError(f"no layout of {n_devices} devices holds one request's KV cache beside {model.name}'s weights",
                              fix="add devices, or shorten --input-len/--output-len")
    return sorted(options, key=lambda o: (-o.meets_slo, -o.capacity_per_s, o.layout.tp, o.max_batch))

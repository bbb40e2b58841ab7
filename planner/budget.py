"""A compute budget answered: ``plan budget --devices 1024 --hardware h100-sxm --days 30``.

The compute a cluster delivers depends on the model it trains (a bigger model runs at
another MFU), and the compute-optimal model depends on the compute, so the two are solved
together. The rule is Chinchilla's: train ``N`` parameters on ``D = 20·N`` tokens
(Hoffmann et al. 2022, "Training Compute-Optimal Large Language Models": about 20 tokens
per parameter at the compute-optimal frontier), which spends ``C = 6·N·D`` FLOPs. A model
of ``N`` parameters, planned on the devices (`planner.api.plan`), trains ``tokens_per_s``
tokens a second, so the cluster delivers ``tokens_per_s × seconds`` tokens in the budget.
The answer is the ``N`` where the rule's tokens meet the delivered tokens,
``20·N = tokens_per_s(N) × seconds``: the rule's ``6·N·D`` then equals the FLOPs the plan
delivers, ``6·N × tokens_per_s × seconds``.

The left side grows with ``N`` and the right side shrinks, so a bisection finds the crossing:
first over the family's hidden sizes (`planner.largest.family_model`), then over layer
counts at the largest hidden size below the crossing, which moves ``N`` in steps of about
one layer's parameters (about 1 % for Llama 3 70B's 80 layers). A model no layout fits
counts as too big.

Every size is planned with one global batch, so neighbouring sizes compare like with like (a
batch that changed with the size would make the delivered tokens step between them and the
bisection miss its crossing). Unless given, it is `plan`'s rule (`planner.batch`, DeepSeek LLM's
``B = 0.292·C^0.3271``) evaluated once at the budget's own compute,
``C = devices × peak × MFU_GUESS × seconds``. The guess only sets the batch: ``B`` grows as
``C^0.33``, so a guess off by 2× moves it by 25 %; and C counts all the model's FLOPs where the
rule's fit leaves out the embedding's (2 % of a 90 B Llama's; more for small models such as GPT-2).
"""

from __future__ import annotations

from typing import Callable

from pydantic import BaseModel, ConfigDict, Field

from costmodel.errors import InfeasibleError, InvalidConfigError
from costmodel.hardware.registry import load_hardware
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import Dtype
from planner.api import plan
from planner.batch import CHINCHILLA_TOKENS_PER_PARAM, BatchChoice, batch_at_compute, given_batch
from planner.config import default_seq_len, load_model
from planner.largest import FAMILIES, family_model
from planner.plan_schema import Plan
from planner.request import PlanRequest

RULE = "Chinchilla: D = 20·N tokens (Hoffmann et al. 2022), C = 6·N·D"
_SECONDS_PER_DAY = 86_400
_MAX_SCALE = 4  # as `plan largest`: hidden sizes up to 4× the family's largest published one
MFU_GUESS = 0.40  # the budget's compute for the batch rule assumes it; the usual planning figure for a large dense run


class BudgetProbe(BaseModel):
    """One model size the search planned."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    params: int = Field(description="Parameters of the model tried.")
    hidden_size: int = Field(description="Its hidden size.")
    num_layers: int = Field(description="Its layers.")
    tokens_per_s: float | None = Field(description="Tokens per second of its plan; None when no layout fits.")
    delivered_tokens: float | None = Field(description="tokens_per_s × the budget's seconds; None when no layout fits.")


class BudgetResult(BaseModel):
    """The compute-optimal model for a device budget, its token count and its plan."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rule: str = Field(description="The compute-optimal rule used.")
    tokens_per_param: float = Field(description="D / N of the rule.")
    days: float = Field(description="The budget's wall-clock days of training steps.")
    params: int = Field(description="N: parameters of the compute-optimal model.")
    tokens: float = Field(description="D = tokens_per_param × N: the tokens to train it on.")
    compute_flops: float = Field(description="6·N·D: the rule's training compute.")
    delivered_tokens: float = Field(description="tokens_per_s × days × 86 400 of the chosen plan.")
    delivered_flops: float = Field(description="6·N × delivered_tokens: the compute the plan delivers in the budget.")
    model: ModelConfig = Field(description="The model's configuration.")
    plan: Plan = Field(description="Its plan on the devices (layout, predicted MFU, step time).")
    batch: BatchChoice = Field(description="The global batch every size was planned with, and why.")
    probes: tuple[BudgetProbe, ...] = Field(description="Every size tried, in order.")


def compute_optimal_model(*, devices: int, hardware: str = "h100-sxm", days: float, family: str = "llama",
                          seq_len: int | None = None, global_batch: int | None = None,
                          time_limit_s: float = 5.0, memory_reserve_gib: float | None = None) -> BudgetResult:
    """The family's compute-optimal model for ``days`` of ``devices`` × ``hardware``, with its plan.

    Args:
      global_batch: sequences per step, the same for every size tried; default `budget_batch`.
      time_limit_s: limit of each size's layout search.
      memory_reserve_gib: the runtime reserve a plan leaves free (`costmodel.hardware.reserve`); None: the part's.

    >>> r = compute_optimal_model(devices=8, hardware="a100-80gb", days=0.01, family="gpt2")
    >>> r.tokens == 20 * r.params, abs(r.compute_flops / r.delivered_flops - 1) < 0.05
    (True, True)
    """
    if family not in FAMILIES:
        raise InvalidConfigError(f"unknown family {family!r}", fix=f"use one of {', '.join(FAMILIES)}")
    if not days > 0 or days == float("inf"):
        raise InvalidConfigError(f"--days={days} is not a positive number of days", fix="e.g. --days 30")
    seconds = days * _SECONDS_PER_DAY
    anchors = [load_model(name) for name in FAMILIES[family]]
    seq_len = seq_len or default_seq_len(anchors[0])
    batch = (given_batch(global_batch, seq_len=seq_len) if global_batch
             else budget_batch(devices=devices, hardware=hardware, days=days, seq_len=seq_len))
    probes: list[BudgetProbe] = []
    plans: dict[tuple[int, int], Plan | None] = {}

    def planned(cfg: ModelConfig) -> Plan | None:
        key = (cfg.hidden_size, cfg.num_layers)
        if key not in plans:
            try:
                plans[key] = plan(PlanRequest(model=cfg, devices=devices, hardware=hardware, seq_len=seq_len,
                                              global_batch=batch.sequences, time_limit_s=time_limit_s,
                                              memory_reserve_gib=memory_reserve_gib))
            except InfeasibleError:
                plans[key] = None
            tps = plans[key].predicted.tokens_per_s if plans[key] else None
            probes.append(BudgetProbe(params=cfg.total_params, hidden_size=cfg.hidden_size, num_layers=cfg.num_layers,
                                      tokens_per_s=tps, delivered_tokens=tps * seconds if tps else None))
        return plans[key]

    def small_enough(cfg: ModelConfig) -> bool:
        """Whether the rule's tokens for ``cfg`` fit in what its plan delivers (the optimum is at least this big)."""
        p = planned(cfg)
        return p is not None and CHINCHILLA_TOKENS_PER_PARAM * cfg.total_params <= p.predicted.tokens_per_s * seconds

    step = 8 * anchors[0].head_dim
    hidden_sizes = list(range(step, _MAX_SCALE * anchors[-1].hidden_size + 1, step))
    by_hidden = [lambda d=d: family_model(family, d) for d in hidden_sizes]
    lo = _last_true(by_hidden, small_enough)
    if lo < 0:
        raise InfeasibleError(f"even the smallest {family} model (hidden size {step}) needs more than {days:g} days "
                              f"on {devices} × {hardware}, or fits no layout", fix="add devices or days")
    base = by_hidden[lo]()
    next_layers = by_hidden[lo + 1]().num_layers if lo + 1 < len(by_hidden) else base.num_layers
    # At the base width, twice the next size's layers has more parameters than the next size: the crossing is below.
    by_layers = [lambda n=n: _with_layers(base, family, n) for n in range(base.num_layers, 2 * max(base.num_layers, next_layers) + 1)]
    i = _last_true(by_layers, small_enough)
    # The crossing lies between this size and the next; take whichever side is nearer the rule.
    sides = [by_layers[j]() for j in (i, i + 1) if j < len(by_layers)]
    cfg = min((c for c in sides if planned(c) is not None), key=lambda c: abs(_mismatch(c, plans, seconds)))
    chosen = plans[(cfg.hidden_size, cfg.num_layers)]
    n = cfg.total_params
    delivered = chosen.predicted.tokens_per_s * seconds
    return BudgetResult(rule=RULE, tokens_per_param=CHINCHILLA_TOKENS_PER_PARAM, days=days, params=n,
                        tokens=CHINCHILLA_TOKENS_PER_PARAM * n, compute_flops=6 * n * CHINCHILLA_TOKENS_PER_PARAM * n,
                        delivered_tokens=delivered, delivered_flops=6 * n * delivered, model=cfg, plan=chosen,
                        batch=batch, probes=tuple(probes))


def budget_batch(*, devices: int, hardware: str, days: float, seq_len: int) -> BatchChoice:
    """`plan`'s batch rule (`planner.batch`) at the budget's compute, ``devices`` × the part's
    bf16 peak × `MFU_GUESS` × the days' seconds: the batch every size of the search is planned with.

    >>> b = budget_batch(devices=1024, hardware="h100-sxm", days=30, seq_len=2048)
    >>> b.sequences, b.reason.split(": ")[0]
    (10240, "DeepSeek LLM's B = 0.292·C^0.3271 at C = 1.1e24 FLOPs (1024 × 989 TFLOP/s × MFU 40 % guessed × 30 days)")
    """
    peak = load_hardware(hardware).device.peak_for(Dtype.BF16.value)
    compute = devices * peak * MFU_GUESS * days * _SECONDS_PER_DAY
    source = f"{devices} × {peak / 1e12:,.0f} TFLOP/s × MFU {100 * MFU_GUESS:.0f} % guessed × {days:g} days"
    return batch_at_compute(compute, seq_len=seq_len, n_devices=devices, source=source)


def _with_layers(cfg: ModelConfig, family: str, num_layers: int) -> ModelConfig:
    """``cfg`` with ``num_layers`` layers, named as `family_model` names its sizes."""
    return ModelConfig.model_validate({**cfg.model_dump(exclude={"moe_ffn_size"}), "num_layers": num_layers,
                                       "name": f"{family}-d{cfg.hidden_size}-l{num_layers}"})


def _mismatch(cfg: ModelConfig, plans: dict[tuple[int, int], Plan | None], seconds: float) -> float:
    """Relative gap between the rule's tokens and the delivered tokens of ``cfg``'s plan."""
    delivered = plans[(cfg.hidden_size, cfg.num_layers)].predicted.tokens_per_s * seconds
    return CHINCHILLA_TOKENS_PER_PARAM * cfg.total_params / delivered - 1


def _last_true(candidates: list[Callable[[], ModelConfig]], predicate: Callable[[ModelConfig], bool]) -> int:
    """Index of the last candidate for which ``predicate`` holds, for a predicate true then false; -1 if none."""
    lo, hi = -1, len(candidates)  # invariant: candidates[lo] holds (or lo = -1), candidates[hi] does not (or hi = len)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if predicate(candidates[mid]()):
            lo = mid
        else:
            hi = mid
    return lo

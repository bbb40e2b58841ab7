"""The training batch the planner chooses when none is given, and the check of one that is.

The rule is DeepSeek LLM's fitted optimum (DeepSeek-AI 2024, "DeepSeek LLM: Scaling Open-Source
Language Models with Longtermism", arXiv:2401.02954, section 3.1, eq. 1):
``B_opt = 0.2920 · C^0.3271`` tokens per step, where ``C = M·D`` is the training compute, ``D``
the training tokens and ``M`` the FLOPs per token as that paper counts them,
``6·N_layers + 6·n_layer·d_attn·l_seq`` (the non-embedding parameters' 6 FLOPs each, plus
attention). ``D`` is ``--tokens`` when given; otherwise Chinchilla's compute-optimal
``20·N`` (Hoffmann et al. 2022), the length a model of that size is usually trained for.
The fit spans 1e17 to 3e20 FLOPs; larger runs extrapolate it (DeepSeek's own 67B used
4608 × 4096 = 18.9 M tokens at 2e12 tokens; the rule there gives 20 M).

The rule's tokens become sequences of the run's length, rounded to a multiple of the device
count, so every data-parallel degree the devices allow divides the batch and each device
has at least one sequence (a replica of ``tp·pp`` devices then has ``tp·pp`` or more).

>>> from planner.config import load_model
>>> choice = planned_batch(load_model("llama3-70b"), seq_len=2048, n_devices=1024, tokens=15e12)
>>> choice.sequences, choice.sequences % 1024, round(choice.rule_tokens / 1e6, 1)
(18432, 0, 37.7)
"""

from __future__ import annotations

from pydantic import Field

from costmodel.inputs.model_config import ModelConfig
from costmodel.record import Record

CHINCHILLA_TOKENS_PER_PARAM = 20.0
DEEPSEEK_BATCH_COEFFICIENT = 0.2920
DEEPSEEK_BATCH_EXPONENT = 0.3271
RULE = "B = 0.292·C^0.3271 tokens, C = M·D (DeepSeek LLM 2024, eq. 1)"
# A batch the devices divide must beat the given one by more than the simulator's error
# (benchmarks.simulator_accuracy: a few per cent) before the given one is called starving.
STARVED_MFU_GAIN = 1.10


class BatchChoice(Record):
    """The global batch a plan trains with, and why."""

    sequences: int = Field(description="Sequences per optimizer step (TrainConfig.global_batch).")
    tokens: int = Field(description="Tokens per step: sequences × seq_len.")
    given: bool = Field(description="Whether the request gave it (--global-batch); otherwise the rule chose it.")
    rule_tokens: float | None = Field(None, description="The rule's optimum in tokens, before rounding; None when given.")
    compute_flops: float | None = Field(None, description="C = M·D the rule was evaluated at; None when given.")
    reason: str = Field(description="One line: what was chosen and why.")
    warning: str | None = Field(None, description="A given batch that starves the devices: the batch that would not, "
                                                  "and both plans' MFU.")


def flops_per_token(model: ModelConfig, seq_len: int) -> float:
    """``M``, DeepSeek LLM's FLOPs per token: 6 per non-embedding (active) parameter plus
    ``6·layers·attention width·seq_len`` for attention.

    >>> from planner.config import load_model
    >>> round(flops_per_token(load_model("llama3-70b"), 2048) / 1e9)
    419
    """
    attention_width = model.num_heads * model.head_dim
    return 6 * model.num_layers * model.active_params_per_layer + 6 * model.num_layers * attention_width * seq_len


def planned_batch(model: ModelConfig, *, seq_len: int, n_devices: int, tokens: float | None) -> BatchChoice:
    """The rule's batch (module docstring) for ``model`` trained on ``tokens`` (None: ``20·N``),
    in sequences of ``seq_len``, a multiple of ``n_devices`` (at least one per device).

    >>> from planner.config import load_model
    >>> c = planned_batch(load_model("gpt2"), seq_len=1024, n_devices=1024, tokens=None)
    >>> c.sequences, c.reason.endswith("raised to one per device")
    (1024, True)
    """
    assumed = tokens is None
    train_tokens = CHINCHILLA_TOKENS_PER_PARAM * model.total_params if assumed else tokens
    length = f"{_sci(train_tokens)} tokens" + (": Chinchilla's 20 per parameter, --tokens sets it" if assumed else "")
    return batch_at_compute(flops_per_token(model, seq_len) * train_tokens, seq_len=seq_len, n_devices=n_devices,
                            source=length)


def batch_at_compute(compute: float, *, seq_len: int, n_devices: int, source: str) -> BatchChoice:
    """The rule's batch at a training compute of ``compute`` FLOPs, in sequences of ``seq_len``, a
    multiple of ``n_devices`` (at least one per device); ``source`` says in the reason where
    ``compute`` comes from.

    >>> c = batch_at_compute(1e24, seq_len=2048, n_devices=1024, source="a budget")
    >>> c.sequences, c.reason
    (10240, "DeepSeek LLM's B = 0.292·C^0.3271 at C = 1e24 FLOPs (a budget): 10,103 sequences, rounded to 10 per device")
    """
    rule_tokens = DEEPSEEK_BATCH_COEFFICIENT * compute ** DEEPSEEK_BATCH_EXPONENT
    per_device = round(rule_tokens / seq_len / n_devices)
    sequences = max(1, per_device) * n_devices
    rounding = ("raised to one per device" if per_device < 1
                else f"rounded to {per_device:,} per device" if sequences != round(rule_tokens / seq_len) else "")
    reason = (f"DeepSeek LLM's B = 0.292·C^0.3271 at C = {_sci(compute)} FLOPs ({source}): "
              f"{rule_tokens / seq_len:,.0f} sequences{', ' if rounding else ''}{rounding}")
    return BatchChoice(sequences=sequences, tokens=sequences * seq_len, given=False, rule_tokens=rule_tokens,
                       compute_flops=compute, reason=reason)


def given_batch(sequences: int, *, seq_len: int) -> BatchChoice:
    """A batch the request gave.

    >>> given_batch(256, seq_len=2048).reason
    'given (--global-batch)'
    """
    return BatchChoice(sequences=sequences, tokens=sequences * seq_len, given=True,
                       reason="given (--global-batch)")


def devices_batch(sequences: int, n_devices: int) -> int | None:
    """The multiple of ``n_devices`` nearest ``sequences`` (at least ``n_devices``), or None when
    ``sequences`` is one already: the batch that lets every device hold whole sequences.

    >>> devices_batch(100, 32), devices_batch(256, 32), devices_batch(256, 1024)
    (96, None, 1024)
    """
    if sequences % n_devices == 0:
        return None
    return max(1, round(sequences / n_devices)) * n_devices


def starved_warning(sequences: int, mfu: float, *, better_sequences: int, better_mfu: float, layout_text: str,
                    better_layout_text: str) -> str | None:
    """The warning for a given batch whose plan runs at ``mfu`` when ``better_sequences`` runs at
    ``better_mfu`` (None when that is not better by `STARVED_MFU_GAIN`).

    >>> starved_warning(100, 0.176, better_sequences=96, better_mfu=0.40, layout_text="dp1 tp4 pp8", better_layout_text="dp8 tp4 pp1")
    '--global-batch 100 starves the devices: dp1 tp4 pp8 at MFU 17.6 %; --global-batch 96 plans dp8 tp4 pp1 at MFU 40.0 %'
    """
    if better_mfu <= STARVED_MFU_GAIN * mfu:
        return None
    return (f"--global-batch {sequences} starves the devices: {layout_text} at MFU {100 * mfu:.1f} %; "
            f"--global-batch {better_sequences} plans {better_layout_text} at MFU {100 * better_mfu:.1f} %")


def _sci(x: float) -> str:
    """``x`` to two figures, as a scientific user writes it (6.3e24)."""
    return f"{x:.2g}".replace("e+", "e")

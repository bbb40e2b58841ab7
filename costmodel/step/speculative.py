"""Speculative decoding: a draft model proposes, the target verifies several tokens in one step.

Leviathan, Kalman and Matias, "Fast Inference from Transformers via Speculative Decoding"
(ICML 2023, arXiv 2211.17192) and Chen et al. 2023 (arXiv 2302.01318): each step the draft
model decodes ``k`` tokens one after another, then the target runs all ``k + 1`` positions at
once and keeps the longest accepted prefix plus one token of its own. With each draft token
accepted independently with probability ``α`` (the papers' assumption; the rate is an input,
not predicted: it depends on the pair of models and the text), a step yields on average
``(1 − α^(k+1)) / (1 − α)`` tokens (Leviathan et al., equation 1). A step costs ``k`` draft
decode iterations and one target iteration over ``k + 1`` tokens a sequence
(`costmodel.step.inference.iteration_s`), so the speed-up over plain decoding is the expected
tokens times the plain step's time over the speculative step's. Memory: the draft's weights
and its KV cache beside the target's.

>>> expected_tokens_per_step(acceptance_rate=0.8, draft_tokens=4)
3.3616
>>> expected_tokens_per_step(acceptance_rate=0.0, draft_tokens=4), expected_tokens_per_step(acceptance_rate=1.0, draft_tokens=4)
(1.0, 5.0)
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from costmodel.hardware.machine import Machine
from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import TrainConfig
from costmodel.step.inference import iteration_s


class Speculation(BaseModel):
    """A draft model, how many tokens it proposes a step, and how often the target accepts one."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    draft: ModelConfig = Field(description="The draft model (same tokenizer as the target).")
    draft_tokens: PositiveInt = Field(4, description="Tokens the draft proposes per step (k; vLLM's num_speculative_tokens).")
    acceptance_rate: float = Field(0.7, ge=0.0, le=1.0, description="Probability the target accepts a draft token, each "
                                   "independently (an assumption, not a prediction).")

    @property
    def expected_tokens(self) -> float:
        """Tokens a step yields on average (`expected_tokens_per_step`)."""
        return expected_tokens_per_step(acceptance_rate=self.acceptance_rate, draft_tokens=self.draft_tokens)


def expected_tokens_per_step(*, acceptance_rate: float, draft_tokens: int) -> float:
    """``(1 − α^(k+1)) / (1 − α)``: the accepted prefix plus the target's own token (``k + 1`` when α = 1)."""
    if acceptance_rate >= 1.0:
        return float(draft_tokens + 1)
    return round((1 - acceptance_rate ** (draft_tokens + 1)) / (1 - acceptance_rate), 12)


def speculative_step_s(target: ModelConfig, spec: Speculation, train: TrainConfig, layout: Layout, hw: Machine, *,
                       decode_sequences: int, cached_tokens: int) -> float:
    """Seconds of one speculative step for ``decode_sequences`` sequences holding ``cached_tokens``
    in all: ``k`` draft iterations, then the target's verification of ``k + 1`` tokens a sequence.

    >>> from costmodel.hardware.machine import load_machine
    >>> big = ModelConfig(name="big", hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8, ffn_size=14336, vocab_size=32000)
    >>> small = ModelConfig(name="small", hidden_size=1024, num_layers=8, num_heads=16, num_kv_heads=4, ffn_size=4096, vocab_size=32000)
    >>> hw, train, spec = load_machine("h100-sxm"), TrainConfig(workload="decode"), Speculation(draft=small, acceptance_rate=0.8)
    >>> plain = iteration_s(big, train, Layout(), hw, decode_sequences=1, cached_tokens=1024)
    >>> 1.5 < spec.expected_tokens * plain / speculative_step_s(big, spec, train, Layout(), hw, decode_sequences=1, cached_tokens=1024)
    True
    """
    draft_s = iteration_s(spec.draft, train, layout, hw, decode_sequences=decode_sequences, cached_tokens=cached_tokens)
    verify_s = iteration_s(target, train, layout, hw, decode_sequences=decode_sequences, cached_tokens=cached_tokens,
                           tokens_per_sequence=spec.draft_tokens + 1)
    return spec.draft_tokens * draft_s + verify_s

"""Serving: prefill (one forward over whole prompts) and decode (one token per sequence per step against a KV cache).

Both hold the weights alone, stored as ``serving.weight_dtype`` says, with no gradient, optimizer
state or backward; their costs are `costmodel.step.inference`'s. They differ in what one step
processes: a prefill step runs every replica's whole batch of prompts, a decode step one new token
for each sequence of a micro-batch, and so in which time the planner ranks them by.

>>> d = Decode(serving={"weight_dtype": "fp8"})
>>> d.runs_backward, d.serves_fp8, d.new_tokens(prompt_len=100), d.describe(global_batch=8, seq_len=4096)
(False, True, 1, 'decode: batch 8, context 4096, weights fp8')
>>> Prefill().new_tokens(prompt_len=100), Prefill().step_time_s(time_per_output_token_s=0.01, time_to_first_token_s=0.2)
(100, 0.2)
"""

from __future__ import annotations

from typing import ClassVar, Literal, TypeVar

from pydantic import Field

from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.workload import FrozenDtype, InferenceConfig
from costmodel.workloads.base import WorkloadBase
from costmodel.workloads.flops import attention_forward_flops_per_token, matmul_params

T = TypeVar("T")


class ServingWorkload(WorkloadBase):
    """What prefill and decode share: weights only, the serving settings (`InferenceConfig`)."""

    serving: InferenceConfig = Field(default_factory=InferenceConfig, description="Prompt length, KV-cache blocks and storage, "
                                                                                 "weight storage, latency bound.")

    trains_base_weights: ClassVar[bool] = False
    runs_backward: ClassVar[bool] = False

    def describe(self, *, global_batch: int, seq_len: int) -> str:
        prompt_len = self.prompt_len(seq_len)
        prompt = f", prompt {prompt_len}" if prompt_len != seq_len else ""
        return f"{self.kind}: batch {global_batch}, context {seq_len}{prompt}, weights {self.serving.weight_dtype.value}"

    @property
    def frozen_dtype(self) -> FrozenDtype:
        return self.serving.weight_dtype

    @property
    def serves_fp8(self) -> bool:
        return self.serving.weight_dtype is FrozenDtype.FP8

    def trainable_params(self, model: ModelConfig) -> float:
        """Nothing trains."""
        return 0.0

    def prompt_len(self, seq_len: int) -> int:
        return self.serving.prompt_len or seq_len

    def check_context(self, seq_len: int) -> None:
        if (self.serving.prompt_len or 0) > seq_len:
            raise ValueError(f"prompt_len={self.serving.prompt_len} exceeds the context length {seq_len}")

    def model_flops(self, model: ModelConfig, *, tokens: int, seq_len: int) -> float:
        """Forward only (`costmodel.workloads.flops`): ``2·N`` a token, plus attention against its context: the prompt's
        causal half for a prefill token, the whole ``seq_len``-token cache for a decoded one."""
        causal = self.of_step(decode=False, prefill=True)
        context = self.of_step(decode=seq_len, prefill=self.prompt_len(seq_len))
        return tokens * (2 * matmul_params(model) + attention_forward_flops_per_token(model, context, causal=causal))

    def new_tokens(self, *, prompt_len: int) -> int:
        """Tokens one step adds to each sequence it runs: one a decode step, the prompt a prefill."""
        return self.of_step(decode=1, prefill=prompt_len)

    def step_sequences(self, *, micro_batch: int, replica_batch: int) -> int:
        """Sequences one step of one replica runs at once: a micro-batch a decode step, the replica's batch a prefill."""
        return self.of_step(decode=micro_batch, prefill=replica_batch)

    def step_time_s(self, *, time_per_output_token_s: float, time_to_first_token_s: float) -> float:
        """The time a step of this workload takes, and the planner ranks layouts by."""
        return self.of_step(decode=time_per_output_token_s, prefill=time_to_first_token_s)

    def of_step(self, *, decode: T, prefill: T) -> T:
        """Of a value known for both serving phases (a decode step's and a prefill's), the one of this workload's step."""
        raise NotImplementedError


class Prefill(ServingWorkload):
    """Prefill: one forward over every sequence's whole prompt (time to first token)."""

    kind: Literal["prefill"] = Field("prefill", description="The workload's name (--workload).")

    step_time_label: ClassVar[str] = "time to first token"

    def of_step(self, *, decode: T, prefill: T) -> T:
        return prefill


class Decode(ServingWorkload):
    """Decode: one new token per sequence per step, each micro-batch against its KV cache (time per output token)."""

    kind: Literal["decode"] = Field("decode", description="The workload's name (--workload).")

    step_time_label: ClassVar[str] = "per output token"
    latency_bounded: ClassVar[bool] = True
    splits_model_dimension: ClassVar[bool] = True

    def of_step(self, *, decode: T, prefill: T) -> T:
        return decode

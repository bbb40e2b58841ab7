"""`WorkloadBase`: what every workload type answers, so the cost model asks it instead of testing which one it holds.

A workload says what one step does with the model's weights: which of them train (and so carry a
gradient, optimizer state and a master copy), how those it holds without training are stored,
which low-rank adapters it adds, whether it runs a backward pass, and what the step's model FLOPs
are. The defaults describe full training (every weight trains, no adapters, nothing frozen);
`costmodel.workloads.lora` and `costmodel.workloads.serving` override what differs.

>>> from costmodel.inputs.model_config import ModelConfig
>>> m = ModelConfig(name="m", hidden_size=64, num_layers=2, num_heads=4, ffn_size=256, vocab_size=8)
>>> w = WorkloadBase(kind="pretrain")
>>> w.trains_base_weights, w.runs_backward, w.adapters(m), w.trainable_params(m) == m.total_params
(True, True, [], True)
"""

from __future__ import annotations

from typing import ClassVar

from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.workload import AdaptedMatrix, FrozenDtype
from costmodel.record import Record
from costmodel.workloads.flops import training_flops_per_token


class WorkloadBase(Record):
    """One step's workload; subclasses fix ``kind`` (the ``--workload`` name) and override what differs from full training."""

    kind: str

    trains_base_weights: ClassVar[bool] = True
    """Whether the model's own weights train (gradient, optimizer state, master copy); False: they are held frozen."""
    runs_backward: ClassVar[bool] = True
    """Whether the step runs a backward pass and an optimizer update (False: a serving forward)."""
    pipeline_lowered: ClassVar[bool] = True
    """Whether `validate` lowers the workload's step with pipeline stages (the planner keeps to lowered layouts)."""

    takes_adapter_settings: ClassVar[bool] = False
    """Whether the workload takes LoRA's settings (rank, targets, frozen storage)."""
    latency_bounded: ClassVar[bool] = False
    """Whether a bound on the time per output token applies to its steps."""
    splits_model_dimension: ClassVar[bool] = False
    """Whether its step runs a 2D weight-stationary tensor split (`costmodel.inputs.layout.Layout.tp_embed`): decode only."""
    named_in_titles: ClassVar[bool] = True
    """Whether a title names the workload (pretraining, the default, goes unnamed)."""
    step_time_label: ClassVar[str] = "step time"
    """What the time the planner ranks layouts by is called in a summary."""

    def describe(self, *, global_batch: int, seq_len: int) -> str:
        """The workload and its settings in a few words, as the plan summary prints them."""
        return self.kind

    @property
    def frozen_dtype(self) -> FrozenDtype | None:
        """Storage of the weight matrices the step holds without training them; None where every weight trains."""
        return None

    @property
    def serves_fp8(self) -> bool:
        """Whether the linear GEMMs read fp8-stored weights as a serving step (W8A8)."""
        return False

    @property
    def adapter_rank(self) -> int:
        """Inner width of the low-rank adapters (0: none)."""
        return 0

    @property
    def adapter_dropout(self) -> float:
        """Dropout probability on each adapter's input (0: none, or no adapters)."""
        return 0.0

    @property
    def adapter_scale(self) -> float:
        """The factor on each adapter's output (LoRA's alpha / rank; 1 without adapters)."""
        return 1.0

    def adapters(self, model: ModelConfig) -> list[AdaptedMatrix]:
        """The matrices of one layer that carry a trained low-rank adapter (none by default)."""
        return []

    def adapter_params_per_layer(self, model: ModelConfig, *, tp: int = 1) -> float:
        """Adapter parameters of one layer on one device (0 without adapters)."""
        return 0.0

    def trainable_params(self, model: ModelConfig) -> float:
        """Parameters the step updates: all of the model's, by default."""
        return model.total_params

    def prompt_len(self, seq_len: int) -> int:
        """Prompt tokens per sequence: the whole context outside serving."""
        return seq_len

    def check_context(self, seq_len: int) -> None:
        """Raise ``ValueError`` if the settings do not fit a context of ``seq_len`` tokens (nothing to check by default)."""

    def model_flops(self, model: ModelConfig, *, tokens: int, seq_len: int) -> float:
        """Model FLOPs of a step over ``tokens`` tokens of ``seq_len``-token sequences, by MFU's convention
        (`costmodel.workloads.flops`): a training step's ``6·N + 6·L·H·Q·s`` a token."""
        return tokens * training_flops_per_token(model, seq_len)

"""Pretraining and full fine-tuning: every weight trains, with a gradient, AdamW state and a master copy.

Both run the same step, so both take `WorkloadBase`'s defaults; they differ only in name.

>>> Pretrain().kind, FullFinetune().describe(global_batch=8, seq_len=2048)
('pretrain', 'finetune-full')
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from costmodel.workloads.base import WorkloadBase


class Pretrain(WorkloadBase):
    """Pretraining: every weight trains."""

    kind: Literal["pretrain"] = Field("pretrain", description="The workload's name (--workload).")

    named_in_titles: ClassVar[bool] = False


class FullFinetune(WorkloadBase):
    """Full fine-tuning: the same step as pretraining, from a trained checkpoint."""

    kind: Literal["finetune-full"] = Field("finetune-full", description="The workload's name (--workload).")
